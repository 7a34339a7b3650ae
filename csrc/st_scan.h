/*
 * SIMD structural scanner for the tokenizer's hottest loops (issue #44).
 *
 * Paths: ST_SCAN_OFF is the tokenizer's own code (SSE2, the x86-64
 * baseline, 16 bytes at a time; byte loops elsewhere); ST_SCAN_AVX2 and
 * ST_SCAN_AVX512 (AVX-512BW) look at 32/64 bytes at a time.  The SIMD
 * functions are compiled with __attribute__((target(...))), so the build
 * needs no -mavx2 and the library runs on any x86-64; a path is used only
 * when the CPU has it (__builtin_cpu_supports).  Other architectures have
 * ST_SCAN_OFF only.
 *
 * The path is one process-wide setting (like the CPU it depends on), chosen
 * once: st_scan_set() with ST_SCAN_AUTO picks the best the CPU has.  Every
 * path gives the same results byte for byte; no function reads outside
 * [p, end) (full-width loads only where that many bytes remain; the tail is
 * done bytewise).
 */
#ifndef ST_SCAN_H
#define ST_SCAN_H

#include <stddef.h>
#include <stdint.h>

/* CDEF BEGIN */
#define ST_SCAN_AUTO -1
#define ST_SCAN_OFF 0
#define ST_SCAN_AVX2 1
#define ST_SCAN_AVX512 2

int st_scan_supported(int path);  /* 1 when this CPU (and build) can run the path */
int st_scan_best(void);           /* the fastest supported path */
int st_scan_set(int path);        /* 0, or -1 (path unchanged) when not supported */
int st_scan_get(void);            /* the path in use */

/* First '"' or '\\' in [p, end), or end, on the path in use. */
const char *st_scan_quote_or_backslash(const char *p, const char *end);

/* For the 64 bytes at p (end - p >= 64 is the caller's duty): bit i of
 * *backslashes, *quotes and *brackets is set where byte i is '\\', '"', or
 * one of "{}[]".  On the path in use (OFF: a byte loop). */
void st_scan_masks64(const char *p, uint64_t *backslashes, uint64_t *quotes, uint64_t *brackets);
/* CDEF END */

/* The path in use (read in the tokenizer's loops; written by st_scan_set). */
#if defined(__GNUC__)
__attribute__((visibility("hidden")))
#endif
extern int st_scan_path;

#endif
