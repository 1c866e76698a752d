/* The ferry_db handle shared by the profiler's files: the SQLite connection, the pending
 * batch the activity sink fills, and the string-interning table. Two mutexes: batch_mu guards
 * the in-memory batch and strings (held for microseconds by the sink), write_mu guards every
 * use of the connection (held for a whole transaction). Order: write_mu before batch_mu. */
#ifndef FERRY_PROFILER_DB_INTERNAL_H
#define FERRY_PROFILER_DB_INTERNAL_H

#include <pthread.h>
#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "ferry/db.h"

/* Rows per transaction for automatic flushes. */
#define FERRY_DB_BATCH_ROWS 4096

/* Rows per multi-row INSERT: amortises SQLite's per-statement cost (about half the time). */
#define FERRY_DB_MULTI_ROWS 64

/* Strings live in fixed-size chunks so their addresses never move while the sink appends. */
#define FERRY_DB_STR_CHUNK 1024
#define FERRY_DB_STR_CHUNKS 4096

struct ferry__str_entry {
  char *value;   /* owned */
  uint64_t hash;
  int64_t db_id; /* StringIds.id once written (valid for index < strings_written) */
};

/* One pending activity: the record with its name replaced by a local string index + 1. */
struct ferry__act_row {
  int64_t run_id;
  int64_t start_ns, end_ns;
  uint64_t bytes;
  double flops;
  uint64_t used_bytes;
  uint64_t correlation_id;
  uint32_t name; /* local string index + 1; 0 = no name */
  uint32_t short_name; /* kernels: kind name (shortName); 0 = same as name */
  int32_t queue, step, layer, expert;
  uint8_t kind, tier;
  int32_t copy_kind;
  /* Details of a CUDA trace (ferry_activity.cuda); all 0 when has_cuda is 0. */
  uint8_t has_cuda, src_kind, dst_kind, mem_kind, sync_type;
  uint32_t mangled; /* kernels: local string index + 1 of the mangled name; 0 = name */
  uint32_t device_id, context_id;
  int32_t grid[3], block[3];
  int32_t registers, static_shared, dynamic_shared;
  uint32_t aux; /* memsets: value; syncs: CUDA event id; runtime calls and ranges: thread id */
  int32_t return_value;
};

struct ferry__req_row {
  int64_t run_id;
  struct ferry_request_row r;
};
struct ferry__step_row {
  int64_t run_id;
  struct ferry_step_row r;
};
struct ferry__mem_row {
  int64_t run_id, t_ns;
  uint64_t used_bytes;
  int tier;
};

/* A growable array of rows of one type. */
struct ferry__vec {
  void *data;
  size_t len, cap, elem;
};

struct ferry__batch {
  struct ferry__vec acts, reqs, steps, mems;
};

enum {
  STMT_KERNEL,
  STMT_KERNEL_CUDA,
  STMT_MEMCPY,
  STMT_MEMSET,
  STMT_SYNC,
  STMT_NVTX,
  STMT_RUNTIME,
  STMT_MEMORY,
  STMT_REQUEST,
  STMT_STEP,
  STMT_STR_INSERT,
  STMT_STR_LOOKUP,
  STMT_COUNT
};

struct ferry_db {
  sqlite3 *sql;
  char *path;
  int read_only;
  int version; /* schema version (PRAGMA user_version): older ones are read, never migrated, read-only */
  struct ferry_err err;
  pthread_mutex_t write_mu;
  pthread_mutex_t batch_mu;
  sqlite3_stmt *stmt[STMT_COUNT];
  sqlite3_stmt *multi[STMT_COUNT]; /* FERRY_DB_MULTI_ROWS rows per INSERT */

  /* guarded by batch_mu */
  struct ferry__batch batch;
  int64_t sink_run;      /* target of the activity sink, 0 = none */
  int64_t dropped;       /* records lost since run_begin */
  ferry_status deferred; /* failure of a sink-triggered flush, reported by the next flush */
  struct ferry_err deferred_err;
  struct ferry__str_entry *chunks[FERRY_DB_STR_CHUNKS];
  size_t nstrings;
  uint32_t *slots; /* open addressing: local index + 1, 0 = empty */
  size_t nslots;   /* power of two */

  /* guarded by write_mu */
  struct ferry__batch spare; /* swapped with batch at flush so the sink keeps appending */
  size_t strings_written;
  int64_t global_pid;
};

static inline struct ferry__str_entry *ferry__db_str(struct ferry_db *db, size_t index) {
  return &db->chunks[index / FERRY_DB_STR_CHUNK][index % FERRY_DB_STR_CHUNK];
}

/* writer.c */
void ferry__db_batch_init(struct ferry__batch *b);
void ferry__db_batch_free(struct ferry__batch *b);
void ferry__db_strings_free(struct ferry_db *db);
/* Write pending rows; caller holds neither mutex. */
ferry_status ferry__db_flush(struct ferry_db *db);
/* Append to a vector (caller holds batch_mu); returns the new slot or NULL. */
void *ferry__vec_push(struct ferry__vec *v);

/* db.c: percentile p (0..100) of n >= 1 sorted values, linear interpolation between closest
 * ranks (ferry_dist's definition); diff.c takes medians of repeated runs with it. */
double ferry__db_percentile(const double *v, size_t n, double p);

/* diff_stats.c: one-sided Mann-Whitney U test that y is stochastically larger than x (exact
 * distribution for small samples, normal approximation with tie correction otherwise), and
 * Cliff's delta P(y > x) - P(y < x). */
double ferry__mann_whitney_greater(const double *x, size_t nx, const double *y, size_t ny);
double ferry__cliffs_delta(const double *x, size_t nx, const double *y, size_t ny);

/* db.c: the sqlite3 handle (tests use it to simulate a full database). */
sqlite3 *ferry__db_sqlite(struct ferry_db *db);

#endif
