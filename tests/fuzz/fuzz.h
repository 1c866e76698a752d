/* Shared pieces of ferry's fuzz targets (tests/fuzz/README.md): the libFuzzer entry point every
 * target defines, a private folder for the files a reader is given, and the invariant check
 * that turns an accepted-but-wrong input into a crash libFuzzer (or the replay driver) reports. */
#ifndef FERRY_TESTS_FUZZ_H
#define FERRY_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

/* One input: called by libFuzzer, or by fuzz_driver.c for every file of a corpus. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* This process's scratch folder (created on first use, removed at exit). Borrowed. */
const char *fuzz_dir(void);

/* Write data to fuzz_dir()/name, replacing it. Returns the path (a static buffer, valid until
 * the next call) or NULL when the file cannot be written. */
const char *fuzz_write(const char *name, const uint8_t *data, size_t size);

/* data as a NUL-terminated string (malloc; free()). Inputs with a NUL byte inside are cut there,
 * as a command-line argument would be. NULL when out of memory. */
char *fuzz_cstr(const uint8_t *data, size_t size);

/* Whether a synthetic-trace spec asks for at most max_n requests (n= absent counts as the
 * default 100). Up to FERRY_TRACE_MAX_SYNTHETIC (1e8) requests is a valid spec that takes
 * seconds and gigabytes to generate; targets skip those so each input stays fast. */
int fuzz_synthetic_small(const char *spec, int64_t max_n);

/* An accepted input broke an invariant of its reader: print it and abort, so libFuzzer keeps
 * the input and the replay test fails. */
void fuzz_fail(const char *file, int line, const char *what) __attribute__((noreturn));
#define FUZZ_CHECK(cond) ((cond) ? (void)0 : fuzz_fail(__FILE__, __LINE__, #cond))

#endif
