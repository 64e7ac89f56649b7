/* Compiled once per public header (ENGRAM_HEADER), as C11 with nothing included before it:
 * each header stands alone. */
#include ENGRAM_HEADER

int engram_header_alone(void) { return 0; }
