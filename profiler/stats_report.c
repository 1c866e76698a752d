/* `ferry db stats`: summaries of one run's timeline with the names and columns of `nsys stats`
 * (cuda_gpu_kern_sum, cuda_gpu_mem_size_sum, cuda_gpu_mem_time_sum, nvtx_sum, cuda_api_sum) and ferry's own
 * step_sum, over the nsys-layout tables, so ferry runs and imported Nsight Systems exports are
 * summarised alike. Each report is one query ordered by group and value; the groups' statistics
 * (total, count, mean, median, min, max, sample standard deviation) are computed here. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "profiler/db_internal.h"
#include "profiler/schema.h"

static const struct {
  const char *name;
  const char *nsys; /* the nsys stats report it follows, or NULL */
} reports[FERRY_STATS_COUNT] = {
    [FERRY_STATS_KERN_SUM] = {"kern_sum", "cuda_gpu_kern_sum"},
    [FERRY_STATS_MEM_SIZE_SUM] = {"mem_sum", "cuda_gpu_mem_size_sum"},
    [FERRY_STATS_MEM_TIME_SUM] = {"mem_time_sum", "cuda_gpu_mem_time_sum"},
    [FERRY_STATS_NVTX_SUM] = {"nvtx_sum", "nvtx_sum"},
    [FERRY_STATS_STEP_SUM] = {"step_sum", NULL},
    [FERRY_STATS_API_SUM] = {"api_sum", "cuda_api_sum"},
};

const char *ferry_stats_report_name(enum ferry_stats_report r) {
  return (unsigned)r < FERRY_STATS_COUNT ? reports[r].name : "?";
}

const char *ferry_stats_report_nsys_name(enum ferry_stats_report r) {
  return (unsigned)r < FERRY_STATS_COUNT ? reports[r].nsys : NULL;
}

ferry_status ferry_stats_report_parse(const char *text, enum ferry_stats_report *out) {
  for (int i = 0; text && i < FERRY_STATS_COUNT; i++)
    if (!strcmp(text, reports[i].name) || (reports[i].nsys && !strcmp(text, reports[i].nsys))) {
      *out = (enum ferry_stats_report)i;
      return FERRY_OK;
    }
  return ferry__fail(FERRY_ERR_INVALID, "unknown report '%s': expected kern_sum, mem_sum, mem_time_sum, nvtx_sum, "
                                        "step_sum or api_sum (or the nsys names cuda_gpu_kern_sum, "
                                        "cuda_gpu_mem_size_sum, cuda_gpu_mem_time_sum, cuda_api_sum)",
                     text ? text : "");
}

/* Copy kinds as nsys names them in its reports; ferry's disk reads in the same style. */
static const char copy_ops[] =
    "CASE copyKind WHEN 1 THEN '[CUDA memcpy Host-to-Device]' WHEN 2 THEN '[CUDA memcpy Device-to-Host]'"
    " WHEN 8 THEN '[CUDA memcpy Device-to-Device]' WHEN 9 THEN '[CUDA memcpy Host-to-Host]'"
    " WHEN 10 THEN '[CUDA memcpy Peer-to-Peer]' WHEN 11 THEN '[CUDA memcpy Unified Host-to-Device]'"
    " WHEN 12 THEN '[CUDA memcpy Unified Device-to-Host]' WHEN 100 THEN '[ferry disk read Disk-to-Host]'"
    " ELSE '[CUDA memcpy kind ' || copyKind || ']' END";

/* Rows of each query: group name, value (a duration in ns or a size in bytes), and for step_sum
 * the step's batch, tokens, stall, disk, h2d and d2h bytes. Differences as REAL: the database
 * is untrusted, an int64 difference could overflow. */
static int query_text(enum ferry_stats_report r, int steps_from_nvtx, char *out, size_t len) {
  switch (r) {
    case FERRY_STATS_KERN_SUM:
      return snprintf(out, len,
                      "SELECT coalesce(s.value, '[unnamed kernel]'), CAST(k.\"end\" AS REAL) - k.start"
                      " FROM CUPTI_ACTIVITY_KIND_KERNEL k LEFT JOIN StringIds s ON s.id = k.demangledName"
                      " WHERE k.runId = ?1 ORDER BY 1, 2");
    case FERRY_STATS_MEM_SIZE_SUM:
    case FERRY_STATS_MEM_TIME_SUM: {
      const char *v = r == FERRY_STATS_MEM_SIZE_SUM ? "CAST(bytes AS REAL)" : "CAST(\"end\" AS REAL) - start";
      return snprintf(out, len,
                      "SELECT op, v FROM (SELECT %s AS op, %s AS v FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE runId = ?1"
                      " UNION ALL SELECT '[CUDA memset]', %s FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE runId = ?1)"
                      " ORDER BY 1, 2",
                      copy_ops, v, v);
    }
    case FERRY_STATS_NVTX_SUM:
      /* ranges only: marks have no end, 75 is a domain's creation */
      return snprintf(out, len,
                      "SELECT coalesce(n.text, s.value, '[unnamed range]'), CAST(n.\"end\" AS REAL) - n.start,"
                      " CASE n.eventType WHEN 59 THEN 'PushPop' WHEN 60 THEN 'StartEnd' ELSE 'Range' END"
                      " FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId"
                      " WHERE n.runId = ?1 AND n.\"end\" IS NOT NULL AND n.eventType <> 75 ORDER BY 1, 2");
    case FERRY_STATS_STEP_SUM:
      if (steps_from_nvtx)
        return snprintf(out, len,
                        "SELECT 'step (NVTX ranges)', CAST(n.\"end\" AS REAL) - n.start"
                        " FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId"
                        " WHERE n.runId = ?1 AND n.\"end\" IS NOT NULL AND n.eventType <> 75 AND"
                        " (coalesce(n.text, s.value) = 'step' OR coalesce(n.text, s.value) GLOB 'step [0-9]*')"
                        " ORDER BY 2");
      /* a step that prefills (more tokens than sequences) costs another order than pure decode */
      return snprintf(out, len,
                      "SELECT CASE WHEN tokens > batch THEN 'prefill + decode' ELSE 'decode' END,"
                      " CAST(end_ns AS REAL) - start_ns, batch, tokens, stall_ns, bytes_disk, bytes_h2d, bytes_d2h"
                      " FROM steps WHERE runId = ?1 ORDER BY 1, 2");
    case FERRY_STATS_API_SUM:
      return snprintf(out, len,
                      "SELECT coalesce(s.value, '[unnamed call]'), CAST(a.\"end\" AS REAL) - a.start"
                      " FROM CUPTI_ACTIVITY_KIND_RUNTIME a LEFT JOIN StringIds s ON s.id = a.nameId"
                      " WHERE a.runId = ?1 ORDER BY 1, 2");
    case FERRY_STATS_COUNT: break;
  }
  return 0;
}

/* Column layouts. 'n': number, 't': text. */
struct layout {
  const char *const *cols;
  const char *types;
};

static const char *const time_cols[] = {"Time (%)",   "Total Time (ns)", "Instances", "Avg (ns)", "Med (ns)",
                                        "Min (ns)",   "Max (ns)",        "StdDev (ns)", "Name", NULL};
static const char *const api_cols[] = {"Time (%)", "Total Time (ns)", "Num Calls",   "Avg (ns)", "Med (ns)",
                                       "Min (ns)", "Max (ns)",        "StdDev (ns)", "Name",     NULL};
static const char *const size_cols[] = {"Total (MB)", "Count",   "Avg (MB)",    "Med (MB)", "Min (MB)",
                                        "Max (MB)",   "StdDev (MB)", "Operation", NULL};
static const char *const mtime_cols[] = {"Time (%)", "Total Time (ns)", "Count",       "Avg (ns)",  "Med (ns)",
                                         "Min (ns)", "Max (ns)",        "StdDev (ns)", "Operation", NULL};
static const char *const nvtx_cols[] = {"Time (%)", "Total Time (ns)", "Instances",   "Avg (ns)", "Med (ns)", "Min (ns)",
                                        "Max (ns)", "StdDev (ns)",     "Style",       "Range",    NULL};
static const char *const step_cols[] = {"Time (%)",   "Total Time (ns)", "Steps",     "Avg (ns)",  "Med (ns)",
                                        "Min (ns)",   "Max (ns)",        "StdDev (ns)", "Avg Batch", "Avg Tokens",
                                        "Stall (%)",  "Disk (MB)",       "H2D (MB)",  "D2H (MB)",  "Kind", NULL};

static struct layout layout_of(enum ferry_stats_report r) {
  switch (r) {
    case FERRY_STATS_KERN_SUM: return (struct layout){time_cols, "nnnnnnnnt"};
    case FERRY_STATS_MEM_SIZE_SUM: return (struct layout){size_cols, "nnnnnnnt"};
    case FERRY_STATS_MEM_TIME_SUM: return (struct layout){mtime_cols, "nnnnnnnnt"};
    case FERRY_STATS_NVTX_SUM: return (struct layout){nvtx_cols, "nnnnnnnntt"};
    case FERRY_STATS_API_SUM: return (struct layout){api_cols, "nnnnnnnnt"};
    default: return (struct layout){step_cols, "nnnnnnnnnnnnnnt"};
  }
}

/* One group being gathered. */
struct group {
  char *name, *style;
  double *v; /* values, ascending (the query orders them) */
  size_t n, cap;
  double batch, tokens, stall, disk, h2d, d2h; /* step_sum sums */
};

static int group_push(struct group *g, double v) {
  if (g->n == g->cap) {
    size_t cap = g->cap ? g->cap * 2 : 64;
    double *p = ferry__reallocarray(g->v, cap, sizeof *p);
    if (!p) return -1;
    g->v = p;
    g->cap = cap;
  }
  g->v[g->n++] = v;
  return 0;
}

static void group_reset(struct group *g) {
  ferry_free(g->name);
  ferry_free(g->style);
  double *v = g->v;
  size_t cap = g->cap;
  memset(g, 0, sizeof *g);
  g->v = v;
  g->cap = cap;
}

static int table_grow(struct ferry_stats_table *t) {
  size_t rows = t->nrows + 1;
  double *num = ferry__reallocarray(t->num, rows * t->ncols, sizeof *num);
  if (!num) return -1;
  t->num = num;
  char **text = ferry__reallocarray(t->text, rows * t->ncols, sizeof *text);
  if (!text) return -1;
  t->text = text;
  for (size_t c = 0; c < t->ncols; c++) {
    t->num[t->nrows * t->ncols + c] = NAN;
    t->text[t->nrows * t->ncols + c] = NULL;
  }
  t->nrows = rows;
  return 0;
}

/* CUPTI names runtime calls with the API version that introduced them ("cudaLaunchKernel_v7000");
 * nsys's cuda_api_sum prints the function's name alone, and so does api_sum. */
static void strip_api_version(char *name) {
  char *v = strrchr(name, '_');
  if (!v || v[1] != 'v' || !v[2]) return;
  for (const char *c = v + 2; *c; c++)
    if (*c < '0' || *c > '9') return;
  *v = '\0';
}

/* Append the group's row; scale divides the values (1e6: bytes to MB). */
static int emit_group(struct ferry_stats_table *t, enum ferry_stats_report r, struct group *g, double scale) {
  if (!g->n) return 0;
  if (table_grow(t)) return -1;
  double *row = &t->num[(t->nrows - 1) * t->ncols];
  char **txt = &t->text[(t->nrows - 1) * t->ncols];
  double sum = 0, lo = g->v[0], hi = g->v[0];
  for (size_t i = 0; i < g->n; i++) {
    sum += g->v[i];
    lo = g->v[i] < lo ? g->v[i] : lo;
    hi = g->v[i] > hi ? g->v[i] : hi;
  }
  const double mean = sum / (double)g->n;
  double ss = 0;
  for (size_t i = 0; i < g->n; i++) ss += (g->v[i] - mean) * (g->v[i] - mean);
  const double sd = g->n > 1 ? sqrt(ss / (double)(g->n - 1)) : 0.0; /* sample deviation, as nsys */
  const double med = ferry__db_percentile(g->v, g->n, 50);
  size_t c = 0;
  if (r != FERRY_STATS_MEM_SIZE_SUM) row[c++] = NAN; /* Time (%): filled once every total is known */
  row[c++] = sum / scale;
  row[c++] = (double)g->n;
  row[c++] = mean / scale;
  row[c++] = med / scale;
  row[c++] = lo / scale;
  row[c++] = hi / scale;
  row[c++] = sd / scale;
  if (r == FERRY_STATS_STEP_SUM) {
    const double n = (double)g->n;
    const int has_steps = !isnan(g->batch);
    row[c++] = has_steps ? g->batch / n : NAN;
    row[c++] = has_steps ? g->tokens / n : NAN;
    row[c++] = has_steps && sum > 0 ? 100.0 * g->stall / sum : NAN;
    row[c++] = has_steps ? g->disk / 1e6 : NAN;
    row[c++] = has_steps ? g->h2d / 1e6 : NAN;
    row[c++] = has_steps ? g->d2h / 1e6 : NAN;
  }
  if (r == FERRY_STATS_NVTX_SUM) {
    txt[c] = g->style;
    g->style = NULL;
    c++;
  }
  if (r == FERRY_STATS_API_SUM) strip_api_version(g->name);
  txt[c] = g->name;
  g->name = NULL;
  return 0;
}

void ferry_stats_table_free(struct ferry_stats_table *t) {
  if (!t) return;
  for (size_t i = 0; t->text && i < t->nrows * t->ncols; i++) ferry_free(t->text[i]);
  ferry_free(t->text);
  ferry_free(t->num);
  memset(t, 0, sizeof *t);
}

static int column_count(const char *const *cols) {
  int n = 0;
  while (cols[n]) n++;
  return n;
}

/* Whether the run has step rows (else step_sum reads ferry's NVTX step ranges). */
static int has_steps(struct ferry_db *db, int64_t run_id) {
  sqlite3_stmt *q;
  int yes = 0;
  if (sqlite3_prepare_v2(db->sql, "SELECT 1 FROM steps WHERE runId = ?1 LIMIT 1", -1, &q, NULL) == SQLITE_OK) {
    sqlite3_bind_int64(q, 1, run_id);
    yes = sqlite3_step(q) == SQLITE_ROW;
  }
  sqlite3_finalize(q);
  return yes;
}

ferry_status ferry_db_stats_report(ferry_db *db, int64_t run_id, enum ferry_stats_report r,
                                   struct ferry_stats_table *out) {
  if (!db || !out || (unsigned)r >= FERRY_STATS_COUNT)
    return ferry__fail(FERRY_ERR_INVALID, "ferry_db_stats_report: NULL argument or unknown report");
  memset(out, 0, sizeof *out);
  struct ferry_run_summary *run;
  ferry_status st = ferry_db_get_run(db, run_id, &run);
  if (st != FERRY_OK) return st;
  ferry_db_runs_free(run, 1);
  const struct layout lay = layout_of(r);
  out->report = r;
  out->columns = lay.cols;
  out->types = lay.types;
  out->ncols = (size_t)column_count(lay.cols);

  pthread_mutex_lock(&db->write_mu);
  const int nvtx_steps = r == FERRY_STATS_STEP_SUM && !has_steps(db, run_id);
  char sql_text[1536];
  query_text(r, nvtx_steps, sql_text, sizeof sql_text);
  sqlite3_stmt *q = NULL;
  struct group g = {0};
  const double scale = r == FERRY_STATS_MEM_SIZE_SUM ? 1e6 : 1.0;
  int rc = sqlite3_prepare_v2(db->sql, sql_text, -1, &q, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_bind_int64(q, 1, run_id);
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
      const char *name = (const char *)sqlite3_column_text(q, 0);
      if (!name) name = "";
      if (g.name && strcmp(g.name, name)) {
        if (emit_group(out, r, &g, scale)) goto out_nomem;
        group_reset(&g);
      }
      if (!g.name) {
        if (!(g.name = ferry__strdup(name))) goto out_nomem;
        g.batch = nvtx_steps ? NAN : 0;
      }
      double v = sqlite3_column_double(q, 1);
      if (!isfinite(v)) v = 0; /* a hostile REAL: counted, not summed */
      if (group_push(&g, v)) goto out_nomem;
      if (r == FERRY_STATS_NVTX_SUM && !g.style) {
        const char *style = (const char *)sqlite3_column_text(q, 2);
        if (!(g.style = ferry__strdup(style ? style : ""))) goto out_nomem;
      }
      if (r == FERRY_STATS_STEP_SUM && !nvtx_steps) {
        g.batch += sqlite3_column_double(q, 2);
        g.tokens += sqlite3_column_double(q, 3);
        g.stall += sqlite3_column_double(q, 4);
        g.disk += sqlite3_column_double(q, 5);
        g.h2d += sqlite3_column_double(q, 6);
        g.d2h += sqlite3_column_double(q, 7);
      }
    }
    if (rc == SQLITE_DONE && emit_group(out, r, &g, scale)) goto out_nomem;
  }
  if (rc != SQLITE_DONE) st = ferry__db_sqlite_error(db->sql, rc, db->path, "summarising the timeline", &db->err);
  goto out;
out_nomem:
  st = ferry__err_set(&db->err, FERRY_ERR_NOMEM, "%s: out of memory summarising run %lld", db->path, (long long)run_id);
out:
  sqlite3_finalize(q);
  pthread_mutex_unlock(&db->write_mu);
  group_reset(&g);
  ferry_free(g.v);
  if (st != FERRY_OK) {
    ferry_stats_table_free(out);
    return st;
  }
  /* Time (%) of the total, rows by total time (or bytes) descending, as nsys orders them */
  const size_t tot = r == FERRY_STATS_MEM_SIZE_SUM ? 0 : 1;
  double all = 0;
  for (size_t i = 0; i < out->nrows; i++) all += out->num[i * out->ncols + tot];
  for (size_t i = 0; i < out->nrows && r != FERRY_STATS_MEM_SIZE_SUM; i++)
    out->num[i * out->ncols] = all > 0 ? 100.0 * out->num[i * out->ncols + tot] / all : 0.0;
  for (size_t i = 1; i < out->nrows; i++)
    for (size_t j = i; j > 0 && out->num[(j - 1) * out->ncols + tot] < out->num[j * out->ncols + tot]; j--)
      for (size_t c = 0; c < out->ncols; c++) {
        double tn = out->num[j * out->ncols + c];
        out->num[j * out->ncols + c] = out->num[(j - 1) * out->ncols + c];
        out->num[(j - 1) * out->ncols + c] = tn;
        char *tt = out->text[j * out->ncols + c];
        out->text[j * out->ncols + c] = out->text[(j - 1) * out->ncols + c];
        out->text[(j - 1) * out->ncols + c] = tt;
      }
  return FERRY_OK;
}
