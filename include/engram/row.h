/* engram/row.h: the format of one gathered Engram row and the table layouts.
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

#endif /* ENGRAM_ROW_H_ */
