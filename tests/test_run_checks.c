/* `ferry run` and `ferry sim` refuse what they cannot honour: sizes under one byte, times that
 * do not fit the nanosecond clock, requests longer than the model's positions, routing traces of
 * another shape and options that would be accepted and then ignored. Each case runs the real
 * command and checks its exit status and the message it prints. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "ferry/store.h"
#include "testutil.h"

static char *tmp;
static char dense[600]; /* a generated tiny-dense model folder, for `ferry run` */

static int setup(void **state) {
  (void)state;
  tmp = tu_mkdtemp("runchecks");
  snprintf(dense, sizeof dense, "%s/dense", tmp);
  char args[800];
  snprintf(args, sizeof args, "model gen --preset tiny-dense --dtype fp32 --quiet --out '%s'", dense);
  return tu_run_ferry(args, NULL) == 0 ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(tmp);
  free(tmp);
  return 0;
}

/* Run `ferry ARGS`, expect exit status `want` and `needle` in the output. */
static void expect(const char *args, int want, const char *needle) {
  char *out = NULL;
  int rc = tu_run_ferry(args, &out);
  if (rc != want || (needle && !tu_contains(out, needle)))
    fprintf(stderr, "ferry %s\n  exit %d (want %d), output:\n%s\n  (wanted '%s')\n", args, rc, want, out,
            needle ? needle : "");
  assert_int_equal(rc, want);
  if (needle) assert_true(tu_contains(out, needle));
  free(out);
}

#define SIM "sim --model tiny-dense --hw h100-pcie --quiet "

/* 0 and 0.5 used to floor to 0 bytes, which budgets read as "unlimited". */
static void test_size_under_one_byte(void **state) {
  (void)state;
  expect(SIM "--synthetic n=2 --device-budget 0", 2, "less than one byte");
  expect(SIM "--synthetic n=2 --device-budget 0.5", 2, "less than one byte");
  expect(SIM "--synthetic n=2 --host-budget 0", 2, "less than one byte");
  expect("run --model x --synthetic n=2 --host-budget 0.0009K", 2, "less than one byte");
  expect("model gen --preset tiny-dense --out /nonexistent/x --shard-size 0", 2, "less than one byte");
  /* a real budget still works */
  expect(SIM "--synthetic n=2,prompt=8,output=2 --device-budget 1GiB", 0, NULL);
}

/* 1e300 s used to become a negative window start (signed overflow converting to ns). */
static void test_time_out_of_range(void **state) {
  (void)state;
  char args[640];
  expect(SIM "--synthetic n=2 --time-window 1e300:", 2, "'1e300' s is outside [0, 9223372036] s");
  expect(SIM "--synthetic n=2 --time-window 1:1e300", 2, "'1e300' s is outside");
  char *trace = tu_data_path("traces/azure_conv_200.csv");
  snprintf(args, sizeof args, "trace stats '%s' --time-window 1e300:", trace);
  expect(args, 2, "'1e300' s is outside");
  snprintf(args, sizeof args, "trace stats '%s' --time-window 10:", trace);
  expect(args, 0, "requests");
  free(trace);
  /* arrival x --time-scale past the clock: a clear error, not a wrapped arrival */
  expect(SIM "--synthetic rate=0.001,n=3,prompt=4,output=2 --time-scale 1e9", 1, "past the int64 nanosecond clock");
}

/* --synthetic n=1e8 --max-requests 3 used to build all 1e8 requests first (GBs, seconds). */
static void test_synthetic_lazy(void **state) {
  (void)state;
  expect(SIM "--synthetic n=100000000,prompt=8,output=2 --max-requests 3", 0, "requests: 3 done");
  /* the window and the rate scale apply to synthetic traces too (they were ignored) */
  expect(SIM "--synthetic rate=1,n=1000,prompt=8,output=2 --time-window 1e6:", 1, "no requests in the time window");
}

/* A request longer than the model's positions used to size the KV cache (512 GiB for one
 * long request on a large model): now it is refused by name, or skipped and counted. */
static void test_request_longer_than_model(void **state) {
  (void)state;
  char args[1024], *trace = tu_data_path("traces/azure_conv_200.csv");
  snprintf(args, sizeof args, SIM "--trace '%s'", trace);
  expect(args, 1, "azure_conv_200.csv: request 13 needs 2236 positions (2221 prompt + 15 output tokens), more than "
                  "tiny-dense's maximum position 2048");
  snprintf(args, sizeof args, SIM "--trace '%s' --skip-bad --max-requests 30", trace);
  expect(args, 0, "skipped 4 request(s) longer than tiny-dense's maximum position 2048 (--skip-bad)");
  free(trace);
  expect(SIM "--synthetic n=3,prompt=8,output=2 --max-seq-tokens 4096", 1, "exceeds tiny-dense's maximum position 2048");
  /* a budget too small for the KV cache says what the cache was sized from */
  expect("sim --model llama-2-7b --hw t4 --synthetic n=4,prompt=4000,output=90 --max-batch 64 --device-budget 10GiB",
         1, "KV cache 127.81 GiB: 64 sequences x 4090 tokens x 524288 bytes per token");
}

/* Poke one float into tensor `name` of the model folder's weights. */
static void poke_f32(const char *dir, const char *name, uint64_t index, float value) {
  ferry_store *s = NULL;
  assert_int_equal(ferry_store_open(&s, dir), FERRY_OK);
  const struct ferry_store_tensor *t = ferry_store_find(s, name);
  assert_non_null(t);
  assert_int_equal(t->dtype, FERRY_DTYPE_F32);
  FILE *f = fopen(ferry_store_file_path(s, t->file), "r+b");
  assert_non_null(f);
  assert_int_equal(fseek(f, (long)(t->offset + index * 4), SEEK_SET), 0);
  assert_int_equal(fwrite(&value, 4, 1, f), 1);
  assert_int_equal(fclose(f), 0);
  ferry_store_close(s);
}

/* Every row of a --dump-logits file parses as JSON; returns the sum of the rows' "nonfinite"
 * and checks it equals the nulls among their logits. */
static int64_t check_dump(const char *path, int64_t *rows) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  static char line[1 << 20];
  int64_t nonfinite = 0;
  *rows = 0;
  ferry__json_init();
  while (fgets(line, sizeof line, f)) {
    cJSON *o = cJSON_Parse(line);
    assert_non_null(o); /* "nan" used to make the row invalid JSON */
    const cJSON *nf = cJSON_GetObjectItem(o, "nonfinite"), *logits = cJSON_GetObjectItem(o, "logits");
    assert_true(cJSON_IsNumber(nf) && cJSON_IsArray(logits));
    int64_t nulls = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, logits) {
      assert_true(cJSON_IsNull(x) || cJSON_IsNumber(x));
      nulls += cJSON_IsNull(x);
    }
    assert_int_equal(nulls, (int64_t)nf->valuedouble);
    nonfinite += nulls;
    (*rows)++;
    cJSON_Delete(o);
  }
  fclose(f);
  return nonfinite;
}

/* NaN/Inf weights used to be accepted silently and --dump-logits wrote "nan" (invalid JSON). */
static void test_nonfinite(void **state) {
  (void)state;
  char args[2048], model[512], dump[600];
  snprintf(model, sizeof model, "%s/nan-model", tmp);
  snprintf(dump, sizeof dump, "%s/logits.jsonl", tmp);
  snprintf(args, sizeof args, "model gen --preset tiny-dense --dtype fp32 --quiet --out '%s'", model);
  expect(args, 0, NULL);
  int64_t rows = 0;
  const char *run = "run --quiet --synthetic n=2,prompt=4,output=3 --threads 1 --greedy";
  snprintf(args, sizeof args, "%s --model '%s' --dump-logits '%s'", run, model, dump);
  expect(args, 0, NULL);
  assert_int_equal(check_dump(dump, &rows), 0);
  assert_int_equal(rows, 6);

  poke_f32(model, "model.norm.weight", 5, NAN);
  poke_f32(model, "model.layers.1.mlp.down_proj.weight", 7, INFINITY);
  snprintf(args, sizeof args, "%s --model '%s'", run, model);
  expect(args, 1, "nan-model/model-00001-of-00001.safetensors: tensor model.layers.1.mlp.down_proj.weight holds 1 non-finite value(s) (NaN or "
                  "Inf; the first at element 7), 2 in 2 tensor(s) in all; --allow-nonfinite runs the model anyway");
  snprintf(args, sizeof args, "%s --model '%s' --allow-nonfinite --dump-logits '%s'", run, model, dump);
  expect(args, 0, "non-finite logit(s) (NaN or Inf) written as null");
  const int64_t nf = check_dump(dump, &rows);
  assert_int_equal(rows, 6);
  assert_int_equal(nf, 6 * 256); /* a NaN final-norm weight: every logit */
  expect("sim --model tiny-dense --hw h100-pcie --synthetic n=2 --allow-nonfinite", 2, "is for 'ferry run'");
}

/* The KV dtype shown is the one a run uses: a bf16 model's own (it was printed as bf16 while
 * the engine used fp16), and --kv-dtype chooses another. */
static void test_kv_dtype(void **state) {
  (void)state;
  expect("model show mixtral-8x7b", 0, "KV cache (bf16; --kv-dtype to change)");
  expect("model show llama-2-7b", 0, "KV cache (fp16;");
  expect("model show tiny-dense --json", 0, "\"kv_dtype\":\t\"fp32\"");
  expect("sim --model mixtral-8x7b --hw h100-pcie --plan-only --max-seq-tokens 4096", 0,
         "KV cache         4.00 GiB (8 sequences x 4096 tokens, bf16)");
  expect("sim --model mixtral-8x7b --hw h100-pcie --plan-only --max-seq-tokens 4096 --kv-dtype fp32", 0,
         "KV cache         8.00 GiB (8 sequences x 4096 tokens, fp32)");
  expect("sim --model mixtral-8x7b --hw h100-pcie --plan-only --max-seq-tokens 4096 --kv-dtype int4", 0,
         "KV cache         1.12 GiB (8 sequences x 4096 tokens, int4)");
  expect(SIM "--synthetic n=2 --kv-dtype fp4", 2,
         "unknown KV-cache format 'fp4' (expected fp32, fp16, bf16, fp8, int8, int4");
  expect(SIM "--synthetic n=2 --kv-home cpu", 2, "--kv-home: expected 'device', 'host', 'disk' or 'layer', got 'cpu'");
  expect(SIM "--synthetic n=2 --offload-compute experts=cpu", 1, "--offload-compute experts=...: tiny-dense is dense");
  expect(SIM "--synthetic n=2 --offload-compute layers=fast", 2,
         "--offload-compute: expected gpu, cpu, auto or CLASS=gpu|cpu|auto");
  /* swap preemption is for a paged cache; its host copy is in the plan */
  expect(SIM "--synthetic n=2 --kv-preempt swap", 1, "swap preemption (--kv-preempt swap) is for a paged cache");
  expect(SIM "--synthetic n=2 --kv-block-tokens 16 --kv-preempt evict", 2,
         "--kv-preempt: expected 'recompute' or 'swap', got 'evict'");
  expect(SIM "--plan-only --max-seq-tokens 256 --kv-block-tokens 16 --kv-pool 2560KiB --kv-preempt swap", 0,
         "KV swap          2.50 MiB (40 of the pool's 40 blocks"); /* tiny-dense: 64 KiB a block */
}

/* A routing trace for tiny-moe-shaped replay: requests `req`, 2 tokens, `layers` layers, k ids
 * per row starting at `first_id`. */
static void write_routing(const char *path, int64_t req, int layers, int k, int first_id) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  for (int t = 0; t < 2; t++)
    for (int l = 0; l < layers; l++) {
      fprintf(f, "{\"req_id\":%lld,\"token_idx\":%d,\"layer\":%d,\"topk_ids\":[", (long long)req, t, l);
      for (int i = 0; i < k; i++) fprintf(f, i ? ",%d" : "%d", first_id + i);
      fputs("],\"topk_weights\":[", f);
      for (int i = 0; i < k; i++) fprintf(f, i ? ",%g" : "%g", 1.0 / k);
      fputs("]}\n", f);
    }
  assert_int_equal(fclose(f), 0);
}

/* A routing trace of another shape used to fall back to synthetic routing without a word. */
static void test_routing_must_match(void **state) {
  (void)state;
  char args[1024], path[600];
  snprintf(path, sizeof path, "%s/routing.jsonl", tmp);
  const char *moe = "sim --model tiny-moe --hw h100-pcie --quiet --synthetic n=2,prompt=1,output=1 --device-budget 4MiB";
  write_routing(path, 0, 6, 2, 0); /* tiny-moe: 6 layers, 8 experts, top-2 */
  snprintf(args, sizeof args, "%s --routing '%s'", moe, path);
  expect(args, 0, "requests: 2 done");
  write_routing(path, 0, 6, 3, 0);
  expect(args, 1, "the routing trace does not match the model: it has 3 experts per token (the model routes 2)");
  write_routing(path, 0, 2, 2, 7);
  expect(args, 1, "it has 2 layers (the model has 6), expert ids up to 8 (the model has 8 experts)");
  write_routing(path, 1000, 6, 2, 0);
  expect(args, 1, "has no decisions for any of the 2 requests");
  write_routing(path, 1, 6, 2, 0);
  expect(args, 0, "1 of 2 requests have no recorded routing; the synthetic model routes them");
  snprintf(args, sizeof args, "%s --routing-synth zipf=1.2,k=8", moe);
  expect(args, 1, "--routing-synth zipf=1.2,k=8: tiny-moe has 6 layers, 8 experts and routes 2 per token");
  snprintf(args, sizeof args, "%s --routing-synth zipf=1.2,seed=3", moe);
  expect(args, 0, "requests: 2 done");
  snprintf(args, sizeof args, "%s --predictor frequency --predictor-routing '%s'", moe, path);
  write_routing(path, 0, 6, 3, 0);
  expect(args, 1, "does not match the model");
}

/* Options that were accepted and then ignored are refused, each naming why. */
static void test_ignored_options_refused(void **state) {
  (void)state;
  char args[1024];
  const char *syn = "--synthetic n=2,prompt=4,output=2";
  /* everything resident: the default budget holds the model, or no budget on the host */
  snprintf(args, sizeof args, SIM "%s --block-layers 2", syn);
  expect(args, 1, "--block-layers has no effect: tiny-dense fits in the default device budget (72.00 GiB)");
  snprintf(args, sizeof args, SIM "%s --block-layers 2 --device-budget 8MiB", syn);
  expect(args, 0, "requests: 2 done");
  snprintf(args, sizeof args, "sim --model tiny-moe --hw h100-pcie --quiet %s --predictor frequency", syn);
  expect(args, 1, "--predictor has no effect: tiny-moe fits in the default device budget");
  snprintf(args, sizeof args, "run --model '%s' --quiet %s --prefetch-depth 2", dense, syn);
  expect(args, 1, "--prefetch-depth has no effect: without --device-budget the host executor keeps every weight resident");
  snprintf(args, sizeof args, SIM "%s --resident all --pin-first 1 --device-budget 1GiB", syn);
  expect(args, 1, "--pin-first has no effect with --resident all");
  snprintf(args, sizeof args, SIM "%s --resident attention", syn);
  expect(args, 1, "--resident attention has no effect");
  /* the model's kind */
  snprintf(args, sizeof args, SIM "%s --expert-cache lfu --device-budget 8MiB", syn);
  expect(args, 1, "--expert-cache needs a Mixture-of-Experts model");
  /* an MoE model's expert cache takes the budget left, unless every routed expert runs on the CPU */
  snprintf(args, sizeof args, "sim --model tiny-moe --hw h100-pcie %s --fill-budget --device-budget 8MiB", syn);
  expect(args, 1, "--fill-budget pins layers where no expert cache takes the budget left");
  snprintf(args, sizeof args, "sim --model tiny-moe --hw h100-pcie --quiet %s --fill-budget --device-budget 8MiB "
                              "--offload-compute experts=cpu", syn);
  expect(args, 0, "requests: 2 done");
  snprintf(args, sizeof args, "sim --model tiny-moe --hw h100-pcie %s --fill-budget --device-budget 8MiB "
                              "--offload-compute experts=cpu --predictor frequency", syn);
  expect(args, 1, "tiny-moe's expert cache takes it");
  snprintf(args, sizeof args, "sim --model '%s' --hw h100-pcie %s --quant int4-g64", dense, syn);
  expect(args, 1, "has weight files, whose own formats are used");
  char *trace = tu_data_path("traces/azure_conv_200.csv");
  snprintf(args, sizeof args, SIM "--trace '%s' --max-requests 2 --seed 5", trace);
  expect(args, 1, "--seed has no effect: the simulator computes no tokens");
  free(trace);
  /* options that contradict one another */
  snprintf(args, sizeof args, SIM "%s --trace-format azure", syn);
  expect(args, 2, "--trace-format applies to --trace files");
  snprintf(args, sizeof args, SIM "%s --as-fast-as-possible --time-scale 2", syn);
  expect(args, 2, "--time-scale changes arrival times, which --as-fast-as-possible ignores");
  snprintf(args, sizeof args, SIM "--plan-only --db '%s/x.db'", tmp);
  expect(args, 2, "--db does nothing with --plan-only");
  snprintf(args, sizeof args, SIM "%s --greedy", syn);
  expect(args, 2, "--greedy is for 'ferry run'");
  snprintf(args, sizeof args, SIM "%s --max-batch 8 --max-step-tokens 4", syn);
  expect(args, 2, "--max-step-tokens 4 is below the 8 sequences of a batch");
  snprintf(args, sizeof args, "sim --model tiny-moe --hw h100-pcie %s --predictor-model p.safetensors", syn);
  expect(args, 2, "--predictor-model is read by --predictor mlp3 or mlp7 only");
  snprintf(args, sizeof args, "sim --model tiny-moe --hw h100-pcie %s --predictor lru --predictor-routing r.jsonl", syn);
  expect(args, 2, "--predictor-routing is read by --expert-cache static and --predictor frequency, oracle, gate-lookahead, mlp3 and mlp7 only");
  snprintf(args, sizeof args, "sim --model tiny-moe --hw h100-pcie %s --predictor oracle --predictor-routing r.jsonl", syn);
  expect(args, 2, "in 'ferry sim' the oracle knows the routing being simulated");
  snprintf(args, sizeof args, "run --model '%s' %s --backend cuda --threads 2", dense, syn);
  expect(args, 2, "--threads sets the host executor's BLAS threads");
  /* the software and memory options of issue 13 */
  snprintf(args, sizeof args, SIM "%s --keep-cache", syn);
  expect(args, 1, "--keep-cache has no effect: tiny-dense fits in the default device budget");
  snprintf(args, sizeof args, "run --model '%s' %s --device-budget 8MiB --keep-cache --direct-io", dense, syn);
  expect(args, 2, "--keep-cache does nothing with --direct-io: O_DIRECT reads bypass the page cache");
  snprintf(args, sizeof args, SIM "%s --direct-io", syn);
  expect(args, 2, "--direct-io is for 'ferry run': the simulator's disk reads already leave nothing in its page cache");
  snprintf(args, sizeof args, SIM "--plan-only --faults read:eio@1");
  expect(args, 2, "--faults does nothing with --plan-only");
  snprintf(args, sizeof args, SIM "--plan-only --host-memory pageable");
  expect(args, 2, "--host-memory does nothing with --plan-only");
  snprintf(args, sizeof args, "run --model '%s' %s --runtime eager", dense, syn);
  expect(args, 2, "--runtime is for 'ferry sim'");
}

/* --expert-granularity layer from the command line: the default expert-cache policy is not a
 * policy the user named, so it must not reach the engine (which refuses any with whole-layer
 * experts); a named one still is refused. */
static void test_expert_granularity_layer(void **state) {
  (void)state;
  char args[1024];
  const char *moe = "sim --model tiny-moe --hw h100-pcie --quiet --synthetic n=2,prompt=4,output=2 --device-budget 8MiB";
  snprintf(args, sizeof args, "%s --expert-granularity layer", moe);
  expect(args, 0, "requests: 2 done");
  snprintf(args, sizeof args, "%s --expert-granularity layer --expert-cache lfu", moe);
  expect(args, 1, "--expert-granularity layer moves a layer's experts with it");
  snprintf(args, sizeof args, "%s --expert-granularity layer --predictor frequency", moe);
  expect(args, 1, "--expert-granularity layer moves a layer's experts with it");
}

/* Work on the CPU (experts or layers computed there, a host KV cache) on a profile whose host
 * names no cores is priced from its rough cpu_gflops: the run says so on stderr, unless --quiet;
 * a host with cores (rtx-4090's desktop-ddr4) and a run with no CPU work say nothing. */
static void test_rough_cpu_warning(void **state) {
  (void)state;
  static const struct {
    const char *args;
    int warned;
  } cases[] = {
      {"--hw h100-pcie --offload-compute experts=cpu", 1},
      {"--hw h100-pcie --offload-compute experts=cpu --quiet", 0},
      {"--hw rtx-4090 --offload-compute experts=cpu", 0},
      {"--hw h100-pcie", 0},
      {"--hw h100-pcie+host=xeon-6454s-2s --offload-compute experts=cpu", 0}, /* the remedy it names */
  };
  char args[512], *out = NULL;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    snprintf(args, sizeof args, "sim --model tiny-moe --device-budget 8MiB --synthetic n=1,prompt=8,output=2 --as-fast-as-possible %s",
             cases[i].args);
    const int rc = tu_run_ferry(args, &out);
    const int warned = tu_contains(out, "host names no CPU cores (host.cores, host.core_gflops)") &&
                       tu_contains(out, "(--hw h100-pcie+host=xeon-6454s-2s)");
    if (rc != 0 || warned != cases[i].warned) fail_msg("ferry %s: exit %d, warned %d:\n%s", args, rc, warned, out);
    free(out);
  }
}

/* The default device budget's note says where the budget goes. With every routed expert on the
 * CPU (--offload-compute experts=cpu, or cpu for every class) the engine keeps no expert cache
 * (its plan: "nothing to cache"), so the note must not give the rest of the budget to one:
 * Mixtral on an L4 keeps its attention resident, on a T4 with a large KV cache its last layers
 * are pinned in what is left (fill_budget, as for a dense model) and the others stream (or run on
 * the CPU with layers=cpu). Without the option the expert cache takes the rest. */
static void test_default_budget_note(void **state) {
  (void)state;
  static const struct {
    const char *args, *note;
  } cases[] = {
      {"--hw l4 --max-seq-tokens 2048 --offload-compute experts=cpu",
       "(90% of l4's 24.00 GiB): attention resident; routed experts run on the CPU (--offload-compute experts=cpu): no "
       "expert cache unless a predictor or a static placement fills one; --device-budget to change"},
      {"--hw t4 --max-batch 26 --max-seq-tokens 4096 --offload-compute experts=cpu",
       "(90% of t4's 16.00 GiB): routed experts run on the CPU (--offload-compute experts=cpu): no expert cache unless "
       "a predictor or a static placement fills one; the last layers fill what streaming leaves; --device-budget"},
      {"--hw t4 --max-batch 26 --max-seq-tokens 4096 --offload-compute cpu",
       "no expert cache unless a predictor or a static placement fills one; the last layers fill what is left, the "
       "others run on the CPU; --device"},
      {"--hw l4 --max-seq-tokens 2048",
       "(90% of l4's 24.00 GiB): attention resident, the expert cache takes the rest; --device-budget"},
  };
  char args[512], *out = NULL;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    snprintf(args, sizeof args, "sim --model mixtral-8x7b --plan-only %s", cases[i].args);
    const int rc = tu_run_ferry(args, &out);
    const int cpu = tu_contains(cases[i].args, "cpu");
    /* the last layer is pinned in what the working set leaves */
    const char *last = strstr(out, "    layer 31 "), *eol = last ? strchr(last, '\n') : NULL;
    const char *pinned = last ? strstr(last, "pinned on device") : NULL;
    if (cpu && (!pinned || (eol && pinned > eol))) fail_msg("ferry %s: layer 31 not pinned:\n%s", args, out);
    if (rc != 0 || !tu_contains(out, cases[i].note) ||
        (cpu && (tu_contains(out, "the expert cache takes") ||
                 !tu_contains(out, "(every routed expert runs on the CPU: nothing to cache)") ||
                 !tu_contains(out, "computed on the CPU from host memory") || tu_contains(out, "cached on device"))) ||
        (!cpu && !tu_contains(out, "cached on device, homed in host memory")))
      fail_msg("ferry %s: exit %d:\n%s", args, rc, out);
    free(out);
  }
}

/* --quant sizes a preset's weights in its formats even where the preset's checkpoint is published
 * quantized (DeepSeek-V3's fp8 blocks): an expert of 3 x 7168 x 2048 weights at int4-g32 is
 * 19 bytes per 32 (16 of nibbles, an fp16 scale, a u8 zero): 3 x 458752 x 19 = 26148864 B,
 * 24.94 MiB; as published, fp8 with a scale per 128 x 128 block, 42.01 MiB. */
static void test_quant_overrides_published(void **state) {
  (void)state;
  const char *plan = "sim --model deepseek-v3 --hw rtx-4090d --synthetic n=1,prompt=16,output=2 --max-batch 1 "
                     "--max-step-tokens 16 --resident attention --offload-compute experts=cpu --plan-only";
  char args[640];
  snprintf(args, sizeof args, "%s", plan);
  expect(args, 0, "expert cache     0 x 42.01 MiB");
  snprintf(args, sizeof args, "%s --quant expert=int4-g32,attn=int4-g32,shared=int4-g32,dense_ffn=int4-g32,default=bf16",
           plan);
  expect(args, 0, "expert cache     0 x 24.94 MiB");
}

/* Options are matched whole (getopt_long took a prefix for the option it abbreviates): an
 * unknown or shortened one is an error naming the nearest; so are unknown profiles and models,
 * whose preset names match in any case. */
static void test_names_suggested(void **state) {
  (void)state;
  expect("run --model x --synthetic n=2 --prefetch-dept 1", 2,
         "unknown option '--prefetch-dept'; did you mean --prefetch-depth?");
  expect("run --model x --synthetic n=2 --prefetch 1", 2, "unknown option '--prefetch'; did you mean --prefetch-depth?");
  expect("run --model x --synthetic n=2 --pin 1", 2, "did you mean --pin-first or --pin-last?");
  expect("run --model x --synthetic n=2 --block-layers=2x", 2, "--block-layers");
  expect("run --model x --synthetic n=2 --greedy=1", 2, "--greedy takes no value");
  expect("run --model x --synthetic n=2 --seed", 2, "--seed needs a value");
  expect(SIM "--synthetic n=2 --backend cuda", 2, "--backend is for 'ferry run'");
  expect("report --d x --out y", 2, "unknown option '--d'; did you mean --db?");
  expect("sim --model tiny-mo --hw h100-pcie --synthetic n=2", 1, "nearest: tiny-moe");
  expect("sim --model tiny-moe --hw h100 --synthetic n=2", 1, "nearest: h100-pcie, h100-sxm");
  expect("sim --model TINY-MOE --hw h100-pcie --synthetic n=2,prompt=8,output=2 --quiet", 0, "requests: 2 done");
  /* --name=VALUE is the same option */
  expect(SIM "--synthetic=n=2,prompt=8,output=2 --max-batch=2", 0, "requests: 2 done");
}

/* The generated help: every option of the table, each line within 100 columns. */
static void test_help_fits(void **state) {
  (void)state;
  const char *const cmds[] = {"run --help", "sim --help"};
  for (int c = 0; c < 2; c++) {
    char *out = NULL;
    assert_int_equal(tu_run_ferry(cmds[c], &out), 0);
    assert_true(tu_contains(out, "--prefetch-depth D") && tu_contains(out, "--host-budget-schedule"));
    size_t col = 0, widest = 0;
    for (const char *p = out; *p; p++) {
      col = *p == '\n' ? 0 : col + 1;
      if (col > widest) widest = col;
    }
    if (widest > 100) fprintf(stderr, "ferry %s: a line of %zu columns\n%s", cmds[c], widest, out);
    assert_true(widest <= 100);
    free(out);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_size_under_one_byte),
      cmocka_unit_test(test_expert_granularity_layer),
      cmocka_unit_test(test_default_budget_note),
      cmocka_unit_test(test_rough_cpu_warning),
      cmocka_unit_test(test_quant_overrides_published),
      cmocka_unit_test(test_names_suggested),
      cmocka_unit_test(test_help_fits),
      cmocka_unit_test(test_time_out_of_range),
      cmocka_unit_test(test_synthetic_lazy),
      cmocka_unit_test(test_request_longer_than_model),
      cmocka_unit_test(test_nonfinite),
      cmocka_unit_test(test_kv_dtype),
      cmocka_unit_test(test_routing_must_match),
      cmocka_unit_test(test_ignored_options_refused),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
