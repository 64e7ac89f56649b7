/* engram/abi.h: what every engram header shares: the export macro, the mark on a deprecated
 * name, the compile-time size check of each struct that crosses the ABI, and the bound on a
 * struct's size field (engram/engram.h, conventions 2-5 and 8-9).
 *
 *   struct engram_x { size_t size; uint32_t layer; uint32_t flags; };
 *   ENGRAM_ASSERT_SIZE(struct engram_x, 16);
 */
#ifndef ENGRAM_ABI_H_
#define ENGRAM_ABI_H_

#ifndef ENGRAM_API
#if defined(__GNUC__)
#define ENGRAM_API __attribute__((visibility("default")))
#else
#define ENGRAM_API
#endif
#endif

/* Marks an older name (a function or a struct field) that stays exported for programs built
 * against it: a new use makes GCC and Clang (and nvcc) warn with -Wdeprecated-declarations,
 * `msg` naming the current name. Define ENGRAM_DEPRECATED(msg) empty before the first include
 * to silence every such warning at once. */
#ifndef ENGRAM_DEPRECATED
#if defined(__GNUC__) || defined(__clang__)
#define ENGRAM_DEPRECATED(msg) __attribute__((deprecated(msg)))
#else
#define ENGRAM_DEPRECATED(msg)
#endif
#endif

#ifndef ENGRAM_STATIC_ASSERT
#ifdef __cplusplus
#define ENGRAM_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define ENGRAM_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif
#endif

/* Pins the size of a struct of the ABI on 64-bit targets (the ones engram supports), where its
 * layout is part of the ABI: growing a struct means changing the number here on purpose. */
#define ENGRAM_ASSERT_SIZE(type, lp64_bytes)                               \
  ENGRAM_STATIC_ASSERT(sizeof(void*) != 8 || sizeof(type) == (lp64_bytes), \
                       #type " changed size: update its ENGRAM_ASSERT_SIZE and the ABI tests")

/* The largest size field any call accepts: no struct of the ABI is, or will grow to be, larger.
 * A size above it (an uninitialised field, a count passed as a size) is refused with -EINVAL
 * before any byte past the field is touched. */
#define ENGRAM_MAX_STRUCT_BYTES 4096u

#endif /* ENGRAM_ABI_H_ */
