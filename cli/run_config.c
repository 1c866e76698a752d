/* The canonical configuration of a run: every option that changes what a run measures, as a
 * JSON object with sorted keys (the long option names with underscores), and its hash. `ferry
 * run`/`ferry sim` store both in the result database; `ferry sweep` computes the same hash to
 * skip runs that are already complete. */
#include <stdio.h>
#include <string.h>

#include "cli/run_common.h"
#include "common/alloc.h"
#include "common/json.h"

static void add_str(cJSON *o, const char *k, const char *v) {
  if (v) cJSON_AddStringToObject(o, k, v);
}

char *run_config_json(const struct run_args *a) {
  ferry__json_init();
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  int sim = !strcmp(a->cmd, "sim");
  /* keys in alphabetical order: cJSON keeps insertion order. Keys added since the first
   * sweeps appear only when set, so the hashes of earlier configurations stay the same. */
  if (a->ec.allow_nonfinite) cJSON_AddBoolToObject(o, "allow_nonfinite", 1);
  cJSON_AddBoolToObject(o, "as_fast_as_possible", a->as_fast);
  cJSON_AddNumberToObject(o, "block_layers", a->ec.block_layers);
  cJSON_AddNumberToObject(o, "device_budget", (double)a->ec.device_budget_bytes);
  cJSON_AddBoolToObject(o, "direct_io", (a->ec.read_flags & 1u) != 0);
  add_str(o, "executor", sim ? "sim" : a->backend);
  char cache[32];
  if (a->ec.expert_cache_per_layer) snprintf(cache, sizeof cache, "per-layer:%d", a->ec.expert_cache_per_layer);
  add_str(o, "expert_cache", a->ec.expert_cache_per_layer ? cache : a->ec.expert_cache ? a->ec.expert_cache : "auto");
  add_str(o, "expert_granularity", a->ec.expert_granularity_layer ? "layer" : NULL); /* expert: older hashes */
  if (a->ec.gpu_batches > 1) cJSON_AddNumberToObject(o, "gpu_batches", a->ec.gpu_batches); /* 1: older hashes */
  add_str(o, "faults", a->resil.faults);
  cJSON_AddBoolToObject(o, "greedy", a->ec.greedy);
  add_str(o, "home", a->ec.home_disk ? "disk" : "host");
  cJSON_AddNumberToObject(o, "host_budget", (double)a->ec.host_budget_bytes);
  add_str(o, "host_budget_schedule", a->resil.host_schedule);
  add_str(o, "host_memory", a->host_pageable ? "pageable" : NULL); /* pinned, the default, keeps older hashes */
  add_str(o, "hw", a->hw);
  if (a->resil.io_retries >= 0) cJSON_AddNumberToObject(o, "io_retries", (double)a->resil.io_retries);
  if (a->keep_cache) cJSON_AddBoolToObject(o, "keep_cache", 1); /* only when set: older hashes stay */
  if (a->ec.kv_block_tokens) cJSON_AddNumberToObject(o, "kv_block_tokens", a->ec.kv_block_tokens); /* only when set */
  add_str(o, "kv_dtype", a->kv_dtype);
  add_str(o, "kv_home", a->ec.kv_home_host ? "host" : NULL); /* device, the default, keeps older hashes */
  if (a->ec.kv_pool_bytes) cJSON_AddNumberToObject(o, "kv_pool", (double)a->ec.kv_pool_bytes);
  add_str(o, "kv_preempt", a->ec.kv_preempt_swap ? "swap" : NULL); /* recompute, the default: older hashes */
  cJSON_AddNumberToObject(o, "max_batch", a->ec.max_batch ? a->ec.max_batch : 8);
  cJSON_AddNumberToObject(o, "max_requests", (double)a->trace_opts.max_requests);
  cJSON_AddNumberToObject(o, "max_seq_tokens", a->ec.max_seq_tokens);
  cJSON_AddNumberToObject(o, "max_step_tokens", a->ec.max_step_tokens ? a->ec.max_step_tokens : 256);
  add_str(o, "model", a->model);
  add_str(o, "offload_compute", a->offload_compute[0] ? a->offload_compute : NULL); /* only when given */
  cJSON_AddNumberToObject(o, "pin_first", a->ec.pin_first);
  cJSON_AddNumberToObject(o, "pin_last", a->ec.pin_last);
  cJSON_AddNumberToObject(o, "fill_budget", a->ec.fill_budget);
  add_str(o, "predictor", a->predictor);
  add_str(o, "predictor_model", a->predictor_model);
  add_str(o, "predictor_routing", a->predictor_routing);
  cJSON_AddNumberToObject(o, "prefetch_depth", a->ec.prefetch_depth);
  /* staying up: present only when asked, so earlier configurations keep their hashes */
  if (a->resil.pressure || a->resil.n_schedule) cJSON_AddBoolToObject(o, "pressure", 1);
  if (a->resil.high_water > 0) {
    char marks[64];
    snprintf(marks, sizeof marks, "%g:%g", a->resil.high_water, a->resil.low_water);
    add_str(o, "pressure_marks", marks);
  }
  if (a->resil.pressure_os) cJSON_AddBoolToObject(o, "pressure_os", 1);
  add_str(o, "quant", a->quant);
  cJSON_AddNumberToObject(o, "rate_scale", a->trace_opts.rate_scale);
  add_str(o, "reload_at", a->resil.reload_at_text);
  add_str(o, "resident", a->ec.resident_all ? "all" : a->ec.resident_attention ? "attention" : "none");
  add_str(o, "routing", a->routing);
  add_str(o, "routing_synth", a->routing_synth);
  add_str(o, "runtime", a->runtime);
  cJSON_AddNumberToObject(o, "seed", (double)a->seed);
  cJSON_AddNumberToObject(o, "threads", a->threads);
  cJSON_AddNumberToObject(o, "time_scale", a->time_scale);
  char window[64] = "";
  if (a->trace_opts.window_end_ns > 0)
    snprintf(window, sizeof window, "%.9g:%.9g", (double)a->trace_opts.window_start_ns / 1e9,
             (double)a->trace_opts.window_end_ns / 1e9);
  else if (a->trace_opts.window_start_ns > 0) /* open end ("600:") */
    snprintf(window, sizeof window, "%.9g:", (double)a->trace_opts.window_start_ns / 1e9);
  add_str(o, "time_window", window[0] ? window : NULL);
  add_str(o, "trace", a->trace ? a->trace : a->synthetic);
  if (a->resil.verify_reads) cJSON_AddBoolToObject(o, "verify_reads", 1);
  char *text = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  return text;
}

void run_config_hash(const char *config_json, char out[17]) {
  uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a 64 */
  for (const unsigned char *p = (const unsigned char *)config_json; *p; p++) {
    h ^= *p;
    h *= 0x100000001b3ULL;
  }
  snprintf(out, 17, "%016llx", (unsigned long long)h);
}
