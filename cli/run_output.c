/* What a run writes besides its summary: the result database (run row, requests, steps,
 * timeline through the activity sink, CUPTI's GPU timeline) and --dump-logits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/run_exec.h"
#include "common/alloc.h"
#include "common/error.h"
#include "ferry/provenance.h"

/* One JSON object per row. JSON has no NaN or Infinity: a non-finite logit is null, and the
 * row says how many it has, so the file always parses. */
static void dump_logits(void *user, int64_t req_id, int32_t token_index, const int32_t *tokens, int32_t n_tokens,
                        const float *logits, int64_t vocab) {
  struct logit_dump *d = user;
  FILE *f = d->f;
  int64_t bad = 0;
  for (int64_t i = 0; i < vocab; i++) bad += !isfinite(logits[i]);
  d->nonfinite += (uint64_t)bad;
  fprintf(f, "{\"req_id\":%lld,\"token_index\":%d,\"tokens\":[", (long long)req_id, token_index);
  for (int32_t i = 0; i < n_tokens; i++) fprintf(f, i ? ",%d" : "%d", tokens[i]);
  fprintf(f, "],\"nonfinite\":%lld,\"logits\":[", (long long)bad);
  for (int64_t i = 0; i < vocab; i++) {
    if (i) fputc(',', f);
    if (isfinite(logits[i])) fprintf(f, "%.9g", (double)logits[i]);
    else fputs("null", f);
  }
  if (fputs("]}\n", f) < 0) d->failed = 1;
}

ferry_status run_open_dump(struct run_ctx *c) {
  struct logit_dump *d = &c->dump;
  if (!c->a->dump_logits) return FERRY_OK;
  d->tmp_path = ferry__asprintf("%s.tmp", c->a->dump_logits);
  d->f = d->tmp_path ? fopen(d->tmp_path, "w") : NULL;
  if (!d->f) return ferry__fail(FERRY_ERR_IO, "--dump-logits %s: cannot create the file", c->a->dump_logits);
  c->a->ec.on_logits = dump_logits;
  c->a->ec.logits_user = d;
  return FERRY_OK;
}

/* ok: the run succeeded, so the file is complete and takes its name; else it is removed. */
ferry_status run_close_dump(struct run_ctx *c, int ok) {
  struct logit_dump *d = &c->dump;
  ferry_status st = FERRY_OK;
  if (d->f) {
    const int bad = d->failed || fclose(d->f) != 0;
    d->f = NULL;
    if (ok && (bad || rename(d->tmp_path, c->a->dump_logits) != 0))
      st = ferry__fail(FERRY_ERR_IO, "--dump-logits %s: write failed", c->a->dump_logits);
    else if (ok && d->nonfinite)
      fprintf(stderr, "ferry: --dump-logits %s: %llu non-finite logit(s) (NaN or Inf) written as null\n",
              c->a->dump_logits, (unsigned long long)d->nonfinite);
  }
  if (d->tmp_path && (!ok || st != FERRY_OK)) remove(d->tmp_path);
  ferry_free(d->tmp_path);
  d->tmp_path = NULL;
  return st;
}

/* With CUPTI tracing the GPU, kernels and copies come from CUPTI (CUDA stream ids, real kernel
 * names); from the executor only the engine's ranges and memory samples are kept, so nothing
 * appears twice in the timeline. */
static void ranges_and_memory(void *user, const struct ferry_activity *a) {
  if (a->kind == FERRY_ACT_RANGE || a->kind == FERRY_ACT_MEMORY) ferry_db_activity_sink(user, a);
}

static void meta_u64(struct run_ctx *c, const char *key, uint64_t v) {
  char num[32];
  snprintf(num, sizeof num, "%llu", (unsigned long long)v);
  ferry_db_run_meta(c->db, c->run_id, key, num);
}

static void start_cupti(struct run_ctx *c) {
  const int64_t t0 = ferry_cupti_clock_ns() - ferry_exec_now(c->ex);
  if (ferry_cupti_start(&c->cupti, ferry_db_activity_sink, c->db, t0) != FERRY_OK) {
    fprintf(stderr, "ferry: %s\n", ferry_last_error());
    ferry_db_run_meta(c->db, c->run_id, "CUPTI_STATUS", ferry_last_error());
    return;
  }
  ferry_db_run_meta(c->db, c->run_id, "CUPTI_STATUS", "on");
  ferry_exec_set_sink(c->ex, ranges_and_memory, c->db);
  /* CUPTI's kernels and copies get the layer and expert of the op that issued them */
  ferry_exec_set_launch_hook(c->ex, ferry_cupti_launch_begin, ferry_cupti_launch_end, c->cupti);
}

ferry_status run_db_begin(struct run_ctx *c) {
  const struct run_args *a = c->a;
  if (!c->db) return FERRY_OK;
  char hash[17];
  run_config_hash(c->config_json ? c->config_json : "", hash);
  /* what made the run: build, machine, GPU (docs/schema.md, provenance) */
  struct ferry_provenance prov;
  ferry_provenance_collect(c->ex, &prov);
  struct ferry_run_info info = {.executor = ferry_exec_name(c->ex),
                                .model = a->model,
                                .hardware = a->sim ? a->hw : a->executor,
                                .trace = a->trace ? a->trace : a->synthetic,
                                .config_json = c->config_json,
                                .config_hash = hash,
                                .git_rev = ferry_provenance_value(&prov, "BUILD_GIT_DESCRIBE"),
                                .sweep_key = getenv("FERRY_SWEEP_KEY"), /* set by ferry sweep */
                                .repeat_group = a->group_tag,
                                .repeat_index = a->repeat_index};
  ferry_status st = ferry_db_run_begin(c->db, &info, &c->run_id);
  if (st != FERRY_OK) return st;
  for (size_t i = 0; i < prov.count; i++) ferry_db_run_meta(c->db, c->run_id, prov.items[i].name, prov.items[i].value);
  /* the budgets the run had, defaults included (0: unlimited) */
  meta_u64(c, "DEVICE_BUDGET_BYTES", a->ec.device_budget_bytes);
  meta_u64(c, "HOST_BUDGET_BYTES", a->ec.host_budget_bytes);
  if (a->too_long) meta_u64(c, "REQUESTS_TOO_LONG", (uint64_t)a->too_long);
  if (c->fit_warning[0]) ferry_db_run_meta(c->db, c->run_id, "WEAK_FITS", c->fit_warning);
  ferry_exec_set_sink(c->ex, ferry_db_activity_sink, c->db);
  resil_attach_db(&c->resil, c->db, c->run_id);
  struct ferry_device_info gpu;
  if (ferry_exec_device_info(c->ex, &gpu) == FERRY_OK && (st = ferry_db_add_gpu(c->db, c->run_id, 0, &gpu)) != FERRY_OK)
    return st;
  if (a->profile) start_cupti(c);
  return FERRY_OK;
}

/* Requests and steps on the executor's clock, like the timeline rows. */
/* One engine's requests, steps and layers (a replica's: its times on its own clock from its
 * run's start, written on the first replica's, as the summary counts them; its rows carry
 * its number). */
static ferry_status write_engine(struct run_ctx *c, const ferry_engine *eng, int32_t replica, int64_t base) {
  int64_t n;
  const struct ferry_request_metrics *rm = ferry_engine_request_metrics(eng, &n);
  ferry_status st = FERRY_OK;
  for (int64_t i = 0; i < n && st == FERRY_OK; i++) {
    if (rm[i].rejected) continue;
    struct ferry_request_row r = {.req_id = rm[i].id, .arrival_ns = base + rm[i].arrival_ns,
                                  .first_token_ns = rm[i].first_token_ns < 0 ? -1 : base + rm[i].first_token_ns,
                                  .finish_ns = rm[i].finish_ns < 0 ? -1 : base + rm[i].finish_ns,
                                  .prompt_tokens = rm[i].prompt_tokens, .output_tokens = rm[i].output_tokens,
                                  .replica = replica};
    st = ferry_db_add_request(c->db, c->run_id, &r);
  }
  const struct ferry_step_metrics *sm = ferry_engine_step_metrics(eng, &n);
  for (int64_t i = 0; i < n && st == FERRY_OK; i++) {
    struct ferry_step_row r = {.step = sm[i].step, .start_ns = base + sm[i].start_ns, .end_ns = base + sm[i].end_ns,
                               .batch = sm[i].batch, .tokens = sm[i].tokens, .bytes_disk = sm[i].bytes_disk,
                               .bytes_h2d = sm[i].bytes_h2d, .bytes_d2h = sm[i].bytes_d2h, .hits = sm[i].hits,
                               .misses = sm[i].misses, .stall_ns = sm[i].stall_ns, .kv_tokens = sm[i].kv_tokens,
                               .compute_busy_ns = sm[i].compute_busy_ns, .cpu_busy_ns = sm[i].cpu_busy_ns,
                               .bytes_blocks = sm[i].bytes_blocks, .bytes_experts = sm[i].bytes_experts,
                               .bytes_act = sm[i].bytes_act, .evictions = sm[i].evictions,
                               .cpu_experts = sm[i].cpu_experts, .kv_blocks = sm[i].kv_blocks, .replica = replica,
                               .bytes_disk_write = sm[i].bytes_disk_write, .bytes_peers = sm[i].bytes_peers};
    st = ferry_db_add_step(c->db, c->run_id, &r);
  }
  /* the expert cache and weight traffic per layer (layers with none are left out) */
  const struct ferry_layer_metrics *lm = ferry_engine_layer_metrics(eng, &n);
  for (int64_t i = 0; i < n && st == FERRY_OK; i++) {
    const struct ferry_layer_metrics *l = &lm[i];
    if (!l->hits && !l->misses && !l->evictions && !l->prefetches && !l->cpu_experts && !l->bytes_h2d) continue;
    const struct ferry_layer_row r = {.layer = l->layer, .hits = l->hits, .misses = l->misses, .evictions = l->evictions,
                                      .prefetches = l->prefetches, .cpu_experts = l->cpu_experts, .bytes_h2d = l->bytes_h2d};
    st = ferry_db_add_layer_stats(c->db, c->run_id, &r);
  }
  return st;
}

ferry_status run_db_write_results(struct run_ctx *c, const struct ferry_serve_summary *sum) {
  if (!c->db) return FERRY_OK;
  ferry_status st = write_engine(c, c->eng, 0, sum->run_start_ns);
  for (int32_t i = 1; i < c->n_rep && st == FERRY_OK; i++) st = write_engine(c, c->rep_eng[i], i, sum->run_start_ns);
  if (st == FERRY_OK) st = ferry_db_flush(c->db);
  if (st == FERRY_OK) meta_u64(c, "KV_CAPACITY_TOKENS", (uint64_t)sum->kv_capacity_tokens);
  return st;
}

static void stop_cupti(struct run_ctx *c) {
  struct ferry_cupti_stats cs;
  ferry_exec_set_launch_hook(c->ex, NULL, NULL, NULL);
  const ferry_status st = ferry_cupti_stop(c->cupti, &cs);
  c->cupti = NULL;
  ferry_db_run_add_dropped(c->db, c->run_id, cs.dropped_records + cs.zero_timestamp);
  meta_u64(c, "CUPTI_RECORDS", cs.records);
  meta_u64(c, "CUPTI_DROPPED_RECORDS", cs.dropped_records);
  meta_u64(c, "CUPTI_ZERO_TIMESTAMP_RECORDS", cs.zero_timestamp);
  meta_u64(c, "CUPTI_UNPAIRED_MARKERS", cs.unpaired_markers);
  meta_u64(c, "CUPTI_OWN_RANGES", cs.own_ranges);
  meta_u64(c, "CUPTI_POOL_EXHAUSTED", cs.pool_exhausted);
  meta_u64(c, "CUPTI_ATTRIBUTED_RECORDS", cs.attributed);
  if (st != FERRY_OK) ferry_db_run_meta(c->db, c->run_id, "CUPTI_STOP", ferry_last_error());
}

ferry_status run_db_finish(struct run_ctx *c, int ok) {
  if (!c->db || c->run_id < 0) return FERRY_OK;
  /* the run's error, before draining and CUPTI overwrite the last one */
  char error[FERRY_ERRMSG_MAX];
  snprintf(error, sizeof error, "%s", ok ? "" : ferry_last_error());
  if (c->ex) ferry_exec_drain(c->ex);
  if (c->cupti) stop_cupti(c);
  ferry_exec_set_sink(c->ex, NULL, NULL);
  /* events and I/O counters of every run that started, failed ones included */
  resil_stop(&c->resil);
  c->resil.eng = c->eng;
  const ferry_status rst = resil_write(&c->resil, c->db, c->run_id);
  const int write_failed = rst != FERRY_OK && ok; /* the run's own failure comes first */
  if (write_failed) snprintf(error, sizeof error, "%s", ferry_last_error());
  const ferry_status st = ferry_db_run_finish(c->db, c->run_id, ok && !write_failed ? NULL : error);
  c->a->run_id_out = c->run_id;
  if (st != FERRY_OK) return st;
  if (write_failed) return ferry__fail(rst, "%s", error);
  if (ok && c->a->progress) fprintf(stderr, "ferry: wrote run %lld to %s\n", (long long)c->run_id, c->a->db);
  return FERRY_OK;
}
