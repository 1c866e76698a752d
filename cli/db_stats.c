/* `ferry db stats --report R --run N`: a run's timeline summarised like `nsys stats` prints it
 * (right-aligned columns, thousands separators), or as a document (ferry.db.stats.v1). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/db_stats.h"
#include "common/alloc.h"

/* "1,234,567" or "102,880.6": digits grouped by three, `decimals` after the point. */
static void grouped(double v, int decimals, char *out, size_t len) {
  char raw[64];
  snprintf(raw, sizeof raw, "%.*f", decimals, fabs(v));
  const char *dot = strchr(raw, '.');
  size_t ints = dot ? (size_t)(dot - raw) : strlen(raw), k = 0;
  if (v < 0 && k + 1 < len) out[k++] = '-';
  for (size_t i = 0; i < ints && k + 2 < len; i++) {
    if (i && (ints - i) % 3 == 0) out[k++] = ',';
    out[k++] = raw[i];
  }
  if (dot) snprintf(out + k, len - k, "%s", dot);
  else out[k < len ? k : len - 1] = '\0';
}

/* How a column is printed: counts and whole nanoseconds grouped, means one decimal, MB three. */
static void cell_text(const char *col, double v, char *out, size_t len) {
  if (isnan(v)) snprintf(out, len, "-");
  else if (strstr(col, "(%)") || strstr(col, "Avg Batch") || strstr(col, "Avg Tokens")) snprintf(out, len, "%.1f", v);
  else if (strstr(col, "(MB)")) snprintf(out, len, "%.3f", v);
  else if (!strncmp(col, "Avg", 3) || !strncmp(col, "Med", 3) || !strncmp(col, "StdDev", 6)) grouped(v, 1, out, len);
  else grouped(v, 0, out, len);
}

static void scrub(char *s) {
  for (; s && *s; s++)
    if ((unsigned char)*s < 0x20 || *s == 0x7f) *s = '?';
}

static void print_text(const struct ferry_stats_table *t, int64_t run, const char *db) {
  const char *nsys = ferry_stats_report_nsys_name(t->report);
  printf("run %lld of %s: %s%s%s\n\n", (long long)run, db, ferry_stats_report_name(t->report), nsys ? ", as nsys " : "",
         nsys ? nsys : "");
  if (!t->nrows) {
    printf(" (nothing to summarise: the run has no %s)\n",
           t->report == FERRY_STATS_KERN_SUM   ? "kernels"
           : t->report == FERRY_STATS_NVTX_SUM ? "NVTX ranges"
           : t->report == FERRY_STATS_STEP_SUM ? "steps"
           : t->report == FERRY_STATS_API_SUM  ? "CUDA runtime calls (recorded by CUPTI: ferry run --profile)"
                                               : "copies or memsets");
    return;
  }
  size_t width[32] = {0};
  char cell[64];
  for (size_t c = 0; c < t->ncols && c < 32; c++) {
    width[c] = strlen(t->columns[c]);
    for (size_t r = 0; r < t->nrows && t->types[c] == 'n'; r++) {
      cell_text(t->columns[c], t->num[r * t->ncols + c], cell, sizeof cell);
      if (strlen(cell) > width[c]) width[c] = strlen(cell);
    }
  }
  for (size_t c = 0; c < t->ncols; c++)
    printf(t->types[c] == 'n' ? " %*s " : " %-*s", (int)width[c], t->columns[c]);
  printf("\n");
  for (size_t c = 0; c < t->ncols; c++) {
    printf(" ");
    for (size_t k = 0; k < width[c]; k++) putchar('-');
    printf(t->types[c] == 'n' ? " " : "");
  }
  printf("\n");
  for (size_t r = 0; r < t->nrows; r++) {
    for (size_t c = 0; c < t->ncols; c++) {
      if (t->types[c] == 'n') {
        cell_text(t->columns[c], t->num[r * t->ncols + c], cell, sizeof cell);
        printf(" %*s ", (int)width[c], cell);
      } else {
        char *s = t->text[r * t->ncols + c];
        scrub(s);
        printf(" %s", s ? s : "");
      }
    }
    printf("\n");
  }
}

int db_stats(const char *db_path, const char *report, const char *run_text, enum cli_format fmt) {
  enum ferry_stats_report r;
  int64_t run;
  if (!report) return cli_usage_error("db", "stats needs --report kern_sum|mem_sum|mem_time_sum|nvtx_sum|step_sum|api_sum");
  if (ferry_stats_report_parse(report, &r) != FERRY_OK) return cli_usage_error("db", "--report: %s", ferry_last_error());
  if (!run_text) return cli_usage_error("db", "stats needs --run N");
  if (cli_parse_int("--run", run_text, 1, INT64_MAX, &run)) return CLI_USAGE;
  if (!db_path) return cli_usage_error("db", "--db FILE is required");
  ferry_db *db;
  ferry_status st = ferry_db_open(&db, db_path, FERRY_DB_READ_ONLY);
  struct ferry_stats_table t = {0};
  if (st == FERRY_OK) st = ferry_db_stats_report(db, run, r, &t);
  ferry_db_close(db);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  int rc = CLI_OK;
  if (fmt == CLI_FORMAT_TEXT) {
    print_text(&t, run, db_path);
  } else {
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "schema", "ferry.db.stats.v1");
    cJSON_AddStringToObject(doc, "database", db_path);
    cJSON_AddNumberToObject(doc, "run", (double)run);
    cJSON_AddStringToObject(doc, "report", ferry_stats_report_name(r));
    cli_json_str(doc, "nsys_report", ferry_stats_report_nsys_name(r));
    cJSON *rows = cJSON_AddArrayToObject(doc, "rows");
    for (size_t i = 0; i < t.nrows; i++) {
      cJSON *o = cJSON_CreateObject();
      for (size_t c = 0; c < t.ncols; c++) {
        if (t.types[c] == 'n') cli_json_num(o, t.columns[c], t.num[i * t.ncols + c]);
        else cli_json_str(o, t.columns[c], t.text[i * t.ncols + c]);
      }
      cJSON_AddItemToArray(rows, o);
    }
    rc = cli_emit(stdout, doc, fmt == CLI_FORMAT_JSON ? NULL : "rows", fmt);
    cJSON_Delete(doc);
  }
  ferry_stats_table_free(&t);
  return rc;
}
