/* Fuzz target: a sweep spec (JSON object of run options to lists of values), expanded as
 * `ferry sweep --spec S --db D --dry-run --quiet` expands it: every combination is parsed by
 * the run command's own option parser, its trace (or synthetic spec) loaded and its
 * configuration hashed. The target works in its scratch folder, which holds small traces a
 * spec can name (t.csv, t.jsonl); the study database is created there once. Specs of more
 * than 64 combinations, or with a synthetic trace of more than 1000 requests, are skipped
 * (valid, but slow per input). Invariant: the command returns a defined exit status. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "tests/fuzz/fuzz.h"

static const char azure[] =
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n";
static const char jsonl[] = "{\"arrival_ns\":0,\"prompt_tokens\":12,\"output_tokens\":3}\n";

/* whether expanding the spec stays small: few combinations, small synthetic traces */
static int small_spec(const uint8_t *data, size_t size) {
  cJSON *spec = cJSON_ParseWithLength((const char *)data, size);
  if (!spec) return 1; /* the command reports the parse error itself */
  size_t combos = 1;
  int small = 1;
  const cJSON *it;
  cJSON_ArrayForEach(it, spec) {
    if (cJSON_IsArray(it)) {
      size_t n = (size_t)cJSON_GetArraySize(it);
      combos = n && combos > 64 / n ? 65 : combos * (n ? n : 1);
    }
    if (it->string && !strcmp(it->string, "synthetic")) {
      const cJSON *v;
      if (cJSON_IsString(it) && !fuzz_synthetic_small(it->valuestring, 1000)) small = 0;
      cJSON_ArrayForEach(v, it) if (cJSON_IsString(v) && !fuzz_synthetic_small(v->valuestring, 1000)) small = 0;
    }
  }
  cJSON_Delete(spec);
  return small && combos <= 64;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int ready;
  if (!ready) {
    FUZZ_CHECK(fuzz_write("t.csv", (const uint8_t *)azure, sizeof azure - 1) != NULL);
    FUZZ_CHECK(fuzz_write("t.jsonl", (const uint8_t *)jsonl, sizeof jsonl - 1) != NULL);
    FUZZ_CHECK(chdir(fuzz_dir()) == 0); /* so that "trace": "t.csv" names them */
    ready = 1;
  }
  if (!small_spec(data, size) || !fuzz_write("spec.json", data, size)) return 0;
  char *argv[] = {"sweep", "--spec", "spec.json", "--db", "study.db", "--dry-run", "--quiet", NULL};
  const int rc = cmd_sweep(7, argv);
  FUZZ_CHECK(rc == CLI_OK || rc == CLI_FAIL || rc == CLI_USAGE);
  return 0;
}
