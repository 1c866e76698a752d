/* Names near a misspelt one, for "did you mean" messages: unknown options, sweep keys,
 * hardware profiles, model presets and registry entries all suggest through these. */
#ifndef FERRY_COMMON_NAMES_H
#define FERRY_COMMON_NAMES_H

#include <stddef.h>

/* Levenshtein distance between a and b (ASCII case folded when fold_case). */
size_t ferry__edit_distance(const char *a, const char *b, int fold_case);

/* Up to `max` of the n names nearest `word`, best first, into out (borrowed pointers into
 * names): those it is a prefix of (an abbreviation) and those within max(2, len/3) edits.
 * Returns how many were written (0: nothing close). */
size_t ferry__nearest_names(const char *word, const char *const *names, size_t n, int fold_case, const char **out,
                            size_t max);

/* "a, b or c" (with `prefix` before each name, e.g. "--") into buf; returns buf. */
char *ferry__join_names(const char *const *names, size_t n, const char *prefix, char *buf, size_t len);

#endif
