/* The write path of the result database: the thread-safe activity sink (a mutex-protected
 * append to an in-memory batch, names interned into StringIds through a hash map) and the
 * flush that writes a whole batch in one transaction with prepared statements. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "profiler/db_internal.h"
#include "profiler/schema.h"

/* nsys enum values used when mapping activities (see docs/schema.md). */
enum {
  NSYS_MEM_KIND_PINNED = 1,
  NSYS_MEM_KIND_DEVICE = 2,
  NSYS_MEM_KIND_UNKNOWN = 7,
  FERRY_MEM_KIND_DISK = 100,
  NSYS_SYNC_EVENT = 1,
  NSYS_EVENT_PUSH_POP_RANGE = 59,
};

static const char *const tier_names[FERRY_TIER_COUNT] = {"device", "host", "disk"};

/* Each row statement is "INSERT INTO table(cols) VALUES tuple"; in the tuple, $k stands for
 * the row's k-th parameter, so the same text yields single-row and multi-row statements. */
static const struct {
  const char *head;
  const char *tuple;
  int nparams;
} row_sql[STMT_COUNT] = {
    [STMT_KERNEL] = {"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL(runId,start,end,streamId,correlationId,globalPid,"
                     "demangledName,shortName,mangledName,launchType,bytes,flops,step,layer,expert) VALUES",
                     "($1,$2,$3,$4,$5,$6,$7,$13,$7,1,$8,$9,$10,$11,$12)", 13},
    /* Kernels from a CUDA trace also carry device, launch configuration and mangled name. */
    [STMT_KERNEL_CUDA] = {"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL(runId,start,end,streamId,correlationId,globalPid,"
                          "demangledName,shortName,mangledName,launchType,bytes,flops,step,layer,expert,deviceId,"
                          "contextId,registersPerThread,gridX,gridY,gridZ,blockX,blockY,blockZ,staticSharedMemory,"
                          "dynamicSharedMemory) VALUES",
                          "($1,$2,$3,$4,$5,$6,$7,$13,$25,1,$8,$9,$10,$11,$12,$14,$15,$16,$17,$18,$19,$20,$21,$22,"
                          "$23,$24)", 25},
    [STMT_MEMCPY] = {"INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY(runId,start,end,streamId,correlationId,globalPid,"
                     "bytes,copyKind,srcKind,dstKind,step,layer,expert,nameId,deviceId,contextId) VALUES",
                     "($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16)", 16},
    [STMT_MEMSET] = {"INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET(runId,start,end,streamId,correlationId,globalPid,"
                     "bytes,memKind,step,layer,expert,nameId,deviceId,contextId,value) VALUES",
                     "($1,$2,$3,$4,$5,$6,$7,$12,$8,$9,$10,$11,$13,$14,$15)", 15},
    [STMT_SYNC] = {"INSERT INTO CUPTI_ACTIVITY_KIND_SYNCHRONIZATION(runId,start,end,streamId,correlationId,"
                   "globalPid,syncType,eventId,nameId,contextId) VALUES",
                   "($1,$2,$3,$4,$5,$6,$8,$9,$7,$10)", 10},
    [STMT_NVTX] = {"INSERT INTO NVTX_EVENTS(runId,start,end,eventType,text,globalTid,step,layer,expert) VALUES",
                   "($1,$2,$3,59,$4,$5,$6,$7,$8)", 8},
    [STMT_RUNTIME] = {"INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME(runId,start,end,globalTid,correlationId,nameId,"
                      "returnValue) VALUES", "($1,$2,$3,$4,$5,$6,$7)", 7},
    [STMT_MEMORY] = {"INSERT INTO memory(runId,t_ns,tier,used_bytes) VALUES", "($1,$2,$3,$4)", 4},
    [STMT_REQUEST] = {"INSERT INTO requests(runId,req_id,arrival_ns,first_token_ns,finish_ns,prompt_tokens,"
                      "output_tokens,replica) VALUES", "($1,$2,$3,$4,$5,$6,$7,$8)", 8},
    [STMT_STEP] = {"INSERT INTO steps(runId,step,start_ns,end_ns,batch,tokens,bytes_disk,bytes_h2d,bytes_d2h,"
                   "hits,misses,stall_ns,kv_tokens,compute_busy_ns,cpu_busy_ns,bytes_blocks,bytes_experts,bytes_act,"
                   "evictions,cpu_experts,kv_blocks,replica,bytes_disk_write,bytes_peers) VALUES",
                   "($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19,$20,$21,$22,$23,$24)", 24},
    [STMT_STR_INSERT] = {"INSERT OR IGNORE INTO StringIds(value) VALUES", "($1)", 1},
    [STMT_STR_LOOKUP] = {"SELECT id FROM StringIds WHERE value=", "$1", 1},
};

/* Build the SQL for `rows` tuples: $k of row r becomes ?(r * nparams + k). */
static char *build_sql(int which, int rows) {
  size_t cap = strlen(row_sql[which].head) + (size_t)rows * (strlen(row_sql[which].tuple) * 3 + 2) + 1;
  char *out = ferry_malloc(cap), *w = out;
  if (!out) return NULL;
  w += sprintf(w, "%s", row_sql[which].head);
  for (int r = 0; r < rows; r++) {
    if (r) *w++ = ',';
    for (const char *p = row_sql[which].tuple; *p;) {
      if (*p == '$') {
        int k = (int)strtol(p + 1, (char **)&p, 10);
        w += sprintf(w, "?%d", r * row_sql[which].nparams + k);
      } else {
        *w++ = *p++;
      }
    }
  }
  *w = '\0';
  return out;
}

/* Prepare the single- and multi-row statements once; caller holds write_mu. */
static ferry_status prepare_all(struct ferry_db *db) {
  for (int i = 0; i < STMT_COUNT; i++) {
    for (int multi = 0; multi < 2; multi++) {
      sqlite3_stmt **slot = multi ? &db->multi[i] : &db->stmt[i];
      if (*slot || (multi && i >= STMT_STR_INSERT)) continue;
      char *text = build_sql(i, multi ? FERRY_DB_MULTI_ROWS : 1);
      if (!text) return ferry__err_set(&db->err, FERRY_ERR_NOMEM, "%s: out of memory", db->path);
      int rc = sqlite3_prepare_v3(db->sql, text, -1, SQLITE_PREPARE_PERSISTENT, slot, NULL);
      ferry_free(text);
      if (rc != SQLITE_OK) return ferry__db_sqlite_error(db->sql, rc, db->path, "preparing a statement", &db->err);
    }
  }
  return FERRY_OK;
}

void *ferry__vec_push(struct ferry__vec *v) {
  if (v->len == v->cap) {
    size_t cap = v->cap ? v->cap * 2 : FERRY_DB_BATCH_ROWS;
    void *p = ferry__reallocarray(v->data, cap, v->elem);
    if (!p) return NULL;
    v->data = p;
    v->cap = cap;
  }
  return (char *)v->data + v->elem * v->len++;
}

void ferry__db_batch_init(struct ferry__batch *b) {
  memset(b, 0, sizeof *b);
  b->acts.elem = sizeof(struct ferry__act_row);
  b->reqs.elem = sizeof(struct ferry__req_row);
  b->steps.elem = sizeof(struct ferry__step_row);
  b->mems.elem = sizeof(struct ferry__mem_row);
}

void ferry__db_batch_free(struct ferry__batch *b) {
  ferry_free(b->acts.data);
  ferry_free(b->reqs.data);
  ferry_free(b->steps.data);
  ferry_free(b->mems.data);
  ferry__db_batch_init(b);
}

static size_t batch_rows(const struct ferry__batch *b) {
  return b->acts.len + b->reqs.len + b->steps.len + b->mems.len;
}

void ferry__db_strings_free(struct ferry_db *db) {
  for (size_t i = 0; i < db->nstrings; i++) ferry_free(ferry__db_str(db, i)->value);
  for (size_t c = 0; c < FERRY_DB_STR_CHUNKS && db->chunks[c]; c++) {
    ferry_free(db->chunks[c]);
    db->chunks[c] = NULL;
  }
  ferry_free(db->slots);
  db->slots = NULL;
  db->nslots = db->nstrings = 0;
}

static uint64_t hash_str(const char *s, size_t *len) {
  uint64_t h = 1469598103934665603ull;
  const char *p = s;
  for (; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  *len = (size_t)(p - s);
  return h;
}

static int rehash(struct ferry_db *db, size_t nslots) {
  uint32_t *slots = ferry__calloc(nslots, sizeof *slots);
  if (!slots) return -1;
  for (size_t i = 0; i < db->nstrings; i++) {
    size_t j = ferry__db_str(db, i)->hash & (nslots - 1);
    while (slots[j]) j = (j + 1) & (nslots - 1);
    slots[j] = (uint32_t)(i + 1);
  }
  ferry_free(db->slots);
  db->slots = slots;
  db->nslots = nslots;
  return 0;
}

/* Local index + 1 of name, adding it if new; 0 on allocation failure. Caller holds batch_mu. */
static uint32_t intern(struct ferry_db *db, const char *name) {
  size_t len;
  uint64_t h = hash_str(name, &len);
  if (db->nslots) {
    size_t j = h & (db->nslots - 1);
    for (uint32_t k; (k = db->slots[j]) != 0; j = (j + 1) & (db->nslots - 1)) {
      struct ferry__str_entry *e = ferry__db_str(db, k - 1);
      if (e->hash == h && !strcmp(e->value, name)) return k;
    }
  }
  size_t index = db->nstrings;
  if (index >= (size_t)FERRY_DB_STR_CHUNK * FERRY_DB_STR_CHUNKS) return 0;
  if ((index + 1) * 2 > db->nslots && rehash(db, db->nslots ? db->nslots * 2 : 256)) return 0;
  size_t c = index / FERRY_DB_STR_CHUNK;
  if (!db->chunks[c] && !(db->chunks[c] = ferry__calloc(FERRY_DB_STR_CHUNK, sizeof(struct ferry__str_entry))))
    return 0;
  char *copy = ferry__strndup(name, len);
  if (!copy) return 0;
  struct ferry__str_entry *e = ferry__db_str(db, index);
  e->value = copy;
  e->hash = h;
  e->db_id = 0;
  db->nstrings = index + 1;
  size_t j = h & (db->nslots - 1);
  while (db->slots[j]) j = (j + 1) & (db->nslots - 1);
  db->slots[j] = (uint32_t)(index + 1);
  return (uint32_t)(index + 1);
}

/* Copy a CUDA trace's details into a pending row. */
static void copy_cuda(struct ferry__act_row *r, const struct ferry_activity *act) {
  const struct ferry_activity_cuda *d = act->cuda;
  r->has_cuda = 1;
  r->device_id = d->device_id;
  r->context_id = d->context_id;
  r->src_kind = (uint8_t)d->src_kind;
  r->dst_kind = (uint8_t)d->dst_kind;
  r->mem_kind = (uint8_t)d->mem_kind;
  r->sync_type = (uint8_t)d->sync_type;
  for (int i = 0; i < 3; i++) {
    r->grid[i] = d->grid[i];
    r->block[i] = d->block[i];
  }
  r->registers = d->registers_per_thread;
  r->static_shared = d->static_shared_bytes;
  r->dynamic_shared = d->dynamic_shared_bytes;
  r->return_value = d->return_value;
  switch (act->kind) {
  case FERRY_ACT_MEMSET: r->aux = d->value; break;
  case FERRY_ACT_SYNC: r->aux = d->event_id; break;
  default: r->aux = d->thread_id; break;
  }
}

void ferry_db_activity_sink(void *user, const struct ferry_activity *act) {
  struct ferry_db *db = user;
  if (!db || !act) return;
  pthread_mutex_lock(&db->batch_mu);
  if (!db->sink_run || db->read_only) {
    db->dropped++;
    pthread_mutex_unlock(&db->batch_mu);
    return;
  }
  uint32_t name = 0;
  if (act->name && act->name[0] && !(name = intern(db, act->name))) goto out_drop;
  uint32_t short_name = 0;
  if (act->kind == FERRY_ACT_KERNEL && act->kind_name && act->kind_name[0] &&
      !(short_name = intern(db, act->kind_name)))
    goto out_drop;
  uint32_t mangled = 0;
  if (act->kind == FERRY_ACT_KERNEL && act->cuda && act->cuda->mangled_name && act->cuda->mangled_name[0] &&
      !(mangled = intern(db, act->cuda->mangled_name)))
    goto out_drop;
  struct ferry__act_row *r = ferry__vec_push(&db->batch.acts);
  if (!r) goto out_drop;
  memset(r, 0, sizeof *r); /* the batch's storage is reused */
  r->run_id = db->sink_run;
  r->start_ns = act->start_ns;
  r->end_ns = act->end_ns;
  r->bytes = act->bytes;
  r->flops = act->flops;
  r->used_bytes = act->used_bytes;
  r->correlation_id = act->correlation_id;
  r->name = name;
  r->short_name = short_name;
  r->queue = act->queue;
  r->step = act->step;
  r->layer = act->layer;
  r->expert = act->expert;
  r->kind = (uint8_t)act->kind;
  r->copy_kind = (int32_t)act->copy_kind;
  r->tier = (uint8_t)act->tier;
  r->mangled = mangled;
  if (act->cuda) copy_cuda(r, act);
  int full = db->batch.acts.len >= FERRY_DB_BATCH_ROWS;
  pthread_mutex_unlock(&db->batch_mu);
  if (full) {
    ferry_status st = ferry__db_flush(db);
    if (st != FERRY_OK) {
      pthread_mutex_lock(&db->batch_mu);
      if (db->deferred == FERRY_OK) {
        db->deferred = st;
        db->deferred_err = db->err;
      }
      pthread_mutex_unlock(&db->batch_mu);
    }
  }
  return;

out_drop:
  db->dropped++;
  pthread_mutex_unlock(&db->batch_mu);
}

/* Bind helpers: -1 (unknown step/layer/expert) and 0 names become NULL. */
static void bind_opt(sqlite3_stmt *st, int i, int32_t v) {
  if (v < 0)
    sqlite3_bind_null(st, i);
  else
    sqlite3_bind_int(st, i, v);
}

static void bind_u64(sqlite3_stmt *st, int i, uint64_t v) {
  sqlite3_bind_int64(st, i, v > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v);
}

static int64_t name_id(struct ferry_db *db, uint32_t name) {
  return name ? ferry__db_str(db, name - 1)->db_id : 0;
}

static void src_dst_kind(int32_t copy_kind, int *src, int *dst) {
  switch (copy_kind) {
  case FERRY_COPY_HTOD: *src = NSYS_MEM_KIND_PINNED; *dst = NSYS_MEM_KIND_DEVICE; break;
  case FERRY_COPY_DTOH: *src = NSYS_MEM_KIND_DEVICE; *dst = NSYS_MEM_KIND_PINNED; break;
  case FERRY_COPY_DTOD:
  case FERRY_COPY_PTOP: *src = NSYS_MEM_KIND_DEVICE; *dst = NSYS_MEM_KIND_DEVICE; break;
  case FERRY_COPY_HTOH: *src = NSYS_MEM_KIND_PINNED; *dst = NSYS_MEM_KIND_PINNED; break;
  case FERRY_COPY_DISK_TO_HOST: *src = FERRY_MEM_KIND_DISK; *dst = NSYS_MEM_KIND_PINNED; break;
  case FERRY_COPY_HOST_TO_DISK: *src = NSYS_MEM_KIND_PINNED; *dst = FERRY_MEM_KIND_DISK; break;
  default: *src = NSYS_MEM_KIND_UNKNOWN; *dst = NSYS_MEM_KIND_UNKNOWN; break;
  }
}

/* Statement a pending activity is written with, or -1 to skip it (unknown kind, bad tier). */
static int act_stmt(const struct ferry__act_row *r) {
  switch (r->kind) {
  case FERRY_ACT_KERNEL: return r->has_cuda ? STMT_KERNEL_CUDA : STMT_KERNEL;
  case FERRY_ACT_MEMCPY: return STMT_MEMCPY;
  case FERRY_ACT_MEMSET: return STMT_MEMSET;
  case FERRY_ACT_SYNC: return STMT_SYNC;
  case FERRY_ACT_RANGE: return STMT_NVTX;
  case FERRY_ACT_RUNTIME: return STMT_RUNTIME;
  case FERRY_ACT_MEMORY: return r->tier < FERRY_TIER_COUNT ? STMT_MEMORY : -1;
  default: return -1; /* a kind from a newer executor */
  }
}

static void bind_name(sqlite3_stmt *st, int i, int64_t nid) {
  if (nid)
    sqlite3_bind_int64(st, i, nid);
  else
    sqlite3_bind_null(st, i);
}

/* Bind one activity's parameters at offset b (parameter k of the row is ?(b + k)). */
static void bind_act(struct ferry_db *db, sqlite3_stmt *st, int b, const void *row) {
  const struct ferry__act_row *r = row;
  int64_t nid = name_id(db, r->name);
  sqlite3_bind_int64(st, b + 1, r->run_id);
  sqlite3_bind_int64(st, b + 2, r->start_ns);
  if (r->kind == FERRY_ACT_MEMORY) {
    sqlite3_bind_text(st, b + 3, tier_names[r->tier], -1, SQLITE_STATIC);
    bind_u64(st, b + 4, r->used_bytes);
    return;
  }
  sqlite3_bind_int64(st, b + 3, r->end_ns);
  /* nsys GlobalId: the thread id in the low 24 bits of the writer's globalPid. */
  int64_t global_tid = db->global_pid | (int64_t)(r->aux & 0xffffff);
  if (r->kind == FERRY_ACT_RUNTIME) {
    sqlite3_bind_int64(st, b + 4, global_tid);
    bind_u64(st, b + 5, r->correlation_id);
    sqlite3_bind_int64(st, b + 6, nid); /* nameId is NOT NULL: 0 when the call has no name */
    sqlite3_bind_int(st, b + 7, r->return_value);
    return;
  }
  if (r->kind == FERRY_ACT_RANGE) {
    if (r->name)
      sqlite3_bind_text(st, b + 4, ferry__db_str(db, r->name - 1)->value, -1, SQLITE_STATIC);
    else
      sqlite3_bind_null(st, b + 4);
    sqlite3_bind_int64(st, b + 5, r->has_cuda ? global_tid : db->global_pid);
    bind_opt(st, b + 6, r->step);
    bind_opt(st, b + 7, r->layer);
    bind_opt(st, b + 8, r->expert);
    return;
  }
  sqlite3_bind_int(st, b + 4, r->queue);
  bind_u64(st, b + 5, r->correlation_id);
  sqlite3_bind_int64(st, b + 6, db->global_pid);
  switch (r->kind) {
  case FERRY_ACT_KERNEL:
    sqlite3_bind_int64(st, b + 7, nid);
    bind_u64(st, b + 8, r->bytes);
    sqlite3_bind_double(st, b + 9, r->flops);
    bind_opt(st, b + 10, r->step);
    bind_opt(st, b + 11, r->layer);
    bind_opt(st, b + 12, r->expert);
    sqlite3_bind_int64(st, b + 13, r->short_name ? name_id(db, r->short_name) : nid);
    if (!r->has_cuda) break;
    sqlite3_bind_int64(st, b + 14, r->device_id);
    sqlite3_bind_int64(st, b + 15, r->context_id);
    sqlite3_bind_int(st, b + 16, r->registers);
    for (int i = 0; i < 3; i++) {
      sqlite3_bind_int(st, b + 17 + i, r->grid[i]);
      sqlite3_bind_int(st, b + 20 + i, r->block[i]);
    }
    sqlite3_bind_int(st, b + 23, r->static_shared);
    sqlite3_bind_int(st, b + 24, r->dynamic_shared);
    sqlite3_bind_int64(st, b + 25, r->mangled ? name_id(db, r->mangled) : nid);
    break;
  case FERRY_ACT_MEMCPY: {
    int src, dst;
    src_dst_kind(r->copy_kind, &src, &dst);
    if (r->has_cuda) { /* the memory kinds CUPTI saw (already in nsys numbering) */
      src = r->src_kind;
      dst = r->dst_kind;
    }
    bind_u64(st, b + 7, r->bytes);
    sqlite3_bind_int(st, b + 8, r->copy_kind);
    sqlite3_bind_int(st, b + 9, src);
    sqlite3_bind_int(st, b + 10, dst);
    bind_opt(st, b + 11, r->step);
    bind_opt(st, b + 12, r->layer);
    bind_opt(st, b + 13, r->expert);
    bind_name(st, b + 14, nid);
    sqlite3_bind_int64(st, b + 15, r->device_id);
    sqlite3_bind_int64(st, b + 16, r->context_id);
    break;
  }
  case FERRY_ACT_MEMSET:
    bind_u64(st, b + 7, r->bytes);
    bind_opt(st, b + 8, r->step);
    bind_opt(st, b + 9, r->layer);
    bind_opt(st, b + 10, r->expert);
    bind_name(st, b + 11, nid);
    sqlite3_bind_int(st, b + 12, r->has_cuda ? r->mem_kind : NSYS_MEM_KIND_DEVICE);
    sqlite3_bind_int64(st, b + 13, r->device_id);
    sqlite3_bind_int64(st, b + 14, r->context_id);
    sqlite3_bind_int64(st, b + 15, r->aux);
    break;
  case FERRY_ACT_SYNC:
    bind_name(st, b + 7, nid);
    sqlite3_bind_int(st, b + 8, r->has_cuda ? r->sync_type : NSYS_SYNC_EVENT);
    bind_u64(st, b + 9, r->has_cuda ? r->aux : r->correlation_id);
    sqlite3_bind_int64(st, b + 10, r->context_id);
    break;
  default:
    break;
  }
}

/* A replica number, NULL when unknown (negative). */
static void bind_replica(sqlite3_stmt *st, int i, int64_t replica) {
  if (replica < 0) sqlite3_bind_null(st, i);
  else sqlite3_bind_int64(st, i, replica);
}

static void bind_req(struct ferry_db *db, sqlite3_stmt *st, int b, const void *row) {
  const struct ferry__req_row *q = row;
  (void)db;
  sqlite3_bind_int64(st, b + 1, q->run_id);
  sqlite3_bind_int64(st, b + 2, q->r.req_id);
  sqlite3_bind_int64(st, b + 3, q->r.arrival_ns);
  sqlite3_bind_int64(st, b + 4, q->r.first_token_ns);
  sqlite3_bind_int64(st, b + 5, q->r.finish_ns);
  sqlite3_bind_int64(st, b + 6, q->r.prompt_tokens);
  sqlite3_bind_int64(st, b + 7, q->r.output_tokens);
  bind_replica(st, b + 8, q->r.replica);
}

static void bind_step(struct ferry_db *db, sqlite3_stmt *st, int b, const void *row) {
  const struct ferry__step_row *s = row;
  (void)db;
  sqlite3_bind_int64(st, b + 1, s->run_id);
  sqlite3_bind_int64(st, b + 2, s->r.step);
  sqlite3_bind_int64(st, b + 3, s->r.start_ns);
  sqlite3_bind_int64(st, b + 4, s->r.end_ns);
  sqlite3_bind_int64(st, b + 5, s->r.batch);
  sqlite3_bind_int64(st, b + 6, s->r.tokens);
  bind_u64(st, b + 7, s->r.bytes_disk);
  bind_u64(st, b + 8, s->r.bytes_h2d);
  bind_u64(st, b + 9, s->r.bytes_d2h);
  sqlite3_bind_int64(st, b + 10, s->r.hits);
  sqlite3_bind_int64(st, b + 11, s->r.misses);
  sqlite3_bind_int64(st, b + 12, s->r.stall_ns);
  sqlite3_bind_int64(st, b + 13, s->r.kv_tokens);
  sqlite3_bind_int64(st, b + 14, s->r.compute_busy_ns);
  sqlite3_bind_int64(st, b + 15, s->r.cpu_busy_ns);
  bind_u64(st, b + 16, s->r.bytes_blocks);
  bind_u64(st, b + 17, s->r.bytes_experts);
  bind_u64(st, b + 18, s->r.bytes_act);
  sqlite3_bind_int64(st, b + 19, s->r.evictions);
  sqlite3_bind_int64(st, b + 20, s->r.cpu_experts);
  sqlite3_bind_int64(st, b + 21, s->r.kv_blocks);
  bind_replica(st, b + 22, s->r.replica);
  bind_u64(st, b + 23, s->r.bytes_disk_write);
  bind_u64(st, b + 24, s->r.bytes_peers);
}

static void bind_mem(struct ferry_db *db, sqlite3_stmt *st, int b, const void *row) {
  const struct ferry__mem_row *m = row;
  (void)db;
  sqlite3_bind_int64(st, b + 1, m->run_id);
  sqlite3_bind_int64(st, b + 2, m->t_ns);
  sqlite3_bind_text(st, b + 3, tier_names[m->tier], -1, SQLITE_STATIC);
  bind_u64(st, b + 4, m->used_bytes);
}

typedef void (*binder_fn)(struct ferry_db *db, sqlite3_stmt *st, int b, const void *row);

static int run_stmt(sqlite3_stmt *st) {
  int rc = sqlite3_step(st);
  sqlite3_reset(st);
  return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* Write the rows of vector v that go to statement `which` (all of them when filter is NULL),
 * FERRY_DB_MULTI_ROWS per statement, the remainder one by one. */
static int write_rows(struct ferry_db *db, const struct ferry__vec *v, int which, binder_fn bind,
                      int (*filter)(const struct ferry__act_row *)) {
  const void *pend[FERRY_DB_MULTI_ROWS];
  int npend = 0, rc, np = row_sql[which].nparams;
  for (size_t i = 0; i < v->len; i++) {
    const void *row = (const char *)v->data + i * v->elem;
    if (filter && filter(row) != which) continue;
    pend[npend++] = row;
    if (npend == FERRY_DB_MULTI_ROWS) {
      for (int r = 0; r < npend; r++) bind(db, db->multi[which], r * np, pend[r]);
      if ((rc = run_stmt(db->multi[which])) != SQLITE_OK) return rc;
      npend = 0;
    }
  }
  for (int r = 0; r < npend; r++) {
    bind(db, db->stmt[which], 0, pend[r]);
    if ((rc = run_stmt(db->stmt[which])) != SQLITE_OK) return rc;
  }
  return SQLITE_OK;
}

/* Give new strings their StringIds.id (inside the open transaction). */
static int write_strings(struct ferry_db *db, size_t upto) {
  sqlite3_stmt *ins = db->stmt[STMT_STR_INSERT], *look = db->stmt[STMT_STR_LOOKUP];
  for (size_t i = db->strings_written; i < upto; i++) {
    struct ferry__str_entry *e = ferry__db_str(db, i);
    sqlite3_bind_text(ins, 1, e->value, -1, SQLITE_STATIC);
    int rc = sqlite3_step(ins);
    sqlite3_reset(ins);
    if (rc != SQLITE_DONE) return rc;
    sqlite3_bind_text(look, 1, e->value, -1, SQLITE_STATIC);
    rc = sqlite3_step(look);
    if (rc == SQLITE_ROW) e->db_id = sqlite3_column_int64(look, 0);
    sqlite3_reset(look);
    if (rc != SQLITE_ROW) return rc == SQLITE_DONE ? SQLITE_INTERNAL : rc;
  }
  return SQLITE_OK;
}

ferry_status ferry__db_flush(struct ferry_db *db) {
  ferry_status st = FERRY_OK;
  pthread_mutex_lock(&db->write_mu);
  pthread_mutex_lock(&db->batch_mu);
  struct ferry__batch work = db->batch;
  db->batch = db->spare;
  size_t nstrings = db->nstrings;
  pthread_mutex_unlock(&db->batch_mu);
  size_t rows = batch_rows(&work);
  if (rows == 0 && nstrings == db->strings_written) goto out_restore;
  /* A batch that cannot be written is dropped and counted, so memory stays bounded. */
  if ((st = prepare_all(db)) != FERRY_OK) goto out_count_dropped;

  const char *what = "writing a batch";
  int rc = sqlite3_exec(db->sql, "BEGIN IMMEDIATE", NULL, NULL, NULL);
  if (rc != SQLITE_OK) goto out_fail;
  if ((rc = write_strings(db, nstrings)) != SQLITE_OK) goto out_rollback;
  what = "writing activity rows";
  static const int act_kinds[] = {STMT_KERNEL,      STMT_KERNEL_CUDA, STMT_MEMCPY, STMT_MEMSET,
                                  STMT_SYNC,        STMT_NVTX,        STMT_RUNTIME, STMT_MEMORY};
  for (size_t k = 0; k < sizeof act_kinds / sizeof act_kinds[0]; k++)
    if ((rc = write_rows(db, &work.acts, act_kinds[k], bind_act, act_stmt)) != SQLITE_OK)
      goto out_rollback;
  what = "writing request rows";
  if ((rc = write_rows(db, &work.reqs, STMT_REQUEST, bind_req, NULL)) != SQLITE_OK) goto out_rollback;
  what = "writing step rows";
  if ((rc = write_rows(db, &work.steps, STMT_STEP, bind_step, NULL)) != SQLITE_OK) goto out_rollback;
  what = "writing memory rows";
  if ((rc = write_rows(db, &work.mems, STMT_MEMORY, bind_mem, NULL)) != SQLITE_OK) goto out_rollback;
  what = "committing a batch";
  if ((rc = sqlite3_exec(db->sql, "COMMIT", NULL, NULL, NULL)) != SQLITE_OK) goto out_rollback;
  db->strings_written = nstrings;
  goto out_restore;

out_rollback:
  st = ferry__db_sqlite_error(db->sql, rc, db->path, what, &db->err);
  sqlite3_exec(db->sql, "ROLLBACK", NULL, NULL, NULL);
  goto out_count_dropped;
out_fail:
  st = ferry__db_sqlite_error(db->sql, rc, db->path, what, &db->err);
out_count_dropped:
  pthread_mutex_lock(&db->batch_mu);
  db->dropped += (int64_t)work.acts.len;
  pthread_mutex_unlock(&db->batch_mu);
out_restore:
  work.acts.len = work.reqs.len = work.steps.len = work.mems.len = 0;
  db->spare = work;
  pthread_mutex_unlock(&db->write_mu);
  return st;
}

ferry_status ferry_db_flush(ferry_db *db) {
  if (!db) return ferry__fail(FERRY_ERR_INVALID, "ferry_db_flush: db is NULL");
  if (db->read_only)
    return ferry__err_set(&db->err, FERRY_ERR_INVALID, "%s: opened read-only", db->path);
  ferry_status st = ferry__db_flush(db);
  pthread_mutex_lock(&db->batch_mu);
  ferry_status deferred = db->deferred;
  struct ferry_err derr = db->deferred_err;
  db->deferred = FERRY_OK;
  pthread_mutex_unlock(&db->batch_mu);
  if (st == FERRY_OK && deferred != FERRY_OK) {
    db->err = derr;
    return ferry__err_copy(&db->err, &derr);
  }
  return st;
}
