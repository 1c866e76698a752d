/* Result-database schema as an ordered list of migrations (PRAGMA user_version counts the
 * steps applied), so databases written by older builds are upgraded in place and databases
 * from newer builds are refused before anything is written. docs/schema.md documents it. */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "ferry/db.h"
#include "profiler/schema.h"

/* Version 1: the whole first schema. Timeline tables copy the names, columns and enum values
 * of Nsight Systems' SQLite export (schema 3.x), with a leading runId column and a few ferry
 * extension columns at the end; no indexes on them, as nsys, so ingest stays fast. */
static const char schema_v1[] =
    "CREATE TABLE runs ("
    " id INTEGER PRIMARY KEY,"
    " kind TEXT NOT NULL CHECK(kind IN ('sim','host','cuda','nsys-import')),"
    " started_at TEXT NOT NULL, finished_at TEXT,"
    " complete INTEGER NOT NULL DEFAULT 0,"
    " model TEXT, hardware TEXT, trace TEXT, config_json TEXT, config_hash TEXT,"
    " ferry_version TEXT, git_rev TEXT, error TEXT, notes TEXT,"
    " dropped_records INTEGER NOT NULL DEFAULT 0, hostname TEXT, pid INTEGER);"
    "CREATE TABLE requests (runId INTEGER NOT NULL REFERENCES runs(id), req_id INTEGER NOT NULL,"
    " arrival_ns INTEGER NOT NULL, first_token_ns INTEGER, finish_ns INTEGER,"
    " prompt_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0);"
    "CREATE TABLE steps (runId INTEGER NOT NULL REFERENCES runs(id), step INTEGER NOT NULL,"
    " start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL, batch INTEGER NOT NULL DEFAULT 0,"
    " tokens INTEGER NOT NULL DEFAULT 0, bytes_disk INTEGER NOT NULL DEFAULT 0,"
    " bytes_h2d INTEGER NOT NULL DEFAULT 0, bytes_d2h INTEGER NOT NULL DEFAULT 0,"
    " hits INTEGER NOT NULL DEFAULT 0, misses INTEGER NOT NULL DEFAULT 0,"
    " stall_ns INTEGER NOT NULL DEFAULT 0);"
    "CREATE TABLE memory (runId INTEGER NOT NULL REFERENCES runs(id), t_ns INTEGER NOT NULL,"
    " tier TEXT NOT NULL CHECK(tier IN ('device','host','disk')), used_bytes INTEGER NOT NULL);"
    /* nsys tables */
    "CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL UNIQUE);"
    "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (runId INTEGER NOT NULL,"
    " start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL DEFAULT 0,"
    " contextId INTEGER NOT NULL DEFAULT 0, greenContextId INTEGER, streamId INTEGER NOT NULL,"
    " correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL,"
    " shortName INTEGER NOT NULL, mangledName INTEGER, launchType INTEGER, cacheConfig INTEGER,"
    " registersPerThread INTEGER NOT NULL DEFAULT 0, gridX INTEGER NOT NULL DEFAULT 0,"
    " gridY INTEGER NOT NULL DEFAULT 0, gridZ INTEGER NOT NULL DEFAULT 0,"
    " blockX INTEGER NOT NULL DEFAULT 0, blockY INTEGER NOT NULL DEFAULT 0,"
    " blockZ INTEGER NOT NULL DEFAULT 0, staticSharedMemory INTEGER NOT NULL DEFAULT 0,"
    " dynamicSharedMemory INTEGER NOT NULL DEFAULT 0, localMemoryPerThread INTEGER NOT NULL DEFAULT 0,"
    " localMemoryTotal INTEGER NOT NULL DEFAULT 0, gridId INTEGER NOT NULL DEFAULT 0,"
    " sharedMemoryExecuted INTEGER, graphNodeId INTEGER, sharedMemoryLimitConfig INTEGER,"
    " bytes INTEGER, flops REAL, step INTEGER, layer INTEGER, expert INTEGER);"
    "CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (runId INTEGER NOT NULL,"
    " start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL DEFAULT 0,"
    " contextId INTEGER NOT NULL DEFAULT 0, greenContextId INTEGER, streamId INTEGER NOT NULL,"
    " correlationId INTEGER, globalPid INTEGER, bytes INTEGER NOT NULL,"
    " copyKind INTEGER NOT NULL, deprecatedSrcId INTEGER, srcKind INTEGER, dstKind INTEGER,"
    " srcDeviceId INTEGER, srcContextId INTEGER, dstDeviceId INTEGER, dstContextId INTEGER,"
    " migrationCause INTEGER, graphNodeId INTEGER, virtualAddress INTEGER,"
    " step INTEGER, layer INTEGER, expert INTEGER, nameId INTEGER);"
    "CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (runId INTEGER NOT NULL,"
    " start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL DEFAULT 0,"
    " contextId INTEGER NOT NULL DEFAULT 0, greenContextId INTEGER, streamId INTEGER NOT NULL,"
    " correlationId INTEGER, globalPid INTEGER, value INTEGER NOT NULL DEFAULT 0,"
    " bytes INTEGER NOT NULL, graphNodeId INTEGER, memKind INTEGER,"
    " step INTEGER, layer INTEGER, expert INTEGER, nameId INTEGER);"
    "CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (runId INTEGER NOT NULL,"
    " start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL DEFAULT 0,"
    " globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL,"
    " returnValue INTEGER NOT NULL DEFAULT 0, callchainId INTEGER);"
    "CREATE TABLE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (runId INTEGER NOT NULL,"
    " start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL DEFAULT 0,"
    " contextId INTEGER NOT NULL DEFAULT 0, greenContextId INTEGER, streamId INTEGER NOT NULL,"
    " correlationId INTEGER, globalPid INTEGER, syncType INTEGER NOT NULL,"
    " eventId INTEGER NOT NULL DEFAULT 0, nameId INTEGER);"
    "CREATE TABLE NVTX_EVENTS (runId INTEGER NOT NULL,"
    " start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER,"
    " category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER,"
    " textId INTEGER, domainId INTEGER, uint64Value INTEGER, int64Value INTEGER,"
    " doubleValue REAL, uint32Value INTEGER, int32Value INTEGER, floatValue REAL,"
    " jsonTextId INTEGER, jsonText TEXT, binaryData TEXT,"
    " step INTEGER, layer INTEGER, expert INTEGER);"
    "CREATE TABLE TARGET_INFO_GPU (runId INTEGER NOT NULL, vmId INTEGER NOT NULL DEFAULT 0,"
    " id INTEGER NOT NULL, name TEXT, busLocation TEXT, isDiscrete INTEGER, l2CacheSize INTEGER,"
    " totalMemory INTEGER, memoryBandwidth INTEGER, clockRate INTEGER, smCount INTEGER,"
    " uuid TEXT, chipName TEXT, computeMajor INTEGER, computeMinor INTEGER);"
    "CREATE TABLE TARGET_INFO_SESSION_START_TIME (runId INTEGER NOT NULL, utcEpochNs INTEGER,"
    " utcTime TEXT, localTime TEXT);"
    "CREATE TABLE META_DATA_EXPORT (runId INTEGER, name TEXT NOT NULL, value TEXT);"
    /* enum tables: (id, name, label) as nsys */
    "CREATE TABLE ENUM_CUDA_MEMCPY_OPER (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT);"
    "INSERT INTO ENUM_CUDA_MEMCPY_OPER VALUES"
    " (0,'CUDA_MEMCPY_KIND_UNKNOWN','Unknown'),(1,'CUDA_MEMCPY_KIND_HTOD','Host-to-Device'),"
    " (2,'CUDA_MEMCPY_KIND_DTOH','Device-to-Host'),(3,'CUDA_MEMCPY_KIND_HTOA','Host-to-Array'),"
    " (4,'CUDA_MEMCPY_KIND_ATOH','Array-to-Host'),(5,'CUDA_MEMCPY_KIND_ATOA','Array-to-Array'),"
    " (6,'CUDA_MEMCPY_KIND_ATOD','Array-to-Device'),(7,'CUDA_MEMCPY_KIND_DTOA','Device-to-Array'),"
    " (8,'CUDA_MEMCPY_KIND_DTOD','Device-to-Device'),(9,'CUDA_MEMCPY_KIND_HTOH','Host-to-Host'),"
    " (10,'CUDA_MEMCPY_KIND_PTOP','Peer-to-Peer'),"
    " (11,'CUDA_MEMCPY_KIND_UVM_HTOD','Unified Host-to-Device'),"
    " (12,'CUDA_MEMCPY_KIND_UVM_DTOH','Unified Device-to-Host'),"
    " (13,'CUDA_MEMCPY_KIND_UVM_DTOD','Unified Device-to-Device'),"
    " (100,'FERRY_MEMCPY_KIND_DISK_TO_HOST','Disk-to-Host');"
    "CREATE TABLE ENUM_CUDA_MEM_KIND (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT);"
    "INSERT INTO ENUM_CUDA_MEM_KIND VALUES"
    " (0,'CUDA_MEMOPR_MEMORY_KIND_PAGEABLE','Pageable'),(1,'CUDA_MEMOPR_MEMORY_KIND_PINNED','Pinned'),"
    " (2,'CUDA_MEMOPR_MEMORY_KIND_DEVICE','Device'),(3,'CUDA_MEMOPR_MEMORY_KIND_ARRAY','Array'),"
    " (4,'CUDA_MEMOPR_MEMORY_KIND_MANAGED','Managed'),"
    " (5,'CUDA_MEMOPR_MEMORY_KIND_DEVICE_STATIC','Device Static'),"
    " (6,'CUDA_MEMOPR_MEMORY_KIND_MANAGED_STATIC','Managed Static'),"
    " (7,'CUDA_MEMOPR_MEMORY_KIND_UNKNOWN','Unknown'),"
    " (100,'FERRY_MEMOPR_MEMORY_KIND_DISK','Disk');"
    "CREATE TABLE ENUM_CUPTI_SYNC_TYPE (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT);"
    "INSERT INTO ENUM_CUPTI_SYNC_TYPE VALUES"
    " (0,'CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_UNKNOWN','Unknown'),"
    " (1,'CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE','Event sync'),"
    " (2,'CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT','Stream wait sync'),"
    " (3,'CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE','Stream sync'),"
    " (4,'CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE','Context sync');"
    "CREATE TABLE ENUM_NSYS_EVENT_TYPE (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT);"
    "INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES"
    " (33,'NvtxCategory','NvtxCategory'),(34,'NvtxMark','NvtxMark'),(39,'NvtxThread','NvtxThread'),"
    " (59,'NvtxPushPopRange','NvtxPushPopRange'),(60,'NvtxStartEndRange','NvtxStartEndRange'),"
    " (75,'NvtxDomainCreate','NvtxDomainCreate'),(76,'NvtxDomainDestroy','NvtxDomainDestroy');"
    "CREATE TABLE ENUM_CUDA_KERNEL_LAUNCH_TYPE (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT);"
    "INSERT INTO ENUM_CUDA_KERNEL_LAUNCH_TYPE VALUES"
    " (0,'CUDA_KERNEL_LAUNCH_TYPE_UNKNOWN','Unknown'),(1,'CUDA_KERNEL_LAUNCH_TYPE_REGULAR','Regular'),"
    " (2,'CUDA_KERNEL_LAUNCH_TYPE_COOPERATIVE_SINGLE_DEVICE','Coop Single Device'),"
    " (3,'CUDA_KERNEL_LAUNCH_TYPE_COOPERATIVE_MULTI_DEVICE','Coop Multi Device');";

/* Version 2: indexes for the per-run queries of list/show/diff and sweep resume. Kept as a
 * separate step so the migration path is exercised by every version-1 database. */
static const char schema_v2[] =
    "CREATE INDEX requests_run ON requests(runId);"
    "CREATE INDEX steps_run ON steps(runId);"
    "CREATE INDEX memory_run ON memory(runId, tier);"
    "CREATE INDEX runs_config_hash ON runs(config_hash, complete);";

/* Version 3: quantization quality (ferry model quantize --report --db), one row per tensor
 * class of a quantized model, with the end-to-end logits agreement of the whole model. */
static const char schema_v3[] =
    "CREATE TABLE quant_quality (id INTEGER PRIMARY KEY, created_at TEXT, model TEXT, output TEXT,"
    " plan TEXT, class TEXT, format TEXT, tensors INTEGER, bytes_before INTEGER, bytes_after INTEGER,"
    " mean_rel_error REAL, max_rel_error REAL, logits_cosine_mean REAL, logits_cosine_min REAL,"
    " logits_kl_mean REAL, logits_kl_max REAL, top1_agreement REAL);";

/* Version 4: a sweep combination is recorded complete at most once, by the database itself
 * (two sweep processes, or a resumed sweep beside orphaned children, cannot both finish one).
 * Keyed by a new column, not config_hash: plain runs of one configuration may repeat (repeats
 * are averaged), and existing rows keep sweep_key NULL, so the step never conflicts with what
 * a database already holds and loses nothing. */
static const char schema_v4[] =
    "ALTER TABLE runs ADD COLUMN sweep_key TEXT;"
    "CREATE UNIQUE INDEX runs_sweep_complete ON runs(sweep_key) WHERE complete = 1 AND sweep_key IS NOT NULL;";

/* Version 5: repeated runs (`ferry run/sim --repeat N`, `--repeat-group TAG`) carry a group
 * tag and their index in it, so `ferry db diff` compares the whole group; an imported file's
 * SHA-256, unique among runs, so importing the same export twice finds the first run; the KV
 * cache's tokens at the end of each step (the report's and the trace's KV use); and the rows an
 * nsys export names its schema with. */
static const char schema_v5[] =
    "ALTER TABLE runs ADD COLUMN repeat_group TEXT;"
    "ALTER TABLE runs ADD COLUMN repeat_index INTEGER;"
    "ALTER TABLE runs ADD COLUMN source_sha256 TEXT;"
    "ALTER TABLE steps ADD COLUMN kv_tokens INTEGER;"
    /* what an nsys export says of itself, for tools that check before reading: the timeline
     * tables follow nsys's export schema 3 (docs/schema.md); database-level rows, runId NULL */
    "DELETE FROM META_DATA_EXPORT WHERE runId IS NULL AND name IN ('EXPORT_SCHEMA_VERSION', 'EXPORT_PRODUCT');"
    "INSERT INTO META_DATA_EXPORT(runId, name, value) VALUES (NULL, 'EXPORT_SCHEMA_VERSION', '3'),"
    " (NULL, 'EXPORT_PRODUCT', 'ferry');"
    "CREATE INDEX runs_repeat_group ON runs(repeat_group) WHERE repeat_group IS NOT NULL;"
    "CREATE UNIQUE INDEX runs_source ON runs(source_sha256) WHERE source_sha256 IS NOT NULL;";

/* Version 6: what kept a run up, on its executor's clock: memory-pressure transitions (the tier,
 * its index and the action taken), weight reloads (staged, refused, applied), I/O retries and
 * permanent failures, device failures, requests refused under pressure. A new table only: every
 * existing row stays as it is. */
static const char schema_v6[] =
    "CREATE TABLE engine_events (runId INTEGER NOT NULL REFERENCES runs(id), t_ns INTEGER NOT NULL,"
    " kind TEXT NOT NULL CHECK(kind IN ('pressure','reload','io','device','refused')),"
    " tier TEXT CHECK(tier IS NULL OR tier IN ('device','host','disk')), pressure_index REAL,"
    " level INTEGER, action TEXT NOT NULL, detail TEXT, budget_bytes INTEGER);"
    "CREATE INDEX engine_events_run ON engine_events(runId, t_ns);";

/* Version 7: what each offloading strategy did (issue 14): per step the CPU's busy time beside
 * the device's, the bytes moved by class (layer blocks, experts, activations between the device
 * and the CPU), expert-cache evictions, experts computed on the CPU and KV blocks in use; per
 * layer its expert-cache hits, misses, evictions, prefetches, CPU experts and weight bytes. */
static const char schema_v7[] =
    "ALTER TABLE steps ADD COLUMN compute_busy_ns INTEGER;"
    "ALTER TABLE steps ADD COLUMN cpu_busy_ns INTEGER;"
    "ALTER TABLE steps ADD COLUMN bytes_blocks INTEGER;"
    "ALTER TABLE steps ADD COLUMN bytes_experts INTEGER;"
    "ALTER TABLE steps ADD COLUMN bytes_act INTEGER;"
    "ALTER TABLE steps ADD COLUMN evictions INTEGER;"
    "ALTER TABLE steps ADD COLUMN cpu_experts INTEGER;"
    "ALTER TABLE steps ADD COLUMN kv_blocks INTEGER;"
    "CREATE TABLE layer_stats (runId INTEGER NOT NULL, layer INTEGER NOT NULL, hits INTEGER, misses INTEGER,"
    " evictions INTEGER, prefetches INTEGER, cpu_experts INTEGER, bytes_h2d INTEGER, PRIMARY KEY (runId, layer));";
/* Version 8: runs.kind is free text, an executor's registry name (any executor registered, not
 * the three built in) or "nsys-import": the writer checks the name, the schema its form. SQLite
 * cannot drop a CHECK constraint, so the table is rebuilt as its documentation prescribes
 * (create the new one, copy every row, drop the old, rename; foreign keys are off), with the
 * same columns in the same order and its four indexes. */
static const char schema_v8[] =
    "CREATE TABLE runs_v8 ("
    " id INTEGER PRIMARY KEY,"
    " kind TEXT NOT NULL CHECK(length(kind) BETWEEN 1 AND 15),"
    " started_at TEXT NOT NULL, finished_at TEXT,"
    " complete INTEGER NOT NULL DEFAULT 0,"
    " model TEXT, hardware TEXT, trace TEXT, config_json TEXT, config_hash TEXT,"
    " ferry_version TEXT, git_rev TEXT, error TEXT, notes TEXT,"
    " dropped_records INTEGER NOT NULL DEFAULT 0, hostname TEXT, pid INTEGER, sweep_key TEXT,"
    " repeat_group TEXT, repeat_index INTEGER, source_sha256 TEXT);"
    "INSERT INTO runs_v8 (id, kind, started_at, finished_at, complete, model, hardware, trace, config_json,"
    " config_hash, ferry_version, git_rev, error, notes, dropped_records, hostname, pid, sweep_key, repeat_group,"
    " repeat_index, source_sha256)"
    " SELECT id, kind, started_at, finished_at, complete, model, hardware, trace, config_json,"
    " config_hash, ferry_version, git_rev, error, notes, dropped_records, hostname, pid, sweep_key, repeat_group,"
    " repeat_index, source_sha256 FROM runs;"
    "DROP TABLE runs;"
    "ALTER TABLE runs_v8 RENAME TO runs;"
    "CREATE INDEX runs_config_hash ON runs(config_hash, complete);"
    "CREATE UNIQUE INDEX runs_sweep_complete ON runs(sweep_key) WHERE complete = 1 AND sweep_key IS NOT NULL;"
    "CREATE INDEX runs_repeat_group ON runs(repeat_group) WHERE repeat_group IS NOT NULL;"
    "CREATE UNIQUE INDEX runs_source ON runs(source_sha256) WHERE source_sha256 IS NOT NULL;";

/* Version 9: which replica (engine) served each request and ran each step of a data-parallel
 * run (ferry run|sim --replicas R), so per-replica figures are SQL; older rows keep NULL. */
static const char schema_v9[] =
    "ALTER TABLE requests ADD COLUMN replica INTEGER;"
    "ALTER TABLE steps ADD COLUMN replica INTEGER;";

/* Version 10: the bytes each step wrote to disk (the new KV rows of a cache homed there, --kv-home
 * disk), which the step metrics and the run summary count and the steps table lost; older rows
 * keep NULL (not recorded). */
static const char schema_v10[] = "ALTER TABLE steps ADD COLUMN bytes_disk_write INTEGER;";

/* Version 11: the bytes of streamed blocks each step received from its data-parallel peers
 * (ZeRO-3's partitioned fetch, --zero-gpus N), which the step metrics count apart from bytes_h2d
 * and the steps table lost; older rows keep NULL (not recorded). */
static const char schema_v11[] = "ALTER TABLE steps ADD COLUMN bytes_peers INTEGER;";

static const struct ferry__migration migrations[] = {
    {1, "initial schema (runs, requests, steps, memory, nsys timeline tables)", schema_v1},
    {2, "per-run indexes", schema_v2},
    {3, "quantization quality table", schema_v3},
    {4, "one complete run per sweep combination (runs.sweep_key, unique index)", schema_v4},
    {5, "repeat groups (runs.repeat_group, repeat_index), imported files' hashes (runs.source_sha256), "
        "KV use per step (steps.kv_tokens)", schema_v5},
    {6, "engine events: memory pressure, reloads, I/O retries, device failures", schema_v6},
    {7, "strategy metrics per step (CPU time, bytes by class, evictions, CPU experts, KV blocks) and per layer "
        "(layer_stats)", schema_v7},
    {8, "runs.kind is any executor's registry name (the table rebuilt without its CHECK of three names)", schema_v8},
    {9, "the replica that served each request and ran each step (requests.replica, steps.replica)", schema_v9},
    {10, "bytes each step wrote to disk (steps.bytes_disk_write)", schema_v10},
    {11, "bytes of streamed blocks each step received from data-parallel peers (steps.bytes_peers)", schema_v11},
};

_Static_assert(sizeof migrations / sizeof migrations[0] == FERRY_DB_SCHEMA_VERSION,
               "FERRY_DB_SCHEMA_VERSION must equal the number of migration steps");

const struct ferry__migration *ferry__db_migrations(int *count) {
  *count = (int)(sizeof migrations / sizeof migrations[0]);
  return migrations;
}

ferry_status ferry__db_sqlite_error(sqlite3 *sql, int rc, const char *path, const char *what,
                                    struct ferry_err *err) {
  const char *msg = sql ? sqlite3_errmsg(sql) : sqlite3_errstr(rc);
  switch (rc & 0xff) {
  case SQLITE_FULL:
    return ferry__err_set(err, FERRY_ERR_NO_SPACE, "%s: %s: database or disk is full (%s)", path,
                          what, msg);
  case SQLITE_NOTADB:
    return ferry__err_set(err, FERRY_ERR_FORMAT, "%s: not a ferry database (not an SQLite file)",
                          path);
  case SQLITE_CORRUPT:
    return ferry__err_set(err, FERRY_ERR_FORMAT, "%s: %s: database is corrupt (%s)", path, what,
                          msg);
  case SQLITE_READONLY:
  case SQLITE_CANTOPEN:
  case SQLITE_PERM:
  case SQLITE_IOERR:
    return ferry__err_set(err, FERRY_ERR_IO, "%s: %s: %s", path, what, msg);
  case SQLITE_BUSY:
  case SQLITE_LOCKED:
    return ferry__err_set(err, FERRY_ERR_BUSY, "%s: %s: %s", path, what, msg);
  case SQLITE_NOMEM:
    return ferry__err_set(err, FERRY_ERR_NOMEM, "%s: %s: out of memory", path, what);
  default:
    return ferry__err_set(err, FERRY_ERR_DB, "%s: %s: %s (sqlite code %d)", path, what, msg, rc);
  }
}

static int read_int_pragma(sqlite3 *sql, const char *pragma, int *out) {
  sqlite3_stmt *st;
  int rc = sqlite3_prepare_v2(sql, pragma, -1, &st, NULL);
  if (rc != SQLITE_OK) return rc;
  rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    *out = sqlite3_column_int(st, 0);
    rc = SQLITE_OK;
  }
  sqlite3_finalize(st);
  return rc;
}

ferry_status ferry__db_migrate(sqlite3 *sql, const char *path, int target, struct ferry_err *err) {
  int count;
  const struct ferry__migration *steps = ferry__db_migrations(&count);
  if (target < 0 || target > count)
    return ferry__err_set(err, FERRY_ERR_INVALID, "%s: no schema version %d", path, target);
  int rc = sqlite3_exec(sql, "BEGIN IMMEDIATE", NULL, NULL, NULL);
  if (rc != SQLITE_OK) return ferry__db_sqlite_error(sql, rc, path, "starting the schema migration", err);
  ferry_status st = FERRY_OK;
  int version = 0, app_id = 0, tables = 0;
  /* Read again inside the write transaction: another process may have migrated meanwhile. */
  if ((rc = read_int_pragma(sql, "PRAGMA user_version", &version)) != SQLITE_OK ||
      (rc = read_int_pragma(sql, "PRAGMA application_id", &app_id)) != SQLITE_OK ||
      (rc = read_int_pragma(sql, "SELECT count(*) FROM sqlite_master", &tables)) != SQLITE_OK) {
    st = ferry__db_sqlite_error(sql, rc, path, "reading the schema version", err);
    goto out_rollback;
  }
  if (version > count) {
    st = ferry__err_set(err, FERRY_ERR_SCHEMA,
                        "%s: schema version %d is newer than this build's %d; upgrade ferry", path,
                        version, count);
    goto out_rollback;
  }
  if ((version == 0 && tables > 0) || (version > 0 && app_id != FERRY_DB_APPLICATION_ID)) {
    st = ferry__err_set(err, FERRY_ERR_FORMAT,
                        "%s: not a ferry database (an SQLite file with other tables)", path);
    goto out_rollback;
  }
  for (int i = version; i < target; i++) {
    rc = sqlite3_exec(sql, steps[i].sql, NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
      char what[160];
      snprintf(what, sizeof what, "schema migration to version %d (%s)", steps[i].version, steps[i].what);
      st = ferry__db_sqlite_error(sql, rc, path, what, err);
      goto out_rollback;
    }
  }
  if (target > version) {
    char pragma[96];
    snprintf(pragma, sizeof pragma, "PRAGMA application_id=%d; PRAGMA user_version=%d",
             FERRY_DB_APPLICATION_ID, target);
    rc = sqlite3_exec(sql, pragma, NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
      st = ferry__db_sqlite_error(sql, rc, path, "setting the schema version", err);
      goto out_rollback;
    }
  }
  rc = sqlite3_exec(sql, "COMMIT", NULL, NULL, NULL);
  if (rc != SQLITE_OK) {
    st = ferry__db_sqlite_error(sql, rc, path, "committing the schema migration", err);
    goto out_rollback;
  }
  return FERRY_OK;

out_rollback:
  sqlite3_exec(sql, "ROLLBACK", NULL, NULL, NULL);
  return st;
}
