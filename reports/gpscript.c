/* Text inside gnuplot scripts. A result database is untrusted input, and gnuplot runs `cmd`
 * inside double-quoted strings, expands @macros and runs system() and !cmd: so every string a
 * script holds goes through ferry__gp_str (a single-quoted string, where gnuplot expands
 * nothing) or, in an inline datablock, ferry__gp_data (data, never read as a command), and
 * ferry__gp_check refuses a script with any other way in before gnuplot ever sees it. */
#include <stdio.h>
#include <string.h>

#include "reports/report_internal.h"

void ferry__gp_str(struct ferry_strbuf *b, const char *s) {
  ferry__sb_puts(b, "'");
  for (; s && *s; s++) {
    if (*s == '\'') ferry__sb_puts(b, "''"); /* the only escape a single-quoted string has */
    else if ((unsigned char)*s < 0x20 || *s == 0x7f) ferry__sb_puts(b, " "); /* a newline would end the command */
    else ferry__sb_put(b, s, 1);
  }
  ferry__sb_puts(b, "'");
}

void ferry__gp_tic(struct ferry_strbuf *b, const char *s) {
  /* gnuplot formats an explicit tic label with the tic's value: % must be %% */
  struct ferry_strbuf t = {0};
  for (; s && *s; s++) ferry__sb_put(&t, *s == '%' ? "%%" : s, *s == '%' ? 2 : 1);
  if (t.oom) b->oom = 1;
  ferry__gp_str(b, t.p ? t.p : "");
  ferry__sb_free(&t);
}

void ferry__gp_strf(struct ferry_strbuf *b, const char *fmt, ...) {
  struct ferry_strbuf t = {0};
  va_list ap;
  va_start(ap, fmt);
  ferry__sb_vprintf(&t, fmt, ap);
  va_end(ap);
  if (t.oom) b->oom = 1;
  ferry__gp_str(b, t.p ? t.p : "");
  ferry__sb_free(&t);
}

void ferry__gp_set(struct ferry_strbuf *b, const char *what, const char *fmt, ...) {
  struct ferry_strbuf t = {0};
  va_list ap;
  va_start(ap, fmt);
  ferry__sb_vprintf(&t, fmt, ap);
  va_end(ap);
  if (t.oom) b->oom = 1;
  ferry__sb_printf(b, "set %s ", what);
  ferry__gp_str(b, t.p ? t.p : "");
  ferry__sb_puts(b, "\n");
  ferry__sb_free(&t);
}

void ferry__gp_data(struct ferry_strbuf *b, const char *s) {
  /* a data field has no escapes: a double quote would end it, a newline the row (or, as a
   * line "EOD", the datablock) */
  ferry__sb_puts(b, "\"");
  for (; s && *s; s++) ferry__sb_put(b, (*s == '"' || (unsigned char)*s < 0x20 || *s == 0x7f) ? "'" : s, 1);
  ferry__sb_puts(b, "\"");
}

void ferry__gp_comment(struct ferry_strbuf *b, const char *s) {
  ferry__sb_puts(b, "# ");
  for (; s && *s; s++) ferry__sb_put(b, ((unsigned char)*s < 0x20 || *s == 0x7f) ? " " : s, 1);
  ferry__sb_puts(b, "\n");
}

/* Outside single-quoted strings, datablocks and comments a script holds only what the report's
 * own code writes: no double-quoted strings (gnuplot runs backquotes in them), no backquotes,
 * no macros, no shell escapes, no control characters but the newline. */
int ferry__gp_check(const char *script, char *why, size_t why_len) {
  const char *p = script;
  int line_no = 0;
  char block_end[64] = "";
  while (*p) {
    line_no++;
    const char *nl = strchr(p, '\n');
    size_t n = nl ? (size_t)(nl - p) : strlen(p);
    if (block_end[0]) {
      /* datablock rows are data; only the terminator matters */
      if (n == strlen(block_end) && !strncmp(p, block_end, n)) block_end[0] = '\0';
      for (size_t i = 0; i < n; i++)
        if ((unsigned char)p[i] < 0x20 && p[i] != '\t')
          return snprintf(why, why_len, "line %d: control character in a datablock row", line_no), 0;
      p += n + (nl != NULL);
      continue;
    }
    size_t lead = strspn(p, " \t");
    if (lead < n && p[lead] == '#') {
      for (size_t i = 0; i < n; i++)
        if ((unsigned char)p[i] < 0x20 && p[i] != '\t')
          return snprintf(why, why_len, "line %d: control character in a comment", line_no), 0;
      p += n + (nl != NULL);
      continue;
    }
    if (lead < n && p[lead] == '!') return snprintf(why, why_len, "line %d: shell escape", line_no), 0;
    int quoted = 0;
    for (size_t i = 0; i < n; i++) {
      char c = p[i];
      if ((unsigned char)c < 0x20 && c != '\t') return snprintf(why, why_len, "line %d: control character", line_no), 0;
      if (quoted) {
        if (c == '\'') {
          if (i + 1 < n && p[i + 1] == '\'') i++;
          else quoted = 0;
        }
        continue;
      }
      if (c == '\'') quoted = 1;
      else if (c == '"' || c == '`' || c == '@')
        return snprintf(why, why_len, "line %d: '%c' outside a single-quoted string", line_no, c), 0;
      else if (c == '#') break; /* a trailing comment */
    }
    if (quoted) return snprintf(why, why_len, "line %d: unterminated string", line_no), 0;
    /* "$name << EOD" opens a datablock that ends at a line "EOD" */
    const char *here = memmem(p, n, "<<", 2);
    if (here && p[lead] == '$') {
      const char *t = here + 2;
      while (t < p + n && *t == ' ') t++;
      size_t tl = (size_t)(p + n - t);
      if (tl == 0 || tl >= sizeof block_end) return snprintf(why, why_len, "line %d: bad datablock", line_no), 0;
      memcpy(block_end, t, tl);
      block_end[tl] = '\0';
    }
    p += n + (nl != NULL);
  }
  if (block_end[0]) return snprintf(why, why_len, "datablock never ends"), 0;
  return 1;
}

void ferry__safe_name(const char *name, char *out, size_t len) {
  /* file names, HTML ids and Markdown links: letters, digits, '_', '-', '.' (not first) */
  size_t n = 0;
  int changed = 0;
  const size_t keep = len > 24 ? len - 10 : 1; /* room for "-" and 8 hex digits */
  for (const char *s = name; *s; s++) {
    char c = *s;
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
             (c == '.' && n > 0);
    if (n + 1 >= keep) {
      changed = 1;
      break;
    }
    out[n++] = ok ? c : '_';
    changed |= !ok;
  }
  if (n == 0) {
    out[n++] = '_';
    changed = 1;
  }
  out[n] = '\0';
  if (changed && len > 24) {
    /* different names must stay different files: FNV-1a of the original */
    uint32_t h = 2166136261u;
    for (const unsigned char *s = (const unsigned char *)name; *s; s++) h = (h ^ *s) * 16777619u;
    snprintf(out + n, len - n, "-%08x", (unsigned)h);
  }
}
