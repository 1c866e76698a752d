/* Export of one run's timeline as Chrome trace-event JSON, which Perfetto and chrome://tracing
 * open: complete events per queue (one thread per streamId), NVTX ranges on their own track,
 * memory per tier as counters. Streamed with stdio so big runs need no JSON tree in memory. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/checked.h"
#include "profiler/db_internal.h"
#include "profiler/schema.h"

#define PID 1
#define NVTX_TID 1000000 /* ranges track */
#define HOST_TID 1000001 /* activities with no queue (streamId < 0) */

struct out {
  FILE *f;
  int64_t t0;
  int first;
};

static void put_json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
    switch (*p) {
    case '"': fputs("\\\"", f); break;
    case '\\': fputs("\\\\", f); break;
    case '\n': fputs("\\n", f); break;
    case '\r': fputs("\\r", f); break;
    case '\t': fputs("\\t", f); break;
    default:
      if (*p < 0x20)
        fprintf(f, "\\u%04x", *p);
      else
        fputc(*p, f);
    }
  }
  fputc('"', f);
}

static void sep(struct out *o) {
  fputs(o->first ? "\n" : ",\n", o->f);
  o->first = 0;
}

/* Times come from the database (untrusted): differences as doubles, never int64 overflow. */
static double us(const struct out *o, int64_t t_ns) { return ferry__span(o->t0, t_ns) / 1000.0; }

static double dur_us(int64_t start, int64_t end) { return end > start ? ferry__span(start, end) / 1000.0 : 0.0; }

/* A JSON number, or null for what JSON cannot hold (inf, NaN stored as REAL). */
static void put_double(FILE *f, double v) {
  if (isfinite(v)) fprintf(f, "%.17g", v);
  else fputs("null", f);
}

static int tid_of(int64_t stream) { return stream < 0 ? HOST_TID : stream > INT32_MAX ? INT32_MAX : (int)stream; }

static void meta(struct out *o, const char *what, int tid, const char *key, const char *name, int num) {
  sep(o);
  fprintf(o->f, "{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"%s\",\"args\":{\"%s\":", PID, tid, what, key);
  if (name)
    put_json_string(o->f, name);
  else
    fprintf(o->f, "%d", num);
  fputs("}}", o->f);
}

/* Optional integer column as a JSON member. */
static void arg_int(FILE *f, sqlite3_stmt *q, int col, const char *key) {
  if (sqlite3_column_type(q, col) != SQLITE_NULL) fprintf(f, ",\"%s\":%lld", key, (long long)sqlite3_column_int64(q, col));
}

/* Each query returns: start, end, streamId, name, correlationId, then table-specific args. */
enum table { T_KERNEL, T_MEMCPY, T_MEMSET, T_SYNC, T_COUNT };
static const struct {
  const char *cat;
  const char *sql;
} tables[T_COUNT] = {
    [T_KERNEL] = {"kernel",
                  "SELECT k.start, k.end, k.streamId, s.value, k.correlationId, k.bytes, k.flops, k.step,"
                  " k.layer, k.expert FROM CUPTI_ACTIVITY_KIND_KERNEL k"
                  " LEFT JOIN StringIds s ON s.id = k.shortName WHERE k.runId = ?1 ORDER BY k.start"},
    [T_MEMCPY] = {"memcpy",
                  "SELECT m.start, m.end, m.streamId, coalesce(s.value, '[memcpy ' || coalesce(e.label, m.copyKind) || ']'),"
                  " m.correlationId, m.bytes, e.label, m.step, m.layer, m.expert"
                  " FROM CUPTI_ACTIVITY_KIND_MEMCPY m LEFT JOIN StringIds s ON s.id = m.nameId"
                  " LEFT JOIN ENUM_CUDA_MEMCPY_OPER e ON e.id = m.copyKind WHERE m.runId = ?1 ORDER BY m.start"},
    [T_MEMSET] = {"memset",
                  "SELECT m.start, m.end, m.streamId, coalesce(s.value, '[memset]'), m.correlationId, m.bytes"
                  " FROM CUPTI_ACTIVITY_KIND_MEMSET m LEFT JOIN StringIds s ON s.id = m.nameId"
                  " WHERE m.runId = ?1 ORDER BY m.start"},
    [T_SYNC] = {"sync",
                "SELECT y.start, y.end, y.streamId, coalesce(s.value, '[sync]'), y.correlationId"
                " FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION y LEFT JOIN StringIds s ON s.id = y.nameId"
                " WHERE y.runId = ?1 ORDER BY y.start"},
};

static int write_table(struct ferry_db *db, struct out *o, int64_t run_id, enum table t) {
  sqlite3_stmt *q;
  int rc = sqlite3_prepare_v2(db->sql, tables[t].sql, -1, &q, NULL);
  if (rc != SQLITE_OK) return rc;
  sqlite3_bind_int64(q, 1, run_id);
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    int64_t start = sqlite3_column_int64(q, 0), end = sqlite3_column_int64(q, 1);
    sep(o);
    fputs("{\"ph\":\"X\",\"name\":", o->f);
    put_json_string(o->f, (const char *)sqlite3_column_text(q, 3));
    fprintf(o->f, ",\"cat\":\"%s\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d,\"args\":{", tables[t].cat,
            us(o, start), dur_us(start, end), PID, tid_of(sqlite3_column_int64(q, 2)));
    fprintf(o->f, "\"correlationId\":%lld", (long long)sqlite3_column_int64(q, 4));
    if (t == T_KERNEL) {
      arg_int(o->f, q, 5, "bytes");
      if (sqlite3_column_type(q, 6) != SQLITE_NULL) {
        fputs(",\"flops\":", o->f);
        put_double(o->f, sqlite3_column_double(q, 6));
      }
      arg_int(o->f, q, 7, "step");
      arg_int(o->f, q, 8, "layer");
      arg_int(o->f, q, 9, "expert");
    } else if (t == T_MEMCPY) {
      arg_int(o->f, q, 5, "bytes");
      if (sqlite3_column_type(q, 6) != SQLITE_NULL) {
        fputs(",\"copyKind\":", o->f);
        put_json_string(o->f, (const char *)sqlite3_column_text(q, 6));
      }
      arg_int(o->f, q, 7, "step");
      arg_int(o->f, q, 8, "layer");
      arg_int(o->f, q, 9, "expert");
    } else if (t == T_MEMSET) {
      arg_int(o->f, q, 5, "bytes");
    }
    fputs("}}", o->f);
  }
  sqlite3_finalize(q);
  return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static int write_nvtx(struct ferry_db *db, struct out *o, int64_t run_id) {
  sqlite3_stmt *q;
  int rc = sqlite3_prepare_v2(db->sql,
                              "SELECT n.start, n.end, coalesce(n.text, s.value, ''), n.step, n.layer, n.expert"
                              " FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId"
                              " WHERE n.runId = ?1 ORDER BY n.start", -1, &q, NULL);
  if (rc != SQLITE_OK) return rc;
  sqlite3_bind_int64(q, 1, run_id);
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    int64_t start = sqlite3_column_int64(q, 0);
    int has_end = sqlite3_column_type(q, 1) != SQLITE_NULL;
    int64_t end = sqlite3_column_int64(q, 1);
    sep(o);
    fputs("{\"ph\":", o->f);
    fputs(has_end ? "\"X\"" : "\"i\",\"s\":\"t\"", o->f);
    fputs(",\"name\":", o->f);
    put_json_string(o->f, (const char *)sqlite3_column_text(q, 2));
    fprintf(o->f, ",\"cat\":\"nvtx\",\"ts\":%.3f", us(o, start));
    if (has_end) fprintf(o->f, ",\"dur\":%.3f", dur_us(start, end));
    fprintf(o->f, ",\"pid\":%d,\"tid\":%d,\"args\":{", PID, NVTX_TID);
    int before = 0;
    const char *keys[3] = {"step", "layer", "expert"};
    for (int k = 0; k < 3; k++) {
      if (sqlite3_column_type(q, 3 + k) == SQLITE_NULL) continue;
      fprintf(o->f, "%s\"%s\":%lld", before ? "," : "", keys[k], (long long)sqlite3_column_int64(q, 3 + k));
      before = 1;
    }
    fputs("}}", o->f);
  }
  sqlite3_finalize(q);
  return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static int write_memory(struct ferry_db *db, struct out *o, int64_t run_id) {
  sqlite3_stmt *q;
  int rc = sqlite3_prepare_v2(db->sql, "SELECT t_ns, tier, used_bytes FROM memory WHERE runId = ?1 ORDER BY t_ns",
                              -1, &q, NULL);
  if (rc != SQLITE_OK) return rc;
  sqlite3_bind_int64(q, 1, run_id);
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    sep(o);
    fputs("{\"ph\":\"C\",\"name\":", o->f);
    char name[64];
    const unsigned char *tier = sqlite3_column_text(q, 1);
    snprintf(name, sizeof name, "memory %s", tier ? (const char *)tier : "?");
    put_json_string(o->f, name);
    fprintf(o->f, ",\"ts\":%.3f,\"pid\":%d,\"args\":{\"bytes\":%lld}}", us(o, sqlite3_column_int64(q, 0)), PID,
            (long long)sqlite3_column_int64(q, 2));
  }
  sqlite3_finalize(q);
  return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static int first_timestamp(struct ferry_db *db, int64_t run_id, int64_t *t0) {
  sqlite3_stmt *q;
  int rc = sqlite3_prepare_v2(db->sql,
                              "SELECT min(t) FROM ("
                              " SELECT min(start) t FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE runId=?1"
                              " UNION ALL SELECT min(start) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE runId=?1"
                              " UNION ALL SELECT min(start) FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE runId=?1"
                              " UNION ALL SELECT min(start) FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION WHERE runId=?1"
                              " UNION ALL SELECT min(start) FROM NVTX_EVENTS WHERE runId=?1"
                              " UNION ALL SELECT min(t_ns) FROM memory WHERE runId=?1)", -1, &q, NULL);
  if (rc != SQLITE_OK) return rc;
  sqlite3_bind_int64(q, 1, run_id);
  rc = sqlite3_step(q);
  *t0 = rc == SQLITE_ROW ? sqlite3_column_int64(q, 0) : 0; /* NULL (no rows) reads as 0 */
  sqlite3_finalize(q);
  return rc == SQLITE_ROW ? SQLITE_OK : rc;
}

static int write_thread_names(struct ferry_db *db, struct out *o, int64_t run_id) {
  sqlite3_stmt *q;
  int rc = sqlite3_prepare_v2(db->sql,
                              "SELECT DISTINCT streamId FROM ("
                              " SELECT streamId FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE runId=?1"
                              " UNION SELECT streamId FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE runId=?1"
                              " UNION SELECT streamId FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE runId=?1"
                              " UNION SELECT streamId FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION WHERE runId=?1)"
                              " ORDER BY 1", -1, &q, NULL);
  if (rc != SQLITE_OK) return rc;
  sqlite3_bind_int64(q, 1, run_id);
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    int64_t s = sqlite3_column_int64(q, 0);
    char name[64];
    if (s < 0)
      snprintf(name, sizeof name, "host");
    else
      snprintf(name, sizeof name, "queue %lld", (long long)s);
    meta(o, "thread_name", tid_of(s), "name", name, 0);
    meta(o, "thread_sort_index", tid_of(s), "sort_index", NULL, s < 0 ? 1000001 : tid_of(s));
  }
  sqlite3_finalize(q);
  return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

ferry_status ferry_db_export_trace(ferry_db *db, int64_t run_id, const char *out_path) {
  if (!db || !out_path) return ferry__fail(FERRY_ERR_INVALID, "ferry_db_export_trace: NULL argument");
  struct ferry_run_summary *run;
  ferry_status st = ferry_db_get_run(db, run_id, &run);
  if (st != FERRY_OK) return st;
  char pname[512];
  snprintf(pname, sizeof pname, "ferry run %lld (%s%s%s)", (long long)run_id, run->kind,
           run->model ? ", " : "", run->model ? run->model : "");
  ferry_db_runs_free(run, 1);

  char *tmp = ferry__asprintf("%s.tmp.%d", out_path, (int)getpid());
  if (!tmp) return ferry__err_set(&db->err, FERRY_ERR_NOMEM, "%s: out of memory", out_path);
  struct out o = {fopen(tmp, "w"), 0, 1};
  if (!o.f) {
    st = ferry__err_set(&db->err, errno == ENOSPC ? FERRY_ERR_NO_SPACE : FERRY_ERR_IO, "%s: cannot create (%s)",
                        out_path, strerror(errno));
    ferry_free(tmp);
    return st;
  }
  pthread_mutex_lock(&db->write_mu);
  /* One read transaction: a consistent snapshot even while another process writes. */
  int rc = sqlite3_exec(db->sql, "BEGIN", NULL, NULL, NULL);
  const char *what = "reading the timeline";
  if (rc == SQLITE_OK) rc = first_timestamp(db, run_id, &o.t0);
  if (rc == SQLITE_OK) {
    fputs("{\"displayTimeUnit\":\"ns\",\"otherData\":{\"runId\":", o.f);
    fprintf(o.f, "%lld,\"t0_ns\":%lld},\"traceEvents\":[", (long long)run_id, (long long)o.t0);
    meta(&o, "process_name", 0, "name", pname, 0);
    meta(&o, "thread_name", NVTX_TID, "name", "NVTX ranges", 0);
    meta(&o, "thread_sort_index", NVTX_TID, "sort_index", NULL, -1);
    rc = write_thread_names(db, &o, run_id);
  }
  for (int t = 0; t < T_COUNT && rc == SQLITE_OK; t++) rc = write_table(db, &o, run_id, (enum table)t);
  if (rc == SQLITE_OK) rc = write_nvtx(db, &o, run_id);
  if (rc == SQLITE_OK) rc = write_memory(db, &o, run_id);
  if (rc != SQLITE_OK) st = ferry__db_sqlite_error(db->sql, rc, db->path, what, &db->err);
  sqlite3_exec(db->sql, "COMMIT", NULL, NULL, NULL);
  pthread_mutex_unlock(&db->write_mu);

  fputs("\n]}\n", o.f);
  int werr = ferror(o.f) || fflush(o.f) != 0 || fsync(fileno(o.f)) != 0;
  int saved = errno;
  if (fclose(o.f) != 0 && !werr) {
    werr = 1;
    saved = errno;
  }
  if (st == FERRY_OK && werr)
    st = ferry__err_set(&db->err, saved == ENOSPC ? FERRY_ERR_NO_SPACE : FERRY_ERR_IO, "%s: write failed (%s)",
                        out_path, strerror(saved));
  if (st == FERRY_OK && rename(tmp, out_path) != 0)
    st = ferry__err_set(&db->err, FERRY_ERR_IO, "%s: cannot rename into place (%s)", out_path, strerror(errno));
  if (st != FERRY_OK) unlink(tmp);
  ferry_free(tmp);
  return st;
}
