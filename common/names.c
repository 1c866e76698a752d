/* Edit distance and nearest names: one rule for every "did you mean" in ferry, so a typo in an
 * option, a sweep key, a profile or a model name is answered the same way. */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/names.h"

static int fold(int c, int fold_case) { return fold_case ? tolower((unsigned char)c) : (unsigned char)c; }

size_t ferry__edit_distance(const char *a, const char *b, int fold_case) {
  const size_t la = strlen(a), lb = strlen(b);
  /* one row of the dynamic programme; names are short, so a fixed row covers them, and a
   * longer word is simply "far" */
  size_t row[128];
  if (lb + 1 > sizeof row / sizeof row[0]) return la > lb ? la : lb;
  for (size_t j = 0; j <= lb; j++) row[j] = j;
  for (size_t i = 1; i <= la; i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= lb; j++) {
      const size_t up = row[j];
      const size_t cost = fold(a[i - 1], fold_case) != fold(b[j - 1], fold_case);
      size_t best = diag + cost;
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[lb];
}

static int is_prefix(const char *word, const char *name, int fold_case) {
  for (; *word; word++, name++)
    if (!*name || fold(*word, fold_case) != fold(*name, fold_case)) return 0;
  return 1;
}

static size_t closeness(const char *word, const char *name, int fold_case) {
  /* an abbreviation ranks as one edit: "--prefetch" names --prefetch-depth first */
  return *word && is_prefix(word, name, fold_case) ? 1 : ferry__edit_distance(word, name, fold_case);
}

size_t ferry__nearest_names(const char *word, const char *const *names, size_t n, int fold_case, const char **out,
                            size_t max) {
  if (!word) return 0;
  const size_t len = strlen(word), limit = len / 3 > 2 ? len / 3 : 2;
  /* each pass takes the next (distance, index) after the previous one: best first, ties in
   * the order the names were given, without sorting or allocating */
  size_t got = 0, prev_d = 0, prev_i = 0;
  while (got < max) {
    size_t best_d = SIZE_MAX, best_i = 0;
    for (size_t i = 0; i < n; i++) {
      if (!names[i]) continue;
      const size_t d = closeness(word, names[i], fold_case);
      if (d > limit || (got && (d < prev_d || (d == prev_d && i <= prev_i)))) continue;
      if (d < best_d) {
        best_d = d;
        best_i = i;
      }
    }
    if (best_d == SIZE_MAX) break;
    out[got++] = names[best_i];
    prev_d = best_d;
    prev_i = best_i;
  }
  return got;
}

char *ferry__join_names(const char *const *names, size_t n, const char *prefix, char *buf, size_t len) {
  size_t used = 0;
  if (len) buf[0] = '\0';
  for (size_t i = 0; i < n && used < len; i++) {
    const char *sep = i == 0 ? "" : i + 1 == n ? " or " : ", ";
    int k = snprintf(buf + used, len - used, "%s%s%s", sep, prefix ? prefix : "", names[i]);
    if (k < 0) break;
    used += (size_t)k;
  }
  return buf;
}
