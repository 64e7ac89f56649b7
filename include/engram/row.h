/* engram/row.h: the format of one gathered Engram row, the table layouts and tiers.
 *
 * The one definition of these facts: engram.h, protocol.h and gpu.h include it, the daemon's
 * table code and the GPU kernels take their constants from it, and Python reads them through
 * engram_row_bytes() (engram.h) rather than repeating them.
 *
 * A DeepSeek-V4.1 Engram row is 256 FP8 E4M3 values followed by 8 E8M0 scales, one per block
 * of 32 values: value[i] = e4m3(row[i]) * 2^(row[256 + i / 32] - 127).
 */
#ifndef ENGRAM_ROW_H_
#define ENGRAM_ROW_H_

#define ENGRAM_ROW_VALUES 256u     /* FP8 E4M3 values, one byte each */
#define ENGRAM_ROW_SCALE_BLOCK 32u /* values per E8M0 scale */
#define ENGRAM_ROW_SCALES (ENGRAM_ROW_VALUES / ENGRAM_ROW_SCALE_BLOCK) /* 8 scale bytes */
/* Bytes per row as stored in packed tables and as gathered: 264. */
#define ENGRAM_ROW_BYTES (ENGRAM_ROW_VALUES + ENGRAM_ROW_SCALES)

/* How a table is stored (docs/table_format.md): struct engram_table_info.layout and the wire's
 * struct engram_wire_table.layout. */
enum engram_table_layout {
  ENGRAM_LAYOUT_CHECKPOINT = 0, /* safetensors shards: values and scales in two tensors */
  ENGRAM_LAYOUT_PACKED = 1,     /* one file of 264-byte rows after a header */
};

/* Where a daemon serves a table's rows from (docs/row-store.md, "Tiers"): struct
 * engram_table_info.tier and the wire's struct engram_wire_table.tier. The names are the ones
 * engramd's configuration and engramctl use. */
enum engram_table_tier {
  ENGRAM_TABLE_TIER_UNKNOWN = 0,  /* a daemon from before the field */
  ENGRAM_TABLE_TIER_STORAGE = 1,  /* "storage": the files, on every gather */
  ENGRAM_TABLE_TIER_RESIDENT = 2, /* "resident": the whole table in the daemon's memory */
  ENGRAM_TABLE_TIER_CACHE = 3,    /* "cache": the files, hot rows in the shared row cache */
};

#endif /* ENGRAM_ROW_H_ */
