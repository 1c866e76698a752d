/* Export of one run's timeline as Chrome trace-event JSON, which Perfetto and chrome://tracing
 * open. Process 1 is the run: one named track per queue (compute, H2D, D2H, disk; a CUDA
 * stream is named by what it carried), NVTX ranges on their own track, flow arrows from each
 * weight fetch to the op that consumed it (disk read -> copy -> kernel), and counters for memory
 * per tier, batch size and KV-cache use. Process 2 holds one async span per request (queued and
 * prefill up to the first token, then decode). A window of steps or seconds keeps big runs small.
 * Streamed with stdio, so no JSON tree is held in memory. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/checked.h"
#include "profiler/db_internal.h"
#include "profiler/schema.h"

#define PID 1
#define REQ_PID 2
#define NVTX_TID 1000000 /* ranges track */
#define HOST_TID 1000001 /* activities with no queue (streamId < 0) */

struct out {
  FILE *f;
  int64_t t0;
  int first;
  int64_t w0, w1; /* the window, inclusive; INT64_MIN / INT64_MAX when open */
  int64_t flows;  /* flow ids handed out */
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
      if (*p < 0x20 || *p == 0x7f)
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

static void meta(struct out *o, int pid, const char *what, int tid, const char *key, const char *name, int num) {
  sep(o);
  fprintf(o->f, "{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"%s\",\"args\":{\"%s\":", pid, tid, what, key);
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

/* Binds the run (?1) and the window (?2, ?3) every windowed query takes. */
static void bind_window(sqlite3_stmt *q, int64_t run_id, const struct out *o) {
  sqlite3_bind_int64(q, 1, run_id);
  sqlite3_bind_int64(q, 2, o->w0);
  sqlite3_bind_int64(q, 3, o->w1);
}

/* Each query returns: start, end, streamId, name, correlationId, then table-specific args; only
 * what overlaps the window. Disk reads and writes (ferry's copyKind 100 and 101) are category
 * "disk", their copyKind the label "Disk-to-Host (ferry 100)" or "Host-to-Disk (ferry 101)": no CUDA
 * tool mistakes them for a CUDA copy. */
enum table { T_KERNEL, T_MEMCPY, T_MEMSET, T_SYNC, T_COUNT };
#define WINDOW(t) " AND " t ".\"end\" >= ?2 AND " t ".start <= ?3"
static const char *const table_sql[T_COUNT] = {
    [T_KERNEL] = "SELECT k.start, k.end, k.streamId, s.value, k.correlationId, k.bytes, k.flops, k.step,"
                 " k.layer, k.expert FROM CUPTI_ACTIVITY_KIND_KERNEL k"
                 " LEFT JOIN StringIds s ON s.id = k.shortName WHERE k.runId = ?1" WINDOW("k") " ORDER BY k.start",
    [T_MEMCPY] = "SELECT m.start, m.end, m.streamId, coalesce(s.value, '[memcpy ' || coalesce(e.label, m.copyKind) || ']'),"
                 " m.correlationId, m.bytes, CASE m.copyKind WHEN 100 THEN 'Disk-to-Host (ferry 100)'"
                 " WHEN 101 THEN 'Host-to-Disk (ferry 101)' ELSE e.label END,"
                 " m.step, m.layer, m.expert, m.copyKind"
                 " FROM CUPTI_ACTIVITY_KIND_MEMCPY m LEFT JOIN StringIds s ON s.id = m.nameId"
                 " LEFT JOIN ENUM_CUDA_MEMCPY_OPER e ON e.id = m.copyKind WHERE m.runId = ?1" WINDOW("m")
                 " ORDER BY m.start",
    [T_MEMSET] = "SELECT m.start, m.end, m.streamId, coalesce(s.value, '[memset]'), m.correlationId, m.bytes"
                 " FROM CUPTI_ACTIVITY_KIND_MEMSET m LEFT JOIN StringIds s ON s.id = m.nameId"
                 " WHERE m.runId = ?1" WINDOW("m") " ORDER BY m.start",
    [T_SYNC] = "SELECT y.start, y.end, y.streamId, coalesce(s.value, '[sync]'), y.correlationId"
               " FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION y LEFT JOIN StringIds s ON s.id = y.nameId"
               " WHERE y.runId = ?1" WINDOW("y") " ORDER BY y.start",
};
static const char *const table_cat[T_COUNT] = {"kernel", "memcpy", "memset", "sync"};

static int write_table(struct ferry_db *db, struct out *o, int64_t run_id, enum table t) {
  sqlite3_stmt *q;
  int rc = sqlite3_prepare_v2(db->sql, table_sql[t], -1, &q, NULL);
  if (rc != SQLITE_OK) return rc;
  bind_window(q, run_id, o);
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    int64_t start = sqlite3_column_int64(q, 0), end = sqlite3_column_int64(q, 1);
    const int64_t kind = t == T_MEMCPY ? sqlite3_column_int64(q, 10) : 0;
    const int disk = kind == FERRY_COPY_DISK_TO_HOST || kind == FERRY_COPY_HOST_TO_DISK;
    sep(o);
    fputs("{\"ph\":\"X\",\"name\":", o->f);
    put_json_string(o->f, (const char *)sqlite3_column_text(q, 3));
    fprintf(o->f, ",\"cat\":\"%s\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d,\"args\":{", disk ? "disk" : table_cat[t],
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
                              " WHERE n.runId = ?1 AND coalesce(n.\"end\", n.start) >= ?2 AND n.start <= ?3"
                              " AND n.eventType <> 75 ORDER BY n.start",
                              -1, &q, NULL);
  if (rc != SQLITE_OK) return rc;
  bind_window(q, run_id, o);
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

static void counter(struct out *o, const char *name, int64_t t_ns, const char *key, double value) {
  sep(o);
  fputs("{\"ph\":\"C\",\"name\":", o->f);
  put_json_string(o->f, name);
  fprintf(o->f, ",\"ts\":%.3f,\"pid\":%d,\"args\":{\"%s\":", us(o, t_ns), PID, key);
  put_double(o->f, value);
  fputs("}}", o->f);
}

/* Memory per tier: the samples in the window and, per tier, the last one before it (the level
 * the window starts at). */
static int write_memory(struct ferry_db *db, struct out *o, int64_t run_id) {
  sqlite3_stmt *q;
  int rc = sqlite3_prepare_v2(db->sql,
                              "SELECT t_ns, tier, used_bytes FROM memory WHERE runId = ?1 AND t_ns >= ?2 AND t_ns <= ?3"
                              " UNION ALL SELECT max(t_ns), tier, used_bytes FROM memory WHERE runId = ?1 AND t_ns < ?2"
                              " GROUP BY tier ORDER BY 1",
                              -1, &q, NULL);
  if (rc != SQLITE_OK) return rc;
  bind_window(q, run_id, o);
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    char name[64];
    const unsigned char *tier = sqlite3_column_text(q, 1);
    snprintf(name, sizeof name, "memory %s", tier ? (const char *)tier : "?");
    counter(o, name, sqlite3_column_int64(q, 0), "bytes", (double)sqlite3_column_int64(q, 2));
  }
  sqlite3_finalize(q);
  return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* Batch size and KV-cache tokens per step: set at the step's start, back to 0 at its end when
 * nothing follows at once, so idle time reads as idle. */
static int write_steps(struct ferry_db *db, struct out *o, int64_t run_id) {
  sqlite3_stmt *q;
  /* kv_tokens came with schema version 5: an older database read as it is has none */
  int rc = sqlite3_prepare_v2(db->sql,
                              db->version >= 5 ? "SELECT start_ns, end_ns, batch, kv_tokens FROM steps WHERE runId = ?1"
                                                 " AND end_ns >= ?2 AND start_ns <= ?3 ORDER BY start_ns"
                                               : "SELECT start_ns, end_ns, batch, NULL FROM steps WHERE runId = ?1"
                                                 " AND end_ns >= ?2 AND start_ns <= ?3 ORDER BY start_ns",
                              -1, &q, NULL);
  if (rc != SQLITE_OK) return rc;
  bind_window(q, run_id, o);
  int64_t last_end = INT64_MIN;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    int64_t start = sqlite3_column_int64(q, 0), end = sqlite3_column_int64(q, 1);
    if (last_end != INT64_MIN && start > last_end) {
      counter(o, "batch (sequences)", last_end, "sequences", 0);
      counter(o, "KV cache (tokens)", last_end, "tokens", 0);
    }
    counter(o, "batch (sequences)", start, "sequences", (double)sqlite3_column_int64(q, 2));
    if (sqlite3_column_type(q, 3) != SQLITE_NULL)
      counter(o, "KV cache (tokens)", start, "tokens", (double)sqlite3_column_int64(q, 3));
    last_end = end;
  }
  if (rc == SQLITE_DONE && last_end != INT64_MIN) {
    counter(o, "batch (sequences)", last_end, "sequences", 0);
    counter(o, "KV cache (tokens)", last_end, "tokens", 0);
  }
  sqlite3_finalize(q);
  return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static void async_event(struct out *o, char ph, const char *name, int64_t id, int64_t t_ns) {
  sep(o);
  fprintf(o->f, "{\"ph\":\"%c\",\"cat\":\"request\",\"id\":%lld,\"name\":", ph, (long long)id);
  put_json_string(o->f, name);
  fprintf(o->f, ",\"ts\":%.3f,\"pid\":%d,\"tid\":0}", us(o, t_ns), REQ_PID);
}

/* One async span per request, from arrival to its last token, holding "queued + prefill" up to
 * the first token and "decode" after it. The row number is the id: request ids may repeat. */
static int write_requests(struct ferry_db *db, struct out *o, int64_t run_id) {
  sqlite3_stmt *q;
  int rc = sqlite3_prepare_v2(db->sql,
                              "SELECT rowid, req_id, arrival_ns, first_token_ns, finish_ns, prompt_tokens, output_tokens"
                              " FROM requests WHERE runId = ?1 AND finish_ns >= ?2 AND arrival_ns <= ?3"
                              " AND first_token_ns >= arrival_ns AND finish_ns >= first_token_ns ORDER BY arrival_ns",
                              -1, &q, NULL);
  if (rc != SQLITE_OK) return rc;
  bind_window(q, run_id, o);
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    const int64_t id = sqlite3_column_int64(q, 0), arrival = sqlite3_column_int64(q, 2),
                  first = sqlite3_column_int64(q, 3), finish = sqlite3_column_int64(q, 4);
    char name[96];
    snprintf(name, sizeof name, "request %lld (%lld+%lld tokens)", (long long)sqlite3_column_int64(q, 1),
             (long long)sqlite3_column_int64(q, 5), (long long)sqlite3_column_int64(q, 6));
    async_event(o, 'b', name, id, arrival);
    async_event(o, 'b', "queued + prefill", id, arrival);
    async_event(o, 'e', "queued + prefill", id, first);
    async_event(o, 'b', "decode", id, first);
    async_event(o, 'e', "decode", id, finish);
    async_event(o, 'e', name, id, finish);
  }
  sqlite3_finalize(q);
  return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* --- flows: a fetch to the op that consumed it ---------------------------------------------- */

struct op {
  int64_t start, end;
  int32_t layer, expert, tid;
};

static int cmp_op(const void *a, const void *b) {
  const struct op *x = a, *y = b;
  if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
  if (x->expert != y->expert) return x->expert < y->expert ? -1 : 1;
  return (x->start > y->start) - (x->start < y->start);
}

/* Ops with a layer from one query (start, end, streamId, layer, expert), sorted for lookup. */
static int load_ops(struct ferry_db *db, const struct out *o, int64_t run_id, const char *sql_text, struct op **out,
                    size_t *n) {
  *out = NULL;
  *n = 0;
  sqlite3_stmt *q;
  int rc = sqlite3_prepare_v2(db->sql, sql_text, -1, &q, NULL);
  if (rc != SQLITE_OK) return rc;
  bind_window(q, run_id, o);
  size_t cap = 0;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    if (*n == cap) {
      cap = cap ? cap * 2 : 256;
      struct op *p = ferry__reallocarray(*out, cap, sizeof *p);
      if (!p) {
        rc = SQLITE_NOMEM;
        break;
      }
      *out = p;
    }
    struct op *e = &(*out)[(*n)++];
    e->start = sqlite3_column_int64(q, 0);
    e->end = sqlite3_column_int64(q, 1);
    e->tid = tid_of(sqlite3_column_int64(q, 2));
    e->layer = (int32_t)sqlite3_column_int64(q, 3);
    e->expert = sqlite3_column_type(q, 4) == SQLITE_NULL ? -1 : (int32_t)sqlite3_column_int64(q, 4);
  }
  sqlite3_finalize(q);
  if (rc != SQLITE_DONE) {
    ferry_free(*out);
    *out = NULL;
    *n = 0;
    return rc;
  }
  if (*n) qsort(*out, *n, sizeof **out, cmp_op);
  return SQLITE_OK;
}

/* The first op of `to` with the fetch's layer and expert starting at or after it ended. */
static const struct op *consumer(const struct op *to, size_t n, const struct op *from) {
  size_t lo = 0, hi = n;
  const struct op key = {.start = from->end, .layer = from->layer, .expert = from->expert};
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (cmp_op(&to[mid], &key) < 0) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && to[lo].layer == from->layer && to[lo].expert == from->expert ? &to[lo] : NULL;
}

static void flow(struct out *o, const char *name, const struct op *from, const struct op *to) {
  const int64_t id = ++o->flows;
  sep(o);
  fputs("{\"ph\":\"s\",\"cat\":\"fetch\",\"name\":", o->f);
  put_json_string(o->f, name);
  fprintf(o->f, ",\"id\":%lld,\"ts\":%.3f,\"pid\":%d,\"tid\":%d}", (long long)id, us(o, from->start), PID, from->tid);
  sep(o);
  fputs("{\"ph\":\"f\",\"bp\":\"e\",\"cat\":\"fetch\",\"name\":", o->f);
  put_json_string(o->f, name);
  fprintf(o->f, ",\"id\":%lld,\"ts\":%.3f,\"pid\":%d,\"tid\":%d}", (long long)id, us(o, to->start), PID, to->tid);
}

static int write_flows(struct ferry_db *db, struct out *o, int64_t run_id) {
  static const char kernels_sql[] = "SELECT start, \"end\", streamId, layer, expert FROM CUPTI_ACTIVITY_KIND_KERNEL"
                                    " WHERE runId = ?1 AND layer >= 0 AND \"end\" >= ?2 AND start <= ?3";
  static const char copies_sql[] = "SELECT start, \"end\", streamId, layer, expert FROM CUPTI_ACTIVITY_KIND_MEMCPY"
                                   " WHERE runId = ?1 AND layer >= 0 AND copyKind = 1 AND \"end\" >= ?2 AND start <= ?3";
  static const char reads_sql[] = "SELECT start, \"end\", streamId, layer, expert FROM CUPTI_ACTIVITY_KIND_MEMCPY"
                                  " WHERE runId = ?1 AND layer >= 0 AND copyKind = 100 AND \"end\" >= ?2 AND start <= ?3";
  struct op *k = NULL, *c = NULL, *r = NULL;
  size_t nk = 0, nc = 0, nr = 0;
  int rc = load_ops(db, o, run_id, kernels_sql, &k, &nk);
  if (rc == SQLITE_OK) rc = load_ops(db, o, run_id, copies_sql, &c, &nc);
  if (rc == SQLITE_OK) rc = load_ops(db, o, run_id, reads_sql, &r, &nr);
  char name[64];
  for (size_t i = 0; rc == SQLITE_OK && i < nc; i++) {
    const struct op *to = consumer(k, nk, &c[i]);
    if (!to) continue;
    if (c[i].expert >= 0) snprintf(name, sizeof name, "expert L%d E%d", c[i].layer, c[i].expert);
    else snprintf(name, sizeof name, "weights L%d", c[i].layer);
    flow(o, name, &c[i], to);
  }
  for (size_t i = 0; rc == SQLITE_OK && i < nr; i++) {
    const struct op *to = consumer(c, nc, &r[i]);
    if (!to) continue;
    snprintf(name, sizeof name, "disk read L%d", r[i].layer);
    flow(o, name, &r[i], to);
  }
  ferry_free(k);
  ferry_free(c);
  ferry_free(r);
  return rc;
}

/* --- tracks and the window -------------------------------------------------------------------- */

static int first_timestamp(struct ferry_db *db, int64_t run_id, int64_t *t0) {
  sqlite3_stmt *q;
  int rc = sqlite3_prepare_v2(db->sql,
                              "SELECT min(t) FROM ("
                              " SELECT min(start) t FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE runId=?1"
                              " UNION ALL SELECT min(start) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE runId=?1"
                              " UNION ALL SELECT min(start) FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE runId=?1"
                              " UNION ALL SELECT min(start) FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION WHERE runId=?1"
                              " UNION ALL SELECT min(start) FROM NVTX_EVENTS WHERE runId=?1"
                              " UNION ALL SELECT min(t_ns) FROM memory WHERE runId=?1"
                              " UNION ALL SELECT min(arrival_ns) FROM requests WHERE runId=?1"
                              " UNION ALL SELECT min(start_ns) FROM steps WHERE runId=?1)", -1, &q, NULL);
  if (rc != SQLITE_OK) return rc;
  sqlite3_bind_int64(q, 1, run_id);
  rc = sqlite3_step(q);
  *t0 = rc == SQLITE_ROW ? sqlite3_column_int64(q, 0) : 0; /* NULL (no rows) reads as 0 */
  sqlite3_finalize(q);
  return rc == SQLITE_ROW ? SQLITE_OK : rc;
}

/* A track is named by what runs on it: ferry's queues are compute, H2D, D2H and disk; a CUDA
 * stream (CUPTI, nsys imports) gets the same words and its number. Sorted in that order. */
static int write_thread_names(struct ferry_db *db, struct out *o, int64_t run_id, int native) {
  sqlite3_stmt *q;
  int rc = sqlite3_prepare_v2(db->sql,
                              "SELECT streamId, sum(k), sum(h2d), sum(d2h), sum(disk), sum(other) FROM ("
                              " SELECT streamId, 1 k, 0 h2d, 0 d2h, 0 disk, 0 other FROM CUPTI_ACTIVITY_KIND_KERNEL"
                              "  WHERE runId=?1"
                              " UNION ALL SELECT streamId, 0, copyKind IN (1, 11), copyKind IN (2, 12), copyKind = 100,"
                              "  copyKind NOT IN (1, 2, 11, 12, 100) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE runId=?1"
                              " UNION ALL SELECT streamId, 0, 0, 0, 0, 1 FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE runId=?1"
                              /* a queue's waits do not name it, but a queue of waits alone exists */
                              " UNION ALL SELECT streamId, 0, 0, 0, 0, 0 FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
                              "  WHERE runId=?1) GROUP BY streamId ORDER BY streamId",
                              -1, &q, NULL);
  if (rc != SQLITE_OK) return rc;
  sqlite3_bind_int64(q, 1, run_id);
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    const int64_t s = sqlite3_column_int64(q, 0);
    static const char *const words[5] = {"compute", "H2D", "D2H", "disk", "other"};
    char name[96] = "";
    size_t used = 0;
    int order = 5;
    for (int w = 0; w < 5; w++) {
      if (sqlite3_column_int64(q, 1 + w) <= 0) continue;
      used += (size_t)snprintf(name + used, sizeof name - used, "%s%s", used ? " + " : "", words[w]);
      if (order == 5) order = w;
      if (used >= sizeof name) break;
    }
    if (!name[0]) snprintf(name, sizeof name, "waits");
    if (s < 0) snprintf(name, sizeof name, "host");
    else if (!native || s > 3) {
      char num[40];
      snprintf(num, sizeof num, " (stream %lld)", (long long)s);
      if (strlen(name) + strlen(num) < sizeof name) strcat(name, num);
    }
    meta(o, PID, "thread_name", tid_of(s), "name", name, 0);
    meta(o, PID, "thread_sort_index", tid_of(s), "sort_index", NULL, s < 0 ? 1000001 : order * 100000 + (int)(s % 100000));
  }
  sqlite3_finalize(q);
  return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* The time window of steps [first, last]: from the steps table, or from NVTX ranges "step N" of
 * an import. */
static ferry_status steps_window(struct ferry_db *db, int64_t run_id, int64_t first, int64_t last, int64_t *w0,
                                 int64_t *w1) {
  static const char *const sql_text[2] = {
      "SELECT min(start_ns), max(end_ns), count(*) FROM steps WHERE runId = ?1 AND step >= ?2 AND step <= ?3",
      "SELECT min(n.start), max(n.\"end\"), count(*) FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId"
      " WHERE n.runId = ?1 AND n.step >= ?2 AND n.step <= ?3 AND n.\"end\" IS NOT NULL"
      " AND (coalesce(n.text, s.value) = 'step' OR coalesce(n.text, s.value) GLOB 'step [0-9]*')"};
  for (int i = 0; i < 2; i++) {
    sqlite3_stmt *q;
    int rc = sqlite3_prepare_v2(db->sql, sql_text[i], -1, &q, NULL);
    if (rc != SQLITE_OK) return ferry__db_sqlite_error(db->sql, rc, db->path, "finding the steps", &db->err);
    sqlite3_bind_int64(q, 1, run_id);
    sqlite3_bind_int64(q, 2, first);
    sqlite3_bind_int64(q, 3, last);
    rc = sqlite3_step(q);
    const int64_t count = rc == SQLITE_ROW ? sqlite3_column_int64(q, 2) : 0;
    if (count) {
      *w0 = sqlite3_column_int64(q, 0);
      *w1 = sqlite3_column_int64(q, 1);
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_ROW) return ferry__db_sqlite_error(db->sql, rc, db->path, "finding the steps", &db->err);
    if (count) return FERRY_OK;
  }
  return ferry__err_set(&db->err, FERRY_ERR_NOT_FOUND, "%s: run %lld has no steps %lld to %lld", db->path,
                        (long long)run_id, (long long)first, (long long)(last == INT64_MAX ? -1 : last));
}

void ferry_trace_export_options_init(struct ferry_trace_export_options *opt) {
  memset(opt, 0, sizeof *opt);
  opt->step_first = opt->step_last = -1;
  opt->time_first_s = opt->time_last_s = NAN;
}

ferry_status ferry_db_export_trace(ferry_db *db, int64_t run_id, const char *out_path) {
  struct ferry_trace_export_options opt;
  ferry_trace_export_options_init(&opt);
  return ferry_db_export_trace_window(db, run_id, out_path, &opt);
}

/* The window in ns on the run's clock (t0 known). */
static ferry_status resolve_window(struct ferry_db *db, int64_t run_id, const struct ferry_trace_export_options *opt,
                                   struct out *o) {
  o->w0 = INT64_MIN;
  o->w1 = INT64_MAX;
  if (opt->step_first >= 0 || opt->step_last >= 0) {
    const int64_t first = opt->step_first >= 0 ? opt->step_first : 0;
    const int64_t last = opt->step_last >= 0 ? opt->step_last : INT64_MAX;
    if (last < first)
      return ferry__err_set(&db->err, FERRY_ERR_INVALID, "steps %lld:%lld: the last step is before the first",
                            (long long)first, (long long)last);
    ferry_status st = steps_window(db, run_id, first, last, &o->w0, &o->w1);
    if (st != FERRY_OK) return st;
  }
  if (!isnan(opt->time_first_s)) {
    const int64_t t = o->t0 + ferry__f64_to_i64(opt->time_first_s * 1e9);
    if (t > o->w0) o->w0 = t;
  }
  if (!isnan(opt->time_last_s)) {
    const int64_t t = o->t0 + ferry__f64_to_i64(opt->time_last_s * 1e9);
    if (t < o->w1) o->w1 = t;
  }
  if (o->w1 < o->w0)
    return ferry__err_set(&db->err, FERRY_ERR_INVALID, "the time window ends before it starts");
  return FERRY_OK;
}

ferry_status ferry_db_export_trace_window(ferry_db *db, int64_t run_id, const char *out_path,
                                          const struct ferry_trace_export_options *opt) {
  if (!db || !out_path || !opt) return ferry__fail(FERRY_ERR_INVALID, "ferry_db_export_trace: NULL argument");
  struct ferry_run_summary *run;
  ferry_status st = ferry_db_get_run(db, run_id, &run);
  if (st != FERRY_OK) return st;
  char pname[512];
  snprintf(pname, sizeof pname, "ferry run %lld (%s%s%s)", (long long)run_id, run->kind,
           run->model ? ", " : "", run->model ? run->model : "");
  /* ferry's own executors number their queues 0-3 (compute, H2D, D2H, disk); CUDA streams are
   * CUPTI's or nsys's numbers */
  const int native = strcmp(run->kind, "nsys-import") != 0;
  ferry_db_runs_free(run, 1);

  char *tmp = ferry__asprintf("%s.tmp.%d", out_path, (int)getpid());
  if (!tmp) return ferry__err_set(&db->err, FERRY_ERR_NOMEM, "%s: out of memory", out_path);
  struct out o = {fopen(tmp, "w"), 0, 1, INT64_MIN, INT64_MAX, 0};
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
  if (rc == SQLITE_OK) st = resolve_window(db, run_id, opt, &o);
  if (rc == SQLITE_OK && st == FERRY_OK) {
    fputs("{\"displayTimeUnit\":\"ns\",\"otherData\":{\"runId\":", o.f);
    fprintf(o.f, "%lld,\"t0_ns\":%lld", (long long)run_id, (long long)o.t0);
    if (o.w0 != INT64_MIN) fprintf(o.f, ",\"window_start_ns\":%lld", (long long)o.w0);
    if (o.w1 != INT64_MAX) fprintf(o.f, ",\"window_end_ns\":%lld", (long long)o.w1);
    fputs("},\"traceEvents\":[", o.f);
    meta(&o, PID, "process_name", 0, "name", pname, 0);
    meta(&o, PID, "process_sort_index", 0, "sort_index", NULL, 0);
    meta(&o, REQ_PID, "process_name", 0, "name", "requests", 0);
    meta(&o, REQ_PID, "process_sort_index", 0, "sort_index", NULL, 1);
    meta(&o, PID, "thread_name", NVTX_TID, "name", "NVTX ranges", 0);
    meta(&o, PID, "thread_sort_index", NVTX_TID, "sort_index", NULL, -1);
    rc = write_thread_names(db, &o, run_id, native);
    for (int t = 0; t < T_COUNT && rc == SQLITE_OK; t++) rc = write_table(db, &o, run_id, (enum table)t);
    if (rc == SQLITE_OK) rc = write_flows(db, &o, run_id);
    if (rc == SQLITE_OK) rc = write_nvtx(db, &o, run_id);
    if (rc == SQLITE_OK) rc = write_memory(db, &o, run_id);
    if (rc == SQLITE_OK) rc = write_steps(db, &o, run_id);
    if (rc == SQLITE_OK) rc = write_requests(db, &o, run_id);
  }
  if (rc != SQLITE_OK && st == FERRY_OK) st = ferry__db_sqlite_error(db->sql, rc, db->path, what, &db->err);
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
