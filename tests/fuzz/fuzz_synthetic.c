/* Fuzz target: a --synthetic trace spec ("arrivals=gamma,cv=2,rate=4,n=1000,prompt=...").
 * The target works in its scratch folder, which holds two small traces a spec can resample
 * (r.csv, Azure; r.jsonl, ferry JSONL). Specs asking for more than 10000 requests are skipped
 * (valid up to 1e8, but seconds per input). Invariants of an accepted spec: requests sorted by
 * arrival from 0, lengths non-negative, and the same spec and seed give the same trace. */
#include <stdlib.h>
#include <unistd.h>

#include "ferry/trace.h"
#include "tests/fuzz/fuzz.h"

static const char azure[] =
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
    "2023-11-16 18:15:51.4948830,879,0\n";
static const char jsonl[] =
    "{\"arrival_ns\":0,\"prompt_tokens\":12,\"output_tokens\":3}\n"
    "{\"arrival_ns\":5,\"prompt_tokens\":0,\"output_tokens\":2147483647}\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int ready;
  if (!ready) {
    FUZZ_CHECK(fuzz_write("r.csv", (const uint8_t *)azure, sizeof azure - 1) != NULL);
    FUZZ_CHECK(fuzz_write("r.jsonl", (const uint8_t *)jsonl, sizeof jsonl - 1) != NULL);
    FUZZ_CHECK(chdir(fuzz_dir()) == 0); /* so that "resample:r.csv" names them */
    ready = 1;
  }
  char *spec = fuzz_cstr(data, size);
  if (!spec) return 0;
  ferry_trace *t = NULL, *u = NULL;
  if (fuzz_synthetic_small(spec, 10000) && ferry_trace_synthetic(&t, spec, 7) == FERRY_OK) {
    const size_t n = ferry_trace_count(t);
    FUZZ_CHECK(n >= 1 && n <= 10000);
    FUZZ_CHECK(ferry_trace_request(t, 0)->arrival_ns == 0);
    for (size_t i = 0; i < n; i++) {
      const struct ferry_request *r = ferry_trace_request(t, i);
      FUZZ_CHECK(r->id == (int64_t)i && r->prompt_tokens >= 0 && r->output_tokens >= 0);
      FUZZ_CHECK(i == 0 || r->arrival_ns >= r[-1].arrival_ns);
    }
    FUZZ_CHECK(ferry_trace_synthetic(&u, spec, 7) == FERRY_OK && ferry_trace_count(u) == n);
    for (size_t i = 0; i < n; i++) {
      const struct ferry_request *a = ferry_trace_request(t, i), *b = ferry_trace_request(u, i);
      FUZZ_CHECK(a->arrival_ns == b->arrival_ns && a->prompt_tokens == b->prompt_tokens &&
                 a->output_tokens == b->output_tokens);
    }
  }
  ferry_trace_free(t);
  ferry_trace_free(u);
  free(spec);
  return 0;
}
