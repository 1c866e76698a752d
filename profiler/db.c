/* The result database handle: opening (with the checks that turn a wrong file, a newer schema
 * or an unwritable place into one clear error), run bookkeeping, row appends and the read-side
 * queries behind `ferry db list/show/diff`. The write path proper is in writer.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/checked.h"
#include "common/metrics.h"
#include "common/sqlite_read.h"
#include "profiler/db_internal.h"
#include "profiler/schema.h"

const char *ferry_run_kind_name(enum ferry_run_kind kind) {
  switch (kind) {
  case FERRY_RUN_SIM: return "sim";
  case FERRY_RUN_HOST: return "host";
  case FERRY_RUN_CUDA: return "cuda";
  case FERRY_RUN_NSYS_IMPORT: return "nsys-import";
  }
  return "?";
}

sqlite3 *ferry__db_sqlite(struct ferry_db *db) { return db ? db->sql : NULL; }

/* Explain why a database could not be opened for writing: the file or its folder. */
static ferry_status unwritable(struct ferry_db *db) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", db->path);
  char *slash = strrchr(dir, '/');
  if (slash)
    *(slash == dir ? slash + 1 : slash) = '\0';
  else
    snprintf(dir, sizeof dir, ".");
  if (access(db->path, F_OK) == 0 && access(db->path, W_OK) != 0)
    return ferry__err_set(&db->err, FERRY_ERR_IO, "%s: file is read-only (%s)", db->path, strerror(EACCES));
  if (access(dir, W_OK) != 0)
    return ferry__err_set(&db->err, FERRY_ERR_IO,
                          "%s: cannot write in folder %s (%s); a database needs its folder writable",
                          db->path, dir, strerror(errno));
  return FERRY_OK;
}

/* The file opened for writing: created when missing, refused when it is a folder or SQLite opens
 * it read-only (said as the file's own problem when it is one: unwritable()). */
static ferry_status open_writable(struct ferry_db *db, const char *path) {
  ferry_status st;
  struct stat sb;
  if (stat(path, &sb) != 0) {
    if ((st = unwritable(db)) != FERRY_OK) return st;
  } else if (S_ISDIR(sb.st_mode)) {
    return ferry__err_set(&db->err, FERRY_ERR_IO, "%s: is a folder, expected a database file", path);
  }
  int oflags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX;
  int rc = sqlite3_open_v2(path, &db->sql, oflags, NULL);
  if (rc != SQLITE_OK)
    return unwritable(db) != FERRY_OK ? db->err.status
                                      : ferry__db_sqlite_error(db->sql, rc, path, "cannot open", &db->err);
  sqlite3_extended_result_codes(db->sql, 1);
  sqlite3_busy_timeout(db->sql, 60000); /* sweep workers share one file */
  if (sqlite3_db_readonly(db->sql, "main") == 1) {
    if ((st = unwritable(db)) == FERRY_OK)
      st = ferry__err_set(&db->err, FERRY_ERR_IO, "%s: opened read-only by SQLite; cannot write", path);
    return st;
  }
  return FERRY_OK;
}

/* Reading the header tells a non-SQLite file, another application's database and a newer schema
 * apart before anything is written; *version is the file's schema version (0: new). */
static ferry_status check_header(struct ferry_db *db, const char *path, int *version) {
  int app_id = 0, tables = 0;
  *version = 0;
  /* One statement, so one snapshot: read one by one, another process's migration committing in
   * between would show its tables beside the version 0 read before them. */
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(db->sql,
                              "SELECT (SELECT user_version FROM pragma_user_version()), "
                              "(SELECT application_id FROM pragma_application_id()), "
                              "(SELECT count(*) FROM sqlite_master)",
                              -1, &q, NULL);
  if (rc == SQLITE_OK && (rc = sqlite3_step(q)) == SQLITE_ROW) {
    *version = sqlite3_column_int(q, 0);
    app_id = sqlite3_column_int(q, 1);
    tables = sqlite3_column_int(q, 2);
    rc = SQLITE_OK;
  }
  sqlite3_finalize(q);
  if (rc != SQLITE_OK) {
    if ((rc & 0xff) == SQLITE_NOTADB)
      return ferry__err_set(&db->err, FERRY_ERR_FORMAT, "%s: not a ferry database (not an SQLite file)", path);
    return ferry__db_sqlite_error(db->sql, rc, path, "reading the database header", &db->err);
  }
  if (*version > FERRY_DB_SCHEMA_VERSION)
    return ferry__err_set(&db->err, FERRY_ERR_SCHEMA, "%s: schema version %d is newer than this build's %d; upgrade ferry",
                          path, *version, FERRY_DB_SCHEMA_VERSION);
  if ((*version == 0 && tables > 0) || (*version > 0 && app_id != FERRY_DB_APPLICATION_ID))
    return ferry__err_set(&db->err, FERRY_ERR_FORMAT, "%s: not a ferry database (%s)", path,
                          tables > 0 ? "an SQLite file with other tables" : "empty file");
  return FERRY_OK;
}

/* One try at switching to WAL: SQLITE_OK with *wal set, or SQLite's code. */
static int try_wal(sqlite3 *sql, int *wal) {
  sqlite3_stmt *stj;
  *wal = 0;
  int rc = sqlite3_prepare_v2(sql, "PRAGMA journal_mode=WAL", -1, &stj, NULL);
  if (rc == SQLITE_OK && (rc = sqlite3_step(stj)) == SQLITE_ROW) {
    const char *m = (const char *)sqlite3_column_text(stj, 0);
    *wal = m && !strcmp(m, "wal");
    rc = SQLITE_OK;
  }
  sqlite3_finalize(stj);
  return rc;
}

/* WAL journaling (readers beside one writer), or the reason it cannot be had. Switching a new
 * file needs its exclusive lock, and SQLite answers SQLITE_BUSY at once, without the busy
 * handler, where waiting could deadlock (another process creating or switching the same file:
 * plan and sweep workers open one study database together), so that answer is retried for as
 * long as the busy timeout would have waited. */
static ferry_status enable_wal(struct ferry_db *db, const char *path) {
  enum { RETRY_NS = 10 * 1000 * 1000, RETRIES = 6000 }; /* 60 s, the busy timeout */
  int wal = 0, rc = try_wal(db->sql, &wal);
  for (int i = 0; (rc & 0xff) == SQLITE_BUSY && i < RETRIES; i++) {
    nanosleep(&(struct timespec){.tv_sec = 0, .tv_nsec = RETRY_NS}, NULL);
    rc = try_wal(db->sql, &wal);
  }
  if (rc == SQLITE_OK && wal) return FERRY_OK;
  ferry_status st = unwritable(db);
  if (st == FERRY_OK)
    st = rc != SQLITE_OK ? ferry__db_sqlite_error(db->sql, rc, path, "switching to WAL mode", &db->err)
                         : ferry__err_set(&db->err, FERRY_ERR_IO, "%s: cannot switch to WAL mode", path);
  return st;
}

ferry_status ferry_db_open(ferry_db **out, const char *path, int flags) {
  if (!out || !path || !*path)
    return ferry__fail(FERRY_ERR_INVALID, "ferry_db_open: %s is NULL or empty", out ? "path" : "out");
  *out = NULL;
  if (flags != FERRY_DB_READ_ONLY && flags != FERRY_DB_CREATE)
    return ferry__fail(FERRY_ERR_INVALID, "%s: unknown open flags %d", path, flags);
  struct ferry_db *db = ferry__calloc(1, sizeof *db);
  if (!db) return ferry__fail(FERRY_ERR_NOMEM, "%s: out of memory", path);
  ferry_status st = FERRY_OK;
  db->read_only = flags == FERRY_DB_READ_ONLY;
  db->global_pid = (int64_t)getpid() << 24; /* nsys serialised GlobalId: pid in bits 24..47 */
  ferry__db_batch_init(&db->batch);
  ferry__db_batch_init(&db->spare);
  pthread_mutex_init(&db->write_mu, NULL);
  pthread_mutex_init(&db->batch_mu, NULL);
  if (!(db->path = ferry__strdup(path))) {
    st = ferry__fail(FERRY_ERR_NOMEM, "%s: out of memory", path);
    goto out_free;
  }
  if (db->read_only) {
    /* the readers' one way in, shared with reports/ and calibrate */
    st = ferry__sqlite_open_read(path, FERRY_DB_APPLICATION_ID, FERRY_DB_SCHEMA_VERSION, &db->sql, &db->version,
                                 &db->err);
    if (st != FERRY_OK) goto out_free;
    *out = db;
    return FERRY_OK;
  }
  int version = 0;
  if ((st = open_writable(db, path)) != FERRY_OK || (st = check_header(db, path, &version)) != FERRY_OK ||
      (st = enable_wal(db, path)) != FERRY_OK)
    goto out_free;
  sqlite3_exec(db->sql, "PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=OFF; PRAGMA cache_size=-16384",
               NULL, NULL, NULL);
  if (version < FERRY_DB_SCHEMA_VERSION &&
      (st = ferry__db_migrate(db->sql, path, FERRY_DB_SCHEMA_VERSION, &db->err)) != FERRY_OK)
    goto out_free;
  db->version = FERRY_DB_SCHEMA_VERSION;
  *out = db;
  return FERRY_OK;

out_free:
  ferry__err_copy(NULL, &db->err);
  db->read_only = 1; /* nothing to flush */
  ferry_db_close(db);
  return st;
}

void ferry_db_close(ferry_db *db) {
  if (!db) return;
  if (!db->read_only && db->sql) ferry__db_flush(db);
  for (int i = 0; i < STMT_COUNT; i++) {
    sqlite3_finalize(db->stmt[i]);
    sqlite3_finalize(db->multi[i]);
  }
  if (db->sql) sqlite3_close_v2(db->sql);
  ferry__db_batch_free(&db->batch);
  ferry__db_batch_free(&db->spare);
  ferry__db_strings_free(db);
  pthread_mutex_destroy(&db->write_mu);
  pthread_mutex_destroy(&db->batch_mu);
  ferry_free(db->path);
  ferry_free(db);
}

const char *ferry_db_errmsg(const ferry_db *db) { return db ? db->err.msg : ""; }

static void iso_now(char *buf, size_t len, int64_t *epoch_ns, int local) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  if (local)
    localtime_r(&ts.tv_sec, &tm);
  else
    gmtime_r(&ts.tv_sec, &tm);
  size_t n = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(buf + n, len - n, ".%03ld%s", ts.tv_nsec / 1000000, local ? "" : "Z");
  if (epoch_ns) *epoch_ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static ferry_status check_writable(ferry_db *db, const char *fn) {
  if (!db) return ferry__fail(FERRY_ERR_INVALID, "%s: db is NULL", fn);
  if (db->read_only)
    return ferry__err_set(&db->err, FERRY_ERR_INVALID, "%s: %s: database opened read-only", db->path, fn);
  return FERRY_OK;
}

static void bind_text_or_null(sqlite3_stmt *st, int i, const char *s) {
  if (s)
    sqlite3_bind_text(st, i, s, -1, SQLITE_TRANSIENT);
  else
    sqlite3_bind_null(st, i);
}

static int valid_kind(const char *kind) {
  size_t n = 0;
  for (; kind[n]; n++)
    if (!((kind[n] >= 'a' && kind[n] <= 'z') || (kind[n] >= '0' && kind[n] <= '9') || kind[n] == '-')) return 0;
  return n >= 1 && n <= 15;
}

ferry_status ferry_db_run_begin(ferry_db *db, const struct ferry_run_info *info, int64_t *run_id) {
  ferry_status st = check_writable(db, "ferry_db_run_begin");
  if (st != FERRY_OK) return st;
  if (!info || !run_id)
    return ferry__err_set(&db->err, FERRY_ERR_INVALID, "ferry_db_run_begin: info or run_id is NULL");
  if (!info->executor && (unsigned)info->kind > FERRY_RUN_NSYS_IMPORT)
    return ferry__err_set(&db->err, FERRY_ERR_INVALID, "ferry_db_run_begin: unknown run kind %d", (int)info->kind);
  /* runs.kind is free text (schema 5): any registered executor's name, in the registry's form */
  const char *kind = info->executor ? info->executor : ferry_run_kind_name(info->kind);
  if (!valid_kind(kind))
    return ferry__err_set(&db->err, FERRY_ERR_INVALID,
                          "ferry_db_run_begin: run kind '%.40s' is not an executor name (1-15 of a-z, 0-9, '-')", kind);
  char started[40], local[40], host[256] = "";
  int64_t epoch_ns;
  iso_now(started, sizeof started, &epoch_ns, 0);
  iso_now(local, sizeof local, NULL, 1);
  gethostname(host, sizeof host - 1);

  pthread_mutex_lock(&db->write_mu);
  sqlite3_stmt *ins = NULL;
  const char *what = "inserting the run row";
  int rc = sqlite3_exec(db->sql, "BEGIN IMMEDIATE", NULL, NULL, NULL);
  if (rc != SQLITE_OK) goto out_error;
  rc = sqlite3_prepare_v2(db->sql,
                          "INSERT INTO runs(kind,started_at,complete,model,hardware,trace,config_json,"
                          "config_hash,ferry_version,git_rev,notes,hostname,pid,sweep_key,repeat_group,repeat_index) "
                          "VALUES(?1,?2,0,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15)",
                          -1, &ins, NULL);
  if (rc != SQLITE_OK) goto out_rollback;
  sqlite3_bind_text(ins, 1, kind, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(ins, 2, started, -1, SQLITE_TRANSIENT);
  bind_text_or_null(ins, 3, info->model);
  bind_text_or_null(ins, 4, info->hardware);
  bind_text_or_null(ins, 5, info->trace);
  bind_text_or_null(ins, 6, info->config_json);
  bind_text_or_null(ins, 7, info->config_hash);
  sqlite3_bind_text(ins, 8, FERRY_VERSION, -1, SQLITE_STATIC);
  bind_text_or_null(ins, 9, info->git_rev);
  bind_text_or_null(ins, 10, info->notes);
  bind_text_or_null(ins, 11, host[0] ? host : NULL);
  sqlite3_bind_int64(ins, 12, (int64_t)getpid());
  bind_text_or_null(ins, 13, info->sweep_key && *info->sweep_key ? info->sweep_key : NULL);
  const int grouped = info->repeat_group && *info->repeat_group;
  bind_text_or_null(ins, 14, grouped ? info->repeat_group : NULL);
  if (grouped) sqlite3_bind_int(ins, 15, info->repeat_index);
  else sqlite3_bind_null(ins, 15);
  if ((rc = sqlite3_step(ins)) != SQLITE_DONE) goto out_rollback;
  int64_t id = sqlite3_last_insert_rowid(db->sql);
  sqlite3_finalize(ins);
  ins = NULL;
  what = "recording the session start time";
  rc = sqlite3_prepare_v2(db->sql,
                          "INSERT INTO TARGET_INFO_SESSION_START_TIME(runId,utcEpochNs,utcTime,localTime) "
                          "VALUES(?1,?2,?3,?4)", -1, &ins, NULL);
  if (rc != SQLITE_OK) goto out_rollback;
  sqlite3_bind_int64(ins, 1, id);
  sqlite3_bind_int64(ins, 2, epoch_ns);
  sqlite3_bind_text(ins, 3, started, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(ins, 4, local, -1, SQLITE_TRANSIENT);
  if ((rc = sqlite3_step(ins)) != SQLITE_DONE) goto out_rollback;
  sqlite3_finalize(ins);
  ins = NULL;
  what = "committing the run row";
  if ((rc = sqlite3_exec(db->sql, "COMMIT", NULL, NULL, NULL)) != SQLITE_OK) goto out_rollback;
  pthread_mutex_unlock(&db->write_mu);

  pthread_mutex_lock(&db->batch_mu);
  db->sink_run = id;
  db->dropped = 0;
  pthread_mutex_unlock(&db->batch_mu);
  *run_id = id;
  return FERRY_OK;

out_rollback:
  st = ferry__db_sqlite_error(db->sql, rc, db->path, what, &db->err);
  sqlite3_finalize(ins);
  sqlite3_exec(db->sql, "ROLLBACK", NULL, NULL, NULL);
  pthread_mutex_unlock(&db->write_mu);
  return st;
out_error:
  st = ferry__db_sqlite_error(db->sql, rc, db->path, what, &db->err);
  pthread_mutex_unlock(&db->write_mu);
  return st;
}

ferry_status ferry_db_run_finish(ferry_db *db, int64_t run_id, const char *error) {
  ferry_status st = check_writable(db, "ferry_db_run_finish");
  if (st != FERRY_OK) return st;
  ferry_status flushed = ferry_db_flush(db);
  char finished[40];
  iso_now(finished, sizeof finished, NULL, 0);
  pthread_mutex_lock(&db->batch_mu);
  int64_t dropped = db->dropped;
  if (db->sink_run == run_id) db->sink_run = 0;
  pthread_mutex_unlock(&db->batch_mu);
  /* A failed final flush still marks the run, as failed, so it is not mistaken for complete. */
  char flush_msg[FERRY_ERRMSG_MAX + 32];
  if (flushed != FERRY_OK && !error) {
    snprintf(flush_msg, sizeof flush_msg, "final flush failed: %s", db->err.msg);
    error = flush_msg;
  }

  pthread_mutex_lock(&db->write_mu);
  sqlite3_stmt *up = NULL;
  int rc = sqlite3_prepare_v2(db->sql,
                              "UPDATE runs SET finished_at=?1, complete=?2, error=?3, dropped_records=?4 "
                              "WHERE id=?5", -1, &up, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_bind_text(up, 1, finished, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(up, 2, error ? 0 : 1);
    bind_text_or_null(up, 3, error);
    sqlite3_bind_int64(up, 4, dropped);
    sqlite3_bind_int64(up, 5, run_id);
    rc = sqlite3_step(up);
  }
  sqlite3_finalize(up);
  if (rc == SQLITE_CONSTRAINT_UNIQUE && !error) {
    /* runs_sweep_complete: the combination was finished by another process meanwhile */
    int64_t other = 0;
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(db->sql, "SELECT o.id FROM runs r JOIN runs o ON o.sweep_key = r.sweep_key AND o.complete = 1 "
                           "WHERE r.id = ?1", -1, &q, NULL) == SQLITE_OK) {
      sqlite3_bind_int64(q, 1, run_id);
      if (sqlite3_step(q) == SQLITE_ROW) other = sqlite3_column_int64(q, 0);
    }
    sqlite3_finalize(q);
    char dup[128];
    snprintf(dup, sizeof dup, "duplicate: this sweep combination is already complete in run %lld", (long long)other);
    rc = sqlite3_prepare_v2(db->sql, "UPDATE runs SET finished_at=?1, complete=0, error=?2, dropped_records=?3 WHERE id=?4",
                            -1, &up, NULL);
    if (rc == SQLITE_OK) {
      sqlite3_bind_text(up, 1, finished, -1, SQLITE_TRANSIENT);
      sqlite3_bind_text(up, 2, dup, -1, SQLITE_TRANSIENT);
      sqlite3_bind_int64(up, 3, dropped);
      sqlite3_bind_int64(up, 4, run_id);
      rc = sqlite3_step(up);
    }
    sqlite3_finalize(up);
    if (rc == SQLITE_DONE) {
      st = ferry__err_set(&db->err, FERRY_ERR_EXISTS, "%s: run %lld not recorded complete: %s", db->path,
                          (long long)run_id, dup);
      pthread_mutex_unlock(&db->write_mu);
      return st;
    }
  }
  if (rc != SQLITE_DONE)
    st = ferry__db_sqlite_error(db->sql, rc, db->path, "marking the run finished", &db->err);
  else if (sqlite3_changes(db->sql) == 0)
    st = ferry__err_set(&db->err, FERRY_ERR_NOT_FOUND, "%s: no run %lld", db->path, (long long)run_id);
  pthread_mutex_unlock(&db->write_mu);
  if (st == FERRY_OK && flushed != FERRY_OK) st = flushed;
  return st;
}

ferry_status ferry_db_run_add_dropped(ferry_db *db, int64_t run_id, uint64_t n) {
  ferry_status st = check_writable(db, "ferry_db_run_add_dropped");
  if (st != FERRY_OK || n == 0) return st;
  int64_t add = n > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)n;
  /* The active run's count is written by ferry_db_run_finish(): add to it there. */
  pthread_mutex_lock(&db->batch_mu);
  int active = db->sink_run == run_id;
  if (active) db->dropped = db->dropped > INT64_MAX - add ? INT64_MAX : db->dropped + add;
  pthread_mutex_unlock(&db->batch_mu);
  if (active) return FERRY_OK;
  pthread_mutex_lock(&db->write_mu);
  sqlite3_stmt *up = NULL;
  int rc = sqlite3_prepare_v2(db->sql, "UPDATE runs SET dropped_records = dropped_records + ?1 WHERE id = ?2", -1,
                              &up, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_bind_int64(up, 1, add);
    sqlite3_bind_int64(up, 2, run_id);
    rc = sqlite3_step(up);
  }
  sqlite3_finalize(up);
  if (rc != SQLITE_DONE)
    st = ferry__db_sqlite_error(db->sql, rc, db->path, "adding dropped records", &db->err);
  else if (sqlite3_changes(db->sql) == 0)
    st = ferry__err_set(&db->err, FERRY_ERR_NOT_FOUND, "%s: no run %lld", db->path, (long long)run_id);
  pthread_mutex_unlock(&db->write_mu);
  return st;
}

ferry_status ferry_db_run_meta(ferry_db *db, int64_t run_id, const char *name, const char *value) {
  ferry_status st = check_writable(db, "ferry_db_run_meta");
  if (st != FERRY_OK) return st;
  if (!name || !name[0]) return ferry__err_set(&db->err, FERRY_ERR_INVALID, "ferry_db_run_meta: empty name");
  pthread_mutex_lock(&db->write_mu);
  sqlite3_stmt *ins = NULL;
  int rc = sqlite3_prepare_v2(db->sql,
                              "INSERT INTO META_DATA_EXPORT(runId, name, value) "
                              "SELECT id, ?2, ?3 FROM runs WHERE id = ?1", -1, &ins, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_bind_int64(ins, 1, run_id);
    sqlite3_bind_text(ins, 2, name, -1, SQLITE_TRANSIENT);
    bind_text_or_null(ins, 3, value);
    rc = sqlite3_step(ins);
  }
  sqlite3_finalize(ins);
  if (rc != SQLITE_DONE)
    st = ferry__db_sqlite_error(db->sql, rc, db->path, "writing run metadata", &db->err);
  else if (sqlite3_changes(db->sql) == 0)
    st = ferry__err_set(&db->err, FERRY_ERR_NOT_FOUND, "%s: no run %lld", db->path, (long long)run_id);
  pthread_mutex_unlock(&db->write_mu);
  return st;
}

static void bind_u64_or_null(sqlite3_stmt *st, int i, uint64_t v) {
  if (v) sqlite3_bind_int64(st, i, (sqlite3_int64)(v > INT64_MAX ? INT64_MAX : v));
  else sqlite3_bind_null(st, i);
}

ferry_status ferry_db_add_gpu(ferry_db *db, int64_t run_id, int32_t gpu_id, const struct ferry_device_info *g) {
  ferry_status st = check_writable(db, "ferry_db_add_gpu");
  if (st != FERRY_OK) return st;
  if (!g || gpu_id < 0) return ferry__err_set(&db->err, FERRY_ERR_INVALID, "ferry_db_add_gpu: no device or negative id");
  pthread_mutex_lock(&db->write_mu);
  sqlite3_stmt *ins = NULL;
  int rc = sqlite3_prepare_v2(db->sql,
                              "INSERT INTO TARGET_INFO_GPU(runId, id, name, busLocation, isDiscrete, l2CacheSize, "
                              "totalMemory, memoryBandwidth, clockRate, smCount, uuid, chipName, computeMajor, "
                              "computeMinor) SELECT id, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14 "
                              "FROM runs WHERE id = ?1",
                              -1, &ins, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_bind_int64(ins, 1, run_id);
    sqlite3_bind_int(ins, 2, gpu_id);
    bind_text_or_null(ins, 3, g->name[0] ? g->name : NULL);
    bind_text_or_null(ins, 4, g->bus_location[0] ? g->bus_location : NULL);
    sqlite3_bind_int(ins, 5, g->is_discrete);
    bind_u64_or_null(ins, 6, g->l2_cache_bytes);
    bind_u64_or_null(ins, 7, g->total_memory_bytes);
    bind_u64_or_null(ins, 8, g->memory_bandwidth_bytes_per_s);
    bind_u64_or_null(ins, 9, g->clock_rate_hz);
    bind_u64_or_null(ins, 10, (uint64_t)(g->sm_count > 0 ? g->sm_count : 0));
    bind_text_or_null(ins, 11, g->uuid[0] ? g->uuid : NULL);
    bind_text_or_null(ins, 12, g->chip_name[0] ? g->chip_name : NULL);
    bind_u64_or_null(ins, 13, (uint64_t)(g->compute_major > 0 ? g->compute_major : 0));
    if (g->compute_major > 0) sqlite3_bind_int(ins, 14, g->compute_minor);
    else sqlite3_bind_null(ins, 14);
    rc = sqlite3_step(ins);
  }
  sqlite3_finalize(ins);
  if (rc != SQLITE_DONE)
    st = ferry__db_sqlite_error(db->sql, rc, db->path, "writing the GPU description", &db->err);
  else if (sqlite3_changes(db->sql) == 0)
    st = ferry__err_set(&db->err, FERRY_ERR_NOT_FOUND, "%s: no run %lld", db->path, (long long)run_id);
  pthread_mutex_unlock(&db->write_mu);
  return st;
}

static void column_text(sqlite3_stmt *q, int i, char *out, size_t len) {
  const unsigned char *t = sqlite3_column_text(q, i);
  snprintf(out, len, "%s", t ? (const char *)t : "");
}

static uint64_t column_u64(sqlite3_stmt *q, int i) {
  sqlite3_int64 v = sqlite3_column_int64(q, i);
  return v > 0 ? (uint64_t)v : 0;
}

ferry_status ferry_db_get_gpu(ferry_db *db, int64_t run_id, int32_t gpu_id, struct ferry_device_info *g) {
  if (!db || !g) return ferry__fail(FERRY_ERR_INVALID, "ferry_db_get_gpu: NULL argument");
  memset(g, 0, sizeof *g);
  pthread_mutex_lock(&db->write_mu);
  sqlite3_stmt *q = NULL;
  ferry_status st = FERRY_OK;
  int rc = sqlite3_prepare_v2(db->sql,
                              "SELECT name, busLocation, isDiscrete, l2CacheSize, totalMemory, memoryBandwidth, "
                              "clockRate, smCount, uuid, chipName, computeMajor, computeMinor FROM TARGET_INFO_GPU "
                              "WHERE runId = ?1 AND id = ?2 LIMIT 1",
                              -1, &q, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_bind_int64(q, 1, run_id);
    sqlite3_bind_int(q, 2, gpu_id);
    rc = sqlite3_step(q);
  }
  if (rc == SQLITE_ROW) {
    column_text(q, 0, g->name, sizeof g->name);
    column_text(q, 1, g->bus_location, sizeof g->bus_location);
    g->is_discrete = sqlite3_column_int(q, 2);
    g->l2_cache_bytes = column_u64(q, 3);
    g->total_memory_bytes = column_u64(q, 4);
    g->memory_bandwidth_bytes_per_s = column_u64(q, 5);
    g->clock_rate_hz = column_u64(q, 6);
    g->sm_count = (int32_t)column_u64(q, 7);
    column_text(q, 8, g->uuid, sizeof g->uuid);
    column_text(q, 9, g->chip_name, sizeof g->chip_name);
    g->compute_major = (int32_t)column_u64(q, 10);
    g->compute_minor = (int32_t)column_u64(q, 11);
  } else if (rc == SQLITE_DONE) {
    st = ferry__err_set(&db->err, FERRY_ERR_NOT_FOUND, "%s: run %lld has no GPU %d", db->path, (long long)run_id,
                        gpu_id);
  } else {
    st = ferry__db_sqlite_error(db->sql, rc, db->path, "reading the GPU description", &db->err);
  }
  sqlite3_finalize(q);
  pthread_mutex_unlock(&db->write_mu);
  return st;
}

ferry_status ferry_db_run_meta_list(ferry_db *db, int64_t run_id, const char *prefix, struct ferry_meta_row **rows,
                                    size_t *count) {
  if (!db || !rows || !count) return ferry__fail(FERRY_ERR_INVALID, "ferry_db_run_meta_list: NULL argument");
  *rows = NULL;
  *count = 0;
  pthread_mutex_lock(&db->write_mu);
  sqlite3_stmt *q = NULL;
  struct ferry_meta_row *arr = NULL;
  size_t n = 0, cap = 0;
  ferry_status st = FERRY_OK;
  /* substr, not LIKE: a prefix holding % or _ means itself */
  int rc = sqlite3_prepare_v2(db->sql,
                              "SELECT name, value FROM META_DATA_EXPORT WHERE runId = ?1 AND"
                              " (?2 IS NULL OR substr(name, 1, length(?2)) = ?2) ORDER BY rowid",
                              -1, &q, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_bind_int64(q, 1, run_id);
    if (prefix) sqlite3_bind_text(q, 2, prefix, -1, SQLITE_TRANSIENT);
    else sqlite3_bind_null(q, 2);
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
      if (n == cap) {
        size_t ncap = cap ? cap * 2 : 16;
        struct ferry_meta_row *p2 = ferry__reallocarray(arr, ncap, sizeof *p2);
        if (!p2) {
          st = ferry__err_set(&db->err, FERRY_ERR_NOMEM, "%s: out of memory reading run facts", db->path);
          break;
        }
        arr = p2;
        cap = ncap;
      }
      const unsigned char *name = sqlite3_column_text(q, 0), *value = sqlite3_column_text(q, 1);
      arr[n].name = ferry__strdup(name ? (const char *)name : "");
      arr[n].value = value ? ferry__strdup((const char *)value) : NULL;
      if (!arr[n].name || (value && !arr[n].value)) {
        ferry_free(arr[n].name);
        ferry_free(arr[n].value);
        st = ferry__err_set(&db->err, FERRY_ERR_NOMEM, "%s: out of memory reading run facts", db->path);
        break;
      }
      n++;
    }
  }
  if (st == FERRY_OK && rc != SQLITE_DONE)
    st = ferry__db_sqlite_error(db->sql, rc, db->path, "reading run facts", &db->err);
  sqlite3_finalize(q);
  pthread_mutex_unlock(&db->write_mu);
  if (st != FERRY_OK) {
    ferry_db_meta_free(arr, n);
    return st;
  }
  *rows = arr;
  *count = n;
  return FERRY_OK;
}

void ferry_db_meta_free(struct ferry_meta_row *rows, size_t count) {
  if (!rows) return;
  for (size_t i = 0; i < count; i++) {
    ferry_free(rows[i].name);
    ferry_free(rows[i].value);
  }
  ferry_free(rows);
}

ferry_status ferry_db_add_quant_quality(ferry_db *db, const struct ferry_quant_quality_row *r) {
  ferry_status st = check_writable(db, "ferry_db_add_quant_quality");
  if (st != FERRY_OK) return st;
  if (!r) return ferry__err_set(&db->err, FERRY_ERR_INVALID, "ferry_db_add_quant_quality: NULL row");
  pthread_mutex_lock(&db->write_mu);
  sqlite3_stmt *ins = NULL;
  int rc = sqlite3_prepare_v2(db->sql,
                              "INSERT INTO quant_quality(created_at, model, output, plan, class, format, tensors,"
                              " bytes_before, bytes_after, mean_rel_error, max_rel_error, logits_cosine_mean,"
                              " logits_cosine_min, logits_kl_mean, logits_kl_max, top1_agreement)"
                              " VALUES (strftime('%Y-%m-%dT%H:%M:%fZ','now'), ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10,"
                              " ?11, ?12, ?13, ?14, ?15)",
                              -1, &ins, NULL);
  if (rc == SQLITE_OK) {
    bind_text_or_null(ins, 1, r->model);
    bind_text_or_null(ins, 2, r->output);
    bind_text_or_null(ins, 3, r->plan);
    bind_text_or_null(ins, 4, r->cls);
    bind_text_or_null(ins, 5, r->format);
    sqlite3_bind_int64(ins, 6, r->tensors);
    sqlite3_bind_int64(ins, 7, (sqlite3_int64)r->bytes_before);
    sqlite3_bind_int64(ins, 8, (sqlite3_int64)r->bytes_after);
    const double v[7] = {r->mean_rel_error, r->max_rel_error, r->logits_cosine_mean, r->logits_cosine_min,
                         r->logits_kl_mean, r->logits_kl_max, r->top1_agreement};
    for (int i = 0; i < 7; i++) {
      if (v[i] == v[i]) sqlite3_bind_double(ins, 9 + i, v[i]);
      else sqlite3_bind_null(ins, 9 + i);
    }
    rc = sqlite3_step(ins);
  }
  sqlite3_finalize(ins);
  if (rc != SQLITE_DONE) st = ferry__db_sqlite_error(db->sql, rc, db->path, "writing quantization quality", &db->err);
  pthread_mutex_unlock(&db->write_mu);
  return st;
}

ferry_status ferry_db_add_layer_stats(ferry_db *db, int64_t run_id, const struct ferry_layer_row *r) {
  ferry_status st = check_writable(db, "ferry_db_add_layer_stats");
  if (st != FERRY_OK) return st;
  if (!r) return ferry__err_set(&db->err, FERRY_ERR_INVALID, "ferry_db_add_layer_stats: NULL row");
  pthread_mutex_lock(&db->write_mu);
  sqlite3_stmt *ins = NULL;
  int rc = sqlite3_prepare_v2(db->sql,
                              "INSERT INTO layer_stats(runId, layer, hits, misses, evictions, prefetches, cpu_experts,"
                              " bytes_h2d) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                              -1, &ins, NULL);
  if (rc == SQLITE_OK) {
    const int64_t v[7] = {r->layer, r->hits, r->misses, r->evictions, r->prefetches, r->cpu_experts,
                          (int64_t)(r->bytes_h2d > (uint64_t)INT64_MAX ? (uint64_t)INT64_MAX : r->bytes_h2d)};
    sqlite3_bind_int64(ins, 1, run_id);
    for (int i = 0; i < 7; i++) sqlite3_bind_int64(ins, 2 + i, v[i]);
    rc = sqlite3_step(ins);
  }
  sqlite3_finalize(ins);
  if (rc != SQLITE_DONE) st = ferry__db_sqlite_error(db->sql, rc, db->path, "writing layer statistics", &db->err);
  pthread_mutex_unlock(&db->write_mu);
  return st;
}

/* Append under batch_mu; flush when the batch is full. */
#define ADD_ROW(db, vec, type, fill)                                                    \
  do {                                                                                  \
    pthread_mutex_lock(&(db)->batch_mu);                                                \
    type *slot_ = ferry__vec_push(&(db)->batch.vec);                                    \
    if (slot_) { fill; }                                                                \
    size_t n_ = (db)->batch.acts.len + (db)->batch.reqs.len + (db)->batch.steps.len +   \
                (db)->batch.mems.len;                                                   \
    pthread_mutex_unlock(&(db)->batch_mu);                                              \
    if (!slot_) return ferry__err_set(&(db)->err, FERRY_ERR_NOMEM, "%s: out of memory", \
                                      (db)->path);                                      \
    if (n_ >= FERRY_DB_BATCH_ROWS) return ferry_db_flush(db);                           \
  } while (0)

ferry_status ferry_db_add_request(ferry_db *db, int64_t run_id, const struct ferry_request_row *row) {
  ferry_status st = check_writable(db, "ferry_db_add_request");
  if (st != FERRY_OK) return st;
  if (!row) return ferry__err_set(&db->err, FERRY_ERR_INVALID, "ferry_db_add_request: row is NULL");
  ADD_ROW(db, reqs, struct ferry__req_row, (slot_->run_id = run_id, slot_->r = *row));
  return FERRY_OK;
}

ferry_status ferry_db_add_step(ferry_db *db, int64_t run_id, const struct ferry_step_row *row) {
  ferry_status st = check_writable(db, "ferry_db_add_step");
  if (st != FERRY_OK) return st;
  if (!row) return ferry__err_set(&db->err, FERRY_ERR_INVALID, "ferry_db_add_step: row is NULL");
  ADD_ROW(db, steps, struct ferry__step_row, (slot_->run_id = run_id, slot_->r = *row));
  return FERRY_OK;
}

ferry_status ferry_db_add_memory(ferry_db *db, int64_t run_id, int64_t t_ns, enum ferry_tier tier,
                                 uint64_t used_bytes) {
  ferry_status st = check_writable(db, "ferry_db_add_memory");
  if (st != FERRY_OK) return st;
  if ((unsigned)tier >= FERRY_TIER_COUNT)
    return ferry__err_set(&db->err, FERRY_ERR_INVALID, "ferry_db_add_memory: unknown tier %d", (int)tier);
  ADD_ROW(db, mems, struct ferry__mem_row,
          (slot_->run_id = run_id, slot_->t_ns = t_ns, slot_->tier = (int)tier, slot_->used_bytes = used_bytes));
  return FERRY_OK;
}

ferry_status ferry_db_find_complete_run(ferry_db *db, const char *config_hash, int64_t *run_id) {
  if (!db || !config_hash || !run_id) return ferry__fail(FERRY_ERR_INVALID, "ferry_db_find_complete_run: NULL argument");
  pthread_mutex_lock(&db->write_mu);
  sqlite3_stmt *q = NULL;
  ferry_status st = FERRY_OK;
  int rc = sqlite3_prepare_v2(db->sql,
                              "SELECT id FROM runs WHERE config_hash=?1 AND complete=1 ORDER BY id DESC LIMIT 1",
                              -1, &q, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_bind_text(q, 1, config_hash, -1, SQLITE_TRANSIENT);
    rc = sqlite3_step(q);
  }
  if (rc == SQLITE_ROW)
    *run_id = sqlite3_column_int64(q, 0);
  else if (rc == SQLITE_DONE)
    st = FERRY_ERR_NOT_FOUND;
  else
    st = ferry__db_sqlite_error(db->sql, rc, db->path, "looking up a configuration hash", &db->err);
  sqlite3_finalize(q);
  pthread_mutex_unlock(&db->write_mu);
  return st;
}

static char *col_dup(sqlite3_stmt *q, int i, int *oom) {
  const unsigned char *t = sqlite3_column_text(q, i);
  if (!t) return NULL;
  char *s = ferry__strdup((const char *)t);
  if (!s) *oom = 1;
  return s;
}

/* The runs columns every reader gets; %s: the columns of schema version 5, or NULLs for an
 * older database opened read-only (never migrated). */
static const char run_cols[] =
    "SELECT id, kind, model, hardware, trace, started_at, finished_at, complete, error, config_json,"
    " config_hash, notes, dropped_records, (SELECT count(*) FROM requests r WHERE r.runId = runs.id),"
    " git_rev, ferry_version, %s FROM runs";

static void run_query(const ferry_db *db, const char *where, char *out, size_t len) {
  char cols[sizeof run_cols + 64];
  snprintf(cols, sizeof cols, run_cols, db->version >= 5 ? "repeat_group, repeat_index" : "NULL, NULL");
  snprintf(out, len, "%s %s", cols, where);
}

static ferry_status read_runs(ferry_db *db, const char *sql_text, int64_t only,
                              struct ferry_run_summary **runs, size_t *count) {
  *runs = NULL;
  *count = 0;
  pthread_mutex_lock(&db->write_mu);
  sqlite3_stmt *q = NULL;
  struct ferry_run_summary *arr = NULL;
  size_t n = 0, cap = 0;
  ferry_status st = FERRY_OK;
  int oom = 0;
  int rc = sqlite3_prepare_v2(db->sql, sql_text, -1, &q, NULL);
  if (rc != SQLITE_OK) goto out_sqlite;
  if (only) sqlite3_bind_int64(q, 1, only);
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    if (n == cap) {
      size_t ncap = cap ? cap * 2 : 16;
      struct ferry_run_summary *p = ferry__reallocarray(arr, ncap, sizeof *arr);
      if (!p) {
        oom = 1;
        break;
      }
      arr = p;
      cap = ncap;
    }
    struct ferry_run_summary *r = &arr[n++];
    memset(r, 0, sizeof *r);
    r->id = sqlite3_column_int64(q, 0);
    snprintf(r->kind, sizeof r->kind, "%s", sqlite3_column_text(q, 1) ? (const char *)sqlite3_column_text(q, 1) : "?");
    r->model = col_dup(q, 2, &oom);
    r->hardware = col_dup(q, 3, &oom);
    r->trace = col_dup(q, 4, &oom);
    r->started_at = col_dup(q, 5, &oom);
    r->finished_at = col_dup(q, 6, &oom);
    r->complete = sqlite3_column_int(q, 7);
    r->error = col_dup(q, 8, &oom);
    r->config_json = col_dup(q, 9, &oom);
    r->config_hash = col_dup(q, 10, &oom);
    r->notes = col_dup(q, 11, &oom);
    r->dropped_records = sqlite3_column_int64(q, 12);
    r->requests = sqlite3_column_int64(q, 13);
    r->git_rev = col_dup(q, 14, &oom);
    r->ferry_version = col_dup(q, 15, &oom);
    r->repeat_group = col_dup(q, 16, &oom);
    r->repeat_index = sqlite3_column_int(q, 17);
    if (oom) break;
  }
  if (oom) {
    st = ferry__err_set(&db->err, FERRY_ERR_NOMEM, "%s: out of memory listing runs", db->path);
    goto out_free;
  }
  if (rc != SQLITE_DONE) goto out_sqlite;
  sqlite3_finalize(q);
  pthread_mutex_unlock(&db->write_mu);
  *runs = arr;
  *count = n;
  return FERRY_OK;

out_sqlite:
  st = ferry__db_sqlite_error(db->sql, rc, db->path, "reading runs", &db->err);
out_free:
  sqlite3_finalize(q);
  pthread_mutex_unlock(&db->write_mu);
  ferry_db_runs_free(arr, n);
  return st;
}

ferry_status ferry_db_list_runs(ferry_db *db, struct ferry_run_summary **runs, size_t *count) {
  if (!db || !runs || !count) return ferry__fail(FERRY_ERR_INVALID, "ferry_db_list_runs: NULL argument");
  char sql_text[640];
  run_query(db, "ORDER BY id", sql_text, sizeof sql_text);
  return read_runs(db, sql_text, 0, runs, count);
}

ferry_status ferry_db_get_run(ferry_db *db, int64_t run_id, struct ferry_run_summary **run) {
  if (!db || !run) return ferry__fail(FERRY_ERR_INVALID, "ferry_db_get_run: NULL argument");
  char sql_text[640];
  run_query(db, "WHERE id = ?1", sql_text, sizeof sql_text);
  size_t n;
  ferry_status st = read_runs(db, sql_text, run_id, run, &n);
  if (st == FERRY_OK && n == 0) {
    ferry_db_runs_free(*run, 0);
    *run = NULL;
    return ferry__err_set(&db->err, FERRY_ERR_NOT_FOUND, "%s: no run %lld", db->path, (long long)run_id);
  }
  return st;
}

void ferry_db_runs_free(struct ferry_run_summary *runs, size_t count) {
  if (!runs) return;
  for (size_t i = 0; i < count; i++) {
    struct ferry_run_summary *r = &runs[i];
    ferry_free(r->model);
    ferry_free(r->hardware);
    ferry_free(r->trace);
    ferry_free(r->started_at);
    ferry_free(r->finished_at);
    ferry_free(r->error);
    ferry_free(r->config_json);
    ferry_free(r->config_hash);
    ferry_free(r->notes);
    ferry_free(r->git_rev);
    ferry_free(r->ferry_version);
    ferry_free(r->repeat_group);
  }
  ferry_free(runs);
}

/* --- statistics -------------------------------------------------------------------------- */

/* The percentile of the metrics (common/metrics.h): diff.c takes medians of repeated runs with it. */
double ferry__db_percentile(const double *v, size_t n, double p) { return ferry__percentile(v, n, p); }

/* The metrics are those of the run's own summary and of the report (common/metrics.h). */
static void dist_of(double *v, size_t n, struct ferry_dist *d) {
  struct ferry__dist x;
  ferry__dist_compute(v, n, &x);
  *d = (struct ferry_dist){.count = x.count, .mean = x.mean, .p50 = x.p50, .p90 = x.p90, .p99 = x.p99};
}

/* The SQLite error of reading `what` (before the statement is finalized: its message is the step's). */
static ferry_status stats_sql_fail(ferry_db *db, sqlite3_stmt *q, int rc, const char *what) {
  ferry_status st = ferry__db_sqlite_error(db->sql, rc, db->path, what, &db->err);
  sqlite3_finalize(q);
  return st;
}

/* Requests: their latency distributions, output tokens and throughput. */
static ferry_status stats_requests(ferry_db *db, int64_t run_id, struct ferry_run_stats *stats) {
  const char *what = "reading requests";
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(db->sql,
                              "SELECT arrival_ns, first_token_ns, finish_ns, output_tokens FROM requests "
                              "WHERE runId=?1 AND finish_ns IS NOT NULL AND first_token_ns IS NOT NULL",
                              -1, &q, NULL);
  if (rc != SQLITE_OK) return stats_sql_fail(db, q, rc, what);
  sqlite3_bind_int64(q, 1, run_id);
  double *ttft = NULL, *tpot = NULL, *e2e = NULL;
  size_t n = 0, ntpot = 0, cap = 0;
  int64_t first_arrival = INT64_MAX, last_finish = INT64_MIN;
  ferry_status st = FERRY_OK;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    if (n == cap) {
      cap = cap ? cap * 2 : 1024;
      double *a = ferry__reallocarray(ttft, cap, sizeof *a);
      if (a) ttft = a;
      double *b = ferry__reallocarray(tpot, cap, sizeof *b);
      if (b) tpot = b;
      double *c = ferry__reallocarray(e2e, cap, sizeof *c);
      if (c) e2e = c;
      if (!a || !b || !c) {
        st = ferry__err_set(&db->err, FERRY_ERR_NOMEM, "%s: out of memory reading requests", db->path);
        break;
      }
    }
    /* the database is untrusted: differences as doubles, sums saturating (common/checked.h) */
    int64_t arr = sqlite3_column_int64(q, 0), ft = sqlite3_column_int64(q, 1),
            fin = sqlite3_column_int64(q, 2), out = sqlite3_column_int64(q, 3);
    struct ferry__request_latency lat;
    if (!ferry__request_latency(arr, ft, fin, out, &lat)) continue;
    ttft[n] = lat.ttft_ns;
    e2e[n] = lat.e2e_ns;
    if (lat.has_tpot) tpot[ntpot++] = lat.tpot_ns;
    n++;
    stats->output_tokens = ferry__sat_add_i64(stats->output_tokens, out);
    if (arr < first_arrival) first_arrival = arr;
    if (fin > last_finish) last_finish = fin;
  }
  if (st == FERRY_OK && rc != SQLITE_DONE) {
    st = stats_sql_fail(db, q, rc, what);
    q = NULL;
  }
  sqlite3_finalize(q);
  if (st == FERRY_OK) {
    stats->requests = (int64_t)n;
    dist_of(ttft, n, &stats->ttft_ns);
    dist_of(tpot, ntpot, &stats->tpot_ns);
    dist_of(e2e, n, &stats->e2e_ns);
    if (n) stats->throughput_tok_s = ferry__throughput_tok_s(stats->output_tokens, first_arrival, last_finish);
  }
  ferry_free(ttft);
  ferry_free(tpot);
  ferry_free(e2e);
  return st;
}

/* Peak bytes in use per tier. */
static ferry_status stats_memory(ferry_db *db, int64_t run_id, struct ferry_run_stats *stats) {
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(db->sql, "SELECT tier, max(used_bytes) FROM memory WHERE runId=?1 GROUP BY tier",
                              -1, &q, NULL);
  if (rc != SQLITE_OK) return stats_sql_fail(db, q, rc, "reading memory samples");
  sqlite3_bind_int64(q, 1, run_id);
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    const char *tier = (const char *)sqlite3_column_text(q, 0);
    int64_t peak = sqlite3_column_int64(q, 1);
    int t = !tier ? -1 : !strcmp(tier, "device") ? 0 : !strcmp(tier, "host") ? 1 : !strcmp(tier, "disk") ? 2 : -1;
    if (t >= 0) stats->peak_bytes[t] = peak > 0 ? (uint64_t)peak : 0;
  }
  if (rc != SQLITE_DONE) return stats_sql_fail(db, q, rc, "reading memory samples");
  sqlite3_finalize(q);
  return FERRY_OK;
}

/* Engine steps: their count, bytes moved and stall. */
static ferry_status stats_steps(ferry_db *db, int64_t run_id, struct ferry_run_stats *stats) {
  sqlite3_stmt *q = NULL;
  /* steps.bytes_disk_write came with schema 10 and bytes_peers with 11; an older file opened
   * read-only has neither column: none recorded */
  char sql[256];
  snprintf(sql, sizeof sql,
           "SELECT count(*), total(bytes_disk), total(bytes_h2d), total(bytes_d2h), total(stall_ns), %s, %s "
           "FROM steps WHERE runId=?1",
           db->version >= 10 ? "total(bytes_disk_write)" : "0", db->version >= 11 ? "total(bytes_peers)" : "0");
  int rc = sqlite3_prepare_v2(db->sql, sql, -1, &q, NULL);
  if (rc != SQLITE_OK) return stats_sql_fail(db, q, rc, "reading steps");
  sqlite3_bind_int64(q, 1, run_id);
  if ((rc = sqlite3_step(q)) != SQLITE_ROW) return stats_sql_fail(db, q, rc, "reading steps");
  stats->steps = sqlite3_column_int64(q, 0);
  stats->bytes_disk = ferry__f64_to_u64(sqlite3_column_double(q, 1));
  stats->bytes_h2d = ferry__f64_to_u64(sqlite3_column_double(q, 2));
  stats->bytes_d2h = ferry__f64_to_u64(sqlite3_column_double(q, 3));
  stats->stall_ns = ferry__f64_to_i64(sqlite3_column_double(q, 4));
  stats->bytes_disk_write = ferry__f64_to_u64(sqlite3_column_double(q, 5));
  stats->bytes_peers = ferry__f64_to_u64(sqlite3_column_double(q, 6));
  sqlite3_finalize(q);
  return FERRY_OK;
}

/* No engine steps (an imported nsys run): the bytes its timeline's copies moved. */
static ferry_status stats_copies(ferry_db *db, int64_t run_id, struct ferry_run_stats *stats) {
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(db->sql,
                              "SELECT copyKind, total(bytes), count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE runId=?1"
                              " GROUP BY copyKind", -1, &q, NULL);
  if (rc != SQLITE_OK) return stats_sql_fail(db, q, rc, "reading copies");
  sqlite3_bind_int64(q, 1, run_id);
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    const int64_t kind = sqlite3_column_int64(q, 0);
    const uint64_t bytes = ferry__f64_to_u64(sqlite3_column_double(q, 1));
    uint64_t *to = kind == FERRY_COPY_HTOD || kind == 11   ? &stats->bytes_h2d /* 11: unified memory */
                   : kind == FERRY_COPY_DTOH || kind == 12 ? &stats->bytes_d2h
                   : kind == FERRY_COPY_DISK_TO_HOST       ? &stats->bytes_disk
                                                           : NULL;
    if (!to) continue;
    *to = bytes > UINT64_MAX - *to ? UINT64_MAX : *to + bytes;
    stats->bytes_from_timeline = 1;
  }
  if (rc != SQLITE_DONE) return stats_sql_fail(db, q, rc, "reading copies");
  sqlite3_finalize(q);
  return FERRY_OK;
}

ferry_status ferry_db_run_stats(ferry_db *db, int64_t run_id, struct ferry_run_stats *stats) {
  if (!db || !stats) return ferry__fail(FERRY_ERR_INVALID, "ferry_db_run_stats: NULL argument");
  memset(stats, 0, sizeof *stats);
  struct ferry_run_summary *run;
  ferry_status st = ferry_db_get_run(db, run_id, &run);
  if (st != FERRY_OK) return st;
  ferry_db_runs_free(run, 1);
  pthread_mutex_lock(&db->write_mu);
  if ((st = stats_requests(db, run_id, stats)) == FERRY_OK && (st = stats_memory(db, run_id, stats)) == FERRY_OK &&
      (st = stats_steps(db, run_id, stats)) == FERRY_OK && !stats->steps)
    st = stats_copies(db, run_id, stats);
  pthread_mutex_unlock(&db->write_mu);
  return st;
}
