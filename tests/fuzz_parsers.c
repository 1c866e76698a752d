/* libFuzzer target for ferry's text parsers: the first input byte picks the reader, the rest is
 * written to a file of the name that reader expects and opened with it. Readers: the request
 * traces (Azure 2023 CSV, BurstGPT CSV, Mooncake JSONL, ferry JSONL, each forced), routing
 * traces (JSONL), Hugging Face config.json and hardware profiles (JSON). Any crash, leak,
 * sanitizer report or accepted file that breaks a reader's own invariants is a bug. Not part of
 * the gcc build; scripts/fuzz.sh builds it with clang and runs it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ferry/hw.h"
#include "ferry/model.h"
#include "ferry/routing.h"
#include "ferry/trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64];

static int write_input(const char *path, const uint8_t *data, size_t size) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  size_t n = size ? fwrite(data, 1, size, f) : 0;
  return fclose(f) == 0 && n == size ? 0 : -1;
}

static void request_trace(const char *path, enum ferry_trace_format format, int skip_bad) {
  struct ferry_trace_options o = {.format = format, .rate_scale = 1.0, .skip_bad = skip_bad};
  ferry_trace *t = NULL;
  if (ferry_trace_open(&t, path, &o) != FERRY_OK) return;
  const size_t n = ferry_trace_count(t);
  if (n == 0) __builtin_trap(); /* "no requests" is an error, never an empty trace */
  for (size_t i = 0; i < n; i++) {
    const struct ferry_request *r = ferry_trace_request(t, i);
    if (!r || r->arrival_ns < 0 || r->prompt_tokens < 0 || r->output_tokens < 0) __builtin_trap();
  }
  ferry_trace_free(t);
}

static void routing_trace(const char *path) {
  ferry_routing *r = NULL;
  if (ferry_routing_open(&r, path, NULL) != FERRY_OK) return;
  const int32_t L = ferry_routing_n_layers(r), K = ferry_routing_top_k(r), E = ferry_routing_n_experts(r);
  for (size_t i = 0; i < ferry_routing_n_requests(r); i++) {
    struct ferry_routing_request q;
    if (ferry_routing_request_at(r, i, &q) != FERRY_OK) __builtin_trap();
    for (int64_t j = 0; j < (int64_t)q.n_tokens * L * K; j++)
      if (q.ids[j] < -1 || q.ids[j] >= E) __builtin_trap();
  }
  ferry_routing_free(r);
}

static void model_config(const char *path) {
  ferry_model *m = NULL;
  if (ferry_model_open(&m, path) != FERRY_OK) return;
  const struct ferry_model_config *c = ferry_model_get_config(m);
  if (c->n_layers <= 0 || c->hidden <= 0 || ferry_model_tensor_count(m) == 0) __builtin_trap();
  char *json = NULL;
  if (ferry_model_config_json(m, &json) == FERRY_OK) free(json);
  ferry_model_close(m);
}

static void hw_profile(const char *path) {
  ferry_hw *hw = NULL;
  if (ferry_hw_open(&hw, path) != FERRY_OK) return;
  const struct ferry_hw_profile *p = ferry_hw_get(hw);
  /* a part file (just a GPU, a link, ...) is a valid profile too: check what it has */
  if ((p->has_link && !(p->link.h2d_gbps > 0)) || (p->has_gpu && !(p->gpu.mem_bw_gbps > 0))) __builtin_trap();
  if (p->has_disk && !(p->disk.read_gbps > 0)) __builtin_trap();
  ferry_hw_close(hw);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  if (!dir[0]) {
    snprintf(dir, sizeof dir, "/tmp/ferry-fuzz-XXXXXX");
    if (!mkdtemp(dir)) abort();
  }
  static const char *const names[] = {"t.csv", "t.csv", "t.jsonl", "t.jsonl", "r.jsonl", "config.json", "hw.json"};
  const unsigned which = data[0] % (sizeof names / sizeof names[0]);
  const int skip_bad = (data[0] >> 7) & 1;
  char path[128];
  snprintf(path, sizeof path, "%s/%s", dir, names[which]);
  if (write_input(path, data + 1, size - 1) != 0) return 0;
  switch (which) {
    case 0: request_trace(path, FERRY_TRACE_AZURE, skip_bad); break;
    case 1: request_trace(path, FERRY_TRACE_BURSTGPT, skip_bad); break;
    case 2: request_trace(path, FERRY_TRACE_MOONCAKE, skip_bad); break;
    case 3: request_trace(path, FERRY_TRACE_JSONL, skip_bad); break;
    case 4: routing_trace(path); break;
    case 5: model_config(path); break;
    case 6: hw_profile(path); break;
  }
  return 0;
}
