/* One JSON document per result, written as JSON, CSV (RFC 4180) or a Markdown table, so every
 * command that prints results offers the same three machine-readable forms from one source. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/output.h"
#include "common/alloc.h"
#include "common/strbuf.h"

int cli_parse_format(const char *cmd, const char *text, enum cli_format *out) {
  static const char *const names[] = {"text", "json", "csv", "md"};
  for (int i = 0; i < 4; i++)
    if (text && !strcmp(text, names[i])) {
      *out = (enum cli_format)i;
      return 0;
    }
  return cli_usage_error(cmd, "--format: expected text, json, csv or md, got '%s'", text ? text : "");
}

void cli_json_str(cJSON *obj, const char *key, const char *value) {
  if (value)
    cJSON_AddStringToObject(obj, key, value);
  else
    cJSON_AddNullToObject(obj, key);
}

void cli_json_num(cJSON *obj, const char *key, double value) {
  if (isfinite(value))
    cJSON_AddNumberToObject(obj, key, value);
  else
    cJSON_AddNullToObject(obj, key);
}

/* One flattened scalar: its dotted key and its text. */
struct cell {
  char *key, *text;
  int numeric;
};

struct cells {
  struct cell *v;
  size_t n, cap;
  int oom;
};

/* Markdown is read by people: six significant digits; CSV and JSON keep every digit. */
static int md_numbers;

static void number_text(double v, char *buf, size_t len) {
  if (!isfinite(v)) {
    buf[0] = '\0';
  } else if (v == floor(v) && fabs(v) < 9007199254740992.0) {
    snprintf(buf, len, "%.0f", v);
  } else if (md_numbers) {
    snprintf(buf, len, "%.6g", v);
  } else {
    snprintf(buf, len, "%.15g", v); /* shortest form that reads back as the same double */
    if (strtod(buf, NULL) != v) snprintf(buf, len, "%.17g", v);
  }
}

static void push(struct cells *c, const char *key, const char *text, int numeric) {
  if (c->oom) return;
  if (c->n == c->cap) {
    size_t cap = c->cap ? c->cap * 2 : 32;
    struct cell *p = ferry__reallocarray(c->v, cap, sizeof *p);
    if (!p) {
      c->oom = 1;
      return;
    }
    c->v = p;
    c->cap = cap;
  }
  struct cell *e = &c->v[c->n];
  e->key = ferry__strdup(key);
  e->text = ferry__strdup(text);
  e->numeric = numeric;
  if (!e->key || !e->text) {
    ferry_free(e->key);
    ferry_free(e->text);
    c->oom = 1;
    return;
  }
  c->n++;
}

static void flatten(struct cells *c, const char *prefix, const cJSON *item) {
  char key[512], num[64];
  if (cJSON_IsObject(item) || cJSON_IsArray(item)) {
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, item) {
      if (cJSON_IsObject(item))
        snprintf(key, sizeof key, "%s%s%s", prefix, *prefix ? "." : "", e->string ? e->string : "");
      else
        snprintf(key, sizeof key, "%s%s%d", prefix, *prefix ? "." : "", i);
      flatten(c, key, e);
      i++;
    }
    return;
  }
  if (cJSON_IsNumber(item)) {
    number_text(item->valuedouble, num, sizeof num);
    push(c, prefix, num, 1);
  } else if (cJSON_IsString(item)) {
    push(c, prefix, item->valuestring ? item->valuestring : "", 0);
  } else if (cJSON_IsBool(item)) {
    push(c, prefix, cJSON_IsTrue(item) ? "true" : "false", 0);
  } else {
    push(c, prefix, "", 0); /* null */
  }
}

static void cells_free(struct cells *c) {
  for (size_t i = 0; i < c->n; i++) {
    ferry_free(c->v[i].key);
    ferry_free(c->v[i].text);
  }
  ferry_free(c->v);
  memset(c, 0, sizeof *c);
}

/* Text from the database goes to terminals and spreadsheets: no control characters. */
static void put_scrubbed(struct ferry_strbuf *b, unsigned char ch) {
  char s[2] = {(char)(ch < 0x20 || ch == 0x7f ? '?' : ch), 0};
  ferry__sb_puts(b, s);
}

static void put_csv(struct ferry_strbuf *b, const char *s) {
  int quote = strpbrk(s, ",\"\r\n") != NULL || (*s && (s[0] == ' ' || s[strlen(s) - 1] == ' '));
  /* a cell starting with = + - @ is a formula to a spreadsheet: quoted and prefixed with ' */
  char *end;
  strtod(s, &end);
  int formula = (*s == '=' || *s == '+' || *s == '-' || *s == '@') && (end == s || *end);
  if (formula) quote = 1;
  if (quote) ferry__sb_puts(b, "\"");
  if (formula) ferry__sb_puts(b, "'");
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"') ferry__sb_puts(b, "\"\"");
    else put_scrubbed(b, *p);
  }
  if (quote) ferry__sb_puts(b, "\"");
}

/* Markdown table cell: no table, emphasis, code, link or HTML syntax survives. */
static void put_md(struct ferry_strbuf *b, const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    switch (*p) {
      case '<': ferry__sb_puts(b, "&lt;"); break;
      case '>': ferry__sb_puts(b, "&gt;"); break;
      case '&': ferry__sb_puts(b, "&amp;"); break;
      case '|': case '\\': case '`': case '*': case '_': case '[': case ']': case '#': case '~':
        ferry__sb_printf(b, "\\%c", *p);
        break;
      default: put_scrubbed(b, *p);
    }
  }
}

/* Columns in first-seen order over all rows. */
static int find_col(char **cols, size_t n, const char *key) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(cols[i], key)) return (int)i;
  return -1;
}

static void write_table(struct ferry_strbuf *b, struct cells *rows, size_t nrows, enum cli_format fmt) {
  char **cols = NULL;
  int *numeric = NULL;
  size_t ncols = 0, cap = 0;
  for (size_t r = 0; r < nrows; r++)
    for (size_t i = 0; i < rows[r].n; i++) {
      int k = find_col(cols, ncols, rows[r].v[i].key);
      if (k < 0) {
        if (ncols == cap) {
          cap = cap ? cap * 2 : 16;
          char **nc = ferry__reallocarray(cols, cap, sizeof *nc);
          int *nn = ferry__reallocarray(numeric, cap, sizeof *nn);
          if (nc) cols = nc;
          if (nn) numeric = nn;
          if (!nc || !nn) {
            b->oom = 1;
            goto out;
          }
        }
        cols[ncols] = rows[r].v[i].key;
        numeric[ncols] = -1; /* unknown until a non-empty cell */
        k = (int)ncols++;
      }
      if (rows[r].v[i].text[0] && numeric[k] != 0) numeric[k] = rows[r].v[i].numeric;
    }
  for (size_t c = 0; c < ncols; c++) {
    if (fmt == CLI_FORMAT_CSV) {
      if (c) ferry__sb_puts(b, ",");
      put_csv(b, cols[c]);
    } else {
      ferry__sb_puts(b, "| ");
      put_md(b, cols[c]);
      ferry__sb_puts(b, " ");
    }
  }
  ferry__sb_puts(b, fmt == CLI_FORMAT_CSV ? "\n" : "|\n");
  if (fmt == CLI_FORMAT_MD) {
    for (size_t c = 0; c < ncols; c++) ferry__sb_puts(b, numeric[c] == 1 ? "|---:" : "|---");
    ferry__sb_puts(b, "|\n");
  }
  for (size_t r = 0; r < nrows; r++) {
    for (size_t c = 0; c < ncols; c++) {
      const char *text = "";
      for (size_t i = 0; i < rows[r].n; i++)
        if (!strcmp(rows[r].v[i].key, cols[c])) text = rows[r].v[i].text;
      if (fmt == CLI_FORMAT_CSV) {
        if (c) ferry__sb_puts(b, ",");
        put_csv(b, text);
      } else {
        ferry__sb_puts(b, "| ");
        put_md(b, text);
        ferry__sb_puts(b, " ");
      }
    }
    ferry__sb_puts(b, fmt == CLI_FORMAT_CSV ? "\n" : "|\n");
  }
out:
  ferry_free(cols);
  ferry_free(numeric);
}

int cli_emit(FILE *f, const cJSON *doc, const char *rows, enum cli_format fmt) {
  if (fmt == CLI_FORMAT_JSON) {
    char *text = cJSON_Print(doc);
    if (!text) return cli_fail(FERRY_ERR_NOMEM, "out of memory writing JSON");
    /* cJSON indents with tabs; strings never hold a raw tab (it is escaped), so every tab is
     * layout: two spaces of indent, one after a colon */
    int bad = 0;
    for (const char *p = text; *p && !bad; p++) {
      if (*p == '\t') bad = fputs(p > text && p[-1] == ':' ? " " : "  ", f) < 0;
      else if (*p == 0x7f) bad = fputs("\\u007f", f) < 0; /* only inside strings; raw, a terminal acts on it */
      else bad = fputc(*p, f) == EOF;
    }
    bad |= fputc('\n', f) == EOF;
    cJSON_free(text);
    return bad || fflush(f) ? cli_fail(FERRY_ERR_IO, "write failed") : CLI_OK;
  }
  struct ferry_strbuf b = {0};
  int oom = 0;
  md_numbers = fmt == CLI_FORMAT_MD;
  if (rows) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(doc, rows), *e;
    size_t n = (size_t)cJSON_GetArraySize(arr), i = 0;
    struct cells *cs = ferry__calloc(n ? n : 1, sizeof *cs);
    if (!cs) return cli_fail(FERRY_ERR_NOMEM, "out of memory");
    cJSON_ArrayForEach(e, arr) {
      if (i < n) flatten(&cs[i++], "", e);
    }
    for (i = 0; i < n; i++) oom |= cs[i].oom;
    if (!oom) write_table(&b, cs, n, fmt);
    for (i = 0; i < n; i++) cells_free(&cs[i]);
    ferry_free(cs);
  } else {
    struct cells kv = {0};
    flatten(&kv, "", doc);
    oom = kv.oom;
    /* two columns: one row per flattened key */
    struct cells *rowv = ferry__calloc(kv.n ? kv.n : 1, sizeof *rowv);
    if (!rowv) oom = 1;
    for (size_t i = 0; !oom && i < kv.n; i++) {
      push(&rowv[i], "key", kv.v[i].key, 0);
      push(&rowv[i], "value", kv.v[i].text, kv.v[i].numeric);
      oom |= rowv[i].oom;
    }
    if (!oom) write_table(&b, rowv, kv.n, fmt);
    for (size_t i = 0; rowv && i < kv.n; i++) cells_free(&rowv[i]);
    ferry_free(rowv);
    cells_free(&kv);
  }
  if (oom || b.oom) {
    ferry_free(b.p);
    return cli_fail(FERRY_ERR_NOMEM, "out of memory writing the table");
  }
  int bad = b.len && fwrite(b.p, 1, b.len, f) != b.len;
  ferry_free(b.p);
  return bad || fflush(f) ? cli_fail(FERRY_ERR_IO, "write failed") : CLI_OK;
}
