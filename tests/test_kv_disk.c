/* --kv-home disk: the KV cache in a file of the executor's disk tier, read into a host staging
 * before each layer's attention on the CPU and its new rows written back (FlexGen with the cache
 * 0 % on the GPU and 0 % in CPU memory, --cpu). On the host executor the logits are those of the
 * cache in host memory to the bit (dense, MoE, Gemma 2's windowed rings; resident and streamed
 * layers, prefetch 0-2, micro-batches, prompts attended on the device, an int8 cache) and the file
 * really holds the rows (pread/pwrite; its folder is gone after the run). In the simulator the
 * bytes read from disk and written to it per step are the cached and new rows of the step's
 * sequences, by hand; the staging is host memory inside the budget and a budget short of it is
 * refused naming it. A run recorded to a result database keeps its bytes written per step.
 * Disk-tier buffers themselves: a round trip, bounds, errors naming the file, and what they
 * refuse. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ferry/db.h"
#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/gen.h"
#include "ferry/hw.h"
#include "ferry/model.h"
#include "ferry/sim.h"
#include "ferry/store.h"
#include "testutil.h"

static char *dir, *tmp_dir, *dense_dir, *moe_dir, *gemma2_dir;

static int setup(void **state) {
  (void)state;
  dir = tu_mkdtemp("kvdisk");
  struct ferry_gen_options go = {.dtype = FERRY_DTYPE_F32, .seed = 7};
  dense_dir = tu_gen_model(dir, "tiny-dense", "dense", &go); /* 4 heads over 2 KV heads */
  moe_dir = tu_gen_model(dir, "tiny-moe", "moe", &go);
  gemma2_dir = tu_gen_tiny(dir, "gemma2", &go); /* a window of 4: its layers' caches are rings */
  /* the executors' disk folders go here, to be seen removed */
  size_t n = strlen(dir) + 8;
  tmp_dir = malloc(n);
  snprintf(tmp_dir, n, "%s/tmp", dir);
  assert_int_equal(mkdir(tmp_dir, 0700), 0);
  setenv("TMPDIR", tmp_dir, 1);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(dir);
  free(dir);
  free(tmp_dir);
  free(dense_dir);
  free(moe_dir);
  free(gemma2_dir);
  return 0;
}

/* Entries of a folder (not . and ..). */
static int entries(const char *path) {
  DIR *d = opendir(path);
  assert_non_null(d);
  int n = 0;
  for (struct dirent *de; (de = readdir(d));) n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
  closedir(d);
  return n;
}

/* With 16 tokens a step and 3 sequences a batch: the first step prefills whole prompts and the
 * first chunk of another, later steps mix decode tokens, continued prompts and new prompts. */
static const struct ferry_engine_request requests[] = {
    {.id = 0, .prompt_tokens = 5, .output_tokens = 6},  {.id = 1, .prompt_tokens = 7, .output_tokens = 5},
    {.id = 2, .prompt_tokens = 13, .output_tokens = 4}, {.id = 3, .prompt_tokens = 3, .output_tokens = 7},
    {.id = 4, .prompt_tokens = 9, .output_tokens = 3},  {.id = 5, .prompt_tokens = 4, .output_tokens = 5},
    {.id = 6, .prompt_tokens = 14, .output_tokens = 10}, /* to position 23: past Gemma 2's 20-row rings */
};
#define N_REQ ((int64_t)(sizeof requests / sizeof requests[0]))

struct moved {
  uint64_t kv_read, disk_read, written;
};

static void sum_moved(struct ferry_engine *e, void *user) {
  int64_t n;
  const struct ferry_step_metrics *sm = ferry_engine_step_metrics(e, &n);
  struct moved *m = user;
  *m = (struct moved){0};
  for (int64_t i = 0; i < n; i++) {
    m->kv_read += sm[i].bytes_kv_disk;
    m->disk_read += sm[i].bytes_disk;
    m->written += sm[i].bytes_disk_write;
  }
}

static void run_host(const char *model_dir, struct ferry_engine_config c, struct tu_logit_log *log, struct moved *m) {
  c.on_logits = tu_on_logits;
  c.logits_user = log;
  tu_run_host(model_dir, &c, requests, N_REQ, sum_moved, m);
}

/* A K or V row of the model's cache in format f (the usual attention: KV heads x head_dim). */
static uint64_t kv_row(const char *model_dir, enum ferry_kv_format f) {
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, model_dir), FERRY_OK);
  const struct ferry_model_config *mc = ferry_model_get_config(m);
  const uint64_t row = ferry_kv_format_row_bytes(ferry_model_kv_format(m, f), (uint64_t)(mc->n_kv_heads * mc->head_dim));
  ferry_model_close(m);
  return row;
}

static int64_t n_layers(const char *model_dir) {
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, model_dir), FERRY_OK);
  const int64_t L = ferry_model_get_config(m)->n_layers;
  ferry_model_close(m);
  return L;
}

/* The cache in host memory and on disk: the same logits to the bit (the same fp32 kernels over
 * the same rows, read back as they were written), for every variant: resident layers; streamed
 * ones with prefetch 0, 1, 2 (so 1, 2, 3 stagings, reads 0-2 attentions ahead); two micro-batches;
 * prompts attended on the device; an int8 cache (codes and scales move as bytes). Every token's
 * K and V row is written once per layer (prompt and decode tokens: prompt + output - 1 per
 * request; a ring's row again when a step wraps it is still one row per token), so on the
 * dense and MoE models the bytes written are that count x layers x 2 rows; rows are read back. */
static void test_same_logits(void **state) {
  (void)state;
  const char *dirs[3] = {dense_dir, moe_dir, gemma2_dir};
  int64_t tokens = 0;
  for (int64_t i = 0; i < N_REQ; i++) tokens += requests[i].prompt_tokens + requests[i].output_tokens - 1;
  for (int d = 0; d < 3; d++)
    for (int v = 0; v < 7; v++) {
      struct ferry_engine_config c = {.max_batch = 3, .max_step_tokens = 16, .max_seq_tokens = 24, .seed = 9,
                                      .greedy = 1, .block_layers = 1, .kv_home_host = 1};
      const int stream = v >= 1 && v <= 3;
      c.resident_all = !stream;
      c.prefetch_depth = stream ? v - 1 : 1;
      c.gpu_batches = v == 4 ? 2 : 1;
      c.kv_prefill_device = v == 5;
      c.kv_format = v == 6 && d < 2 ? FERRY_KV_INT8 : FERRY_KV_AUTO; /* Gemma 2's heads are 16 wide */
      if (stream) c.device_budget_bytes = tu_min_device_budget(dirs[d], &c);
      struct tu_logit_log host = {0}, disk = {0};
      struct moved mh, md;
      run_host(dirs[d], c, &host, &mh);
      c.kv_home_disk = 1;
      run_host(dirs[d], c, &disk, &md);
      assert_true(host.n > 0);
      if (disk.n != host.n || memcmp(disk.v, host.v, host.n * sizeof(float)))
        fail_msg("model %d, variant %d: logits on disk differ from the cache in host memory (%zu values, %zu there)", d,
                 v, disk.n, host.n);
      assert_int_equal(mh.written, 0);
      assert_int_equal(mh.kv_read, 0);
      assert_true(md.kv_read > 0 && md.kv_read <= md.disk_read);
      if (d < 2) {
        const uint64_t want = (uint64_t)tokens * (uint64_t)n_layers(dirs[d]) * 2 * kv_row(dirs[d], c.kv_format);
        if (md.written != want)
          fail_msg("model %d, variant %d: %llu bytes written, %llu by hand", d, v, (unsigned long long)md.written,
                   (unsigned long long)want);
      }
      free(host.v);
      free(disk.v);
    }
  assert_int_equal(entries(tmp_dir), 0); /* every executor's disk folder removed */
}

/* ---- the simulator ---- */

/* llama-2-7b on h100-pcie (fp16 cache: a K or V row is 32 x 128 x 2 = 8 KiB), everything resident. */
static struct ferry_engine_config sim_config(int disk, uint64_t host_budget) {
  struct ferry_engine_config c = {.max_batch = 2, .max_step_tokens = 1024, .max_seq_tokens = 520, .seed = 1,
                                  .resident_all = 1, .kv_home_host = 1, .kv_home_disk = disk, .prefetch_depth = 1,
                                  .host_budget_bytes = host_budget, .plan_elem_bytes = {2, 0}};
  return c;
}

/* A (prompt 100, 3 tokens out) and B (prompt 300, 6 out) prefill together; A decodes twice and
 * ends, C (prompt 40, 3 out) then prefills beside B's decode token. */
static ferry_status run_sim(const char *hw_name, const struct ferry_engine_config *c, struct tu_sim_result *r) {
  const struct tu_sim_setup setup = {.hw = hw_name, .exec = {.host_budget_bytes = c->host_budget_bytes}};
  ferry_status st = tu_sim_serve(&setup, c, tu_kv_sim_requests(), TU_KV_SIM_N, r);
  if (st == FERRY_OK) r->stats.bytes_disk -= r->loaded.bytes_disk; /* what serving read, not the resident weights' load */
  return st;
}

/* Per step and layer each sequence's cached rows are read (K and V, fp16) and its new ones
 * written; nothing else touches the disk (the weights are resident), and the simulator's disk
 * channels moved exactly those bytes. */
static void test_sim_bytes(void **state) {
  (void)state;
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, "llama-2-7b"), FERRY_OK);
  const struct ferry_model_config *mc = ferry_model_get_config(m);
  const uint64_t L = (uint64_t)mc->n_layers, row = (uint64_t)(mc->n_kv_heads * mc->head_dim) * 2;
  ferry_model_close(m);
  struct tu_sim_result *r = calloc(1, sizeof *r);
  assert_non_null(r);
  const struct ferry_engine_config c = sim_config(1, 0);
  if (run_sim("h100-pcie", &c, r) != FERRY_OK) fail_msg("%s", ferry_last_error());
  assert_int_equal(r->steps, TU_KV_SIM_STEPS);
  uint64_t read = 0, written = 0;
  for (int64_t s = 0; s < r->steps; s++) {
    const struct ferry_step_metrics *sm = &r->sm[s];
    uint64_t cached = 0, tokens = 0;
    for (int i = 0; i < 2; i++) {
      cached += (uint64_t)tu_kv_sim_schedule[s][i].cached;
      tokens += (uint64_t)tu_kv_sim_schedule[s][i].tokens;
    }
    assert_int_equal(sm->tokens, tokens);
    const uint64_t in = L * cached * row * 2, out = L * tokens * row * 2;
    if (sm->bytes_kv_disk != in || sm->bytes_disk != in || sm->bytes_disk_write != out)
      fail_msg("step %lld: %llu bytes read (%llu of the cache), %llu written; %llu and %llu by hand", (long long)s,
               (unsigned long long)sm->bytes_disk, (unsigned long long)sm->bytes_kv_disk,
               (unsigned long long)sm->bytes_disk_write, (unsigned long long)in, (unsigned long long)out);
    read += in;
    written += out;
  }
  assert_int_equal(r->stats.bytes_disk, read); /* on the disk's channels, all of it (the load's reads apart) */
  assert_int_equal(r->stats.bytes_disk_write, written);
  assert_int_equal(r->sum.bytes_disk_write, written);
  assert_true(r->stats.disk_write_busy_ns > 0);
  /* the file holds every sequence's whole cache: 2 sequences x 520 tokens x 32 layers x 2 rows */
  assert_int_equal(r->sum.peak_bytes[FERRY_TIER_DISK], 2ull * 520 * L * 2 * row);
  free(r);
}

/* The staging (2 copies x 2 sequences x 520 tokens x 8 KiB x 2) is host memory, the whole cache
 * is not: the peak host is the cache's lower by the cache less the staging; the minimum host
 * budget runs with its peak within it, one short of half the staging is refused naming it. */
static void test_host_budget(void **state) {
  (void)state;
  struct tu_sim_result *host = calloc(1, sizeof *host), *disk = calloc(1, sizeof *disk);
  assert_non_null(host);
  assert_non_null(disk);
  const struct ferry_engine_config ch = sim_config(0, 0), cd = sim_config(1, 0);
  assert_int_equal(run_sim("h100-pcie", &ch, host), FERRY_OK);
  assert_int_equal(run_sim("h100-pcie", &cd, disk), FERRY_OK);
  const uint64_t staging = 2ull * 2 * 520 * 8192 * 2, cache = 2ull * 520 * 32 * 8192 * 2;
  assert_int_equal(host->sum.peak_bytes[FERRY_TIER_HOST] - disk->sum.peak_bytes[FERRY_TIER_HOST], cache - staging);
  assert_int_equal(host->sum.peak_bytes[FERRY_TIER_DEVICE], disk->sum.peak_bytes[FERRY_TIER_DEVICE]);
  ferry_model *m = NULL;
  uint64_t dev, host_min;
  assert_int_equal(ferry_model_open(&m, "llama-2-7b"), FERRY_OK);
  assert_int_equal(ferry_engine_min_budgets(m, NULL, &cd, &dev, &host_min), FERRY_OK);
  ferry_model_close(m);
  struct ferry_engine_config c = sim_config(1, host_min);
  if (run_sim("h100-pcie", &c, disk) != FERRY_OK) fail_msg("host budget %llu: %s", (unsigned long long)host_min, ferry_last_error());
  assert_true(disk->sum.peak_bytes[FERRY_TIER_HOST] <= host_min);
  c.host_budget_bytes = host_min - staging / 2;
  assert_int_equal(run_sim("h100-pcie", &c, disk), FERRY_ERR_BUDGET);
  const char *msg = ferry_last_error();
  if (!tu_contains(msg, "its host staging 32.50 MiB: 2 x 2 sequences x 520 tokens x 8192 bytes x 2 (K and V; --kv-home "
                        "disk, --prefetch-depth + 1"))
    fail_msg("budget error: %s", msg);
  free(host);
  free(disk);
}

/* The plan names the staging and the file. */
static void test_plan(void **state) {
  (void)state;
  char *out = NULL;
  assert_int_equal(tu_run_ferryf(&out, "sim --model llama-2-7b --hw h100-pcie --plan-only --max-batch 2 --gpu-batches 2 "
                                       "--max-seq-tokens 520 --kv-home disk --resident all --prefetch-depth 2"),
                   0);
  if (!tu_contains(out, "KV cache         0 B (on disk: --kv-home disk)") ||
      !tu_contains(out, "KV staging       48.75 MiB (3 x 2 sequences x 520 tokens, fp16") ||
      !tu_contains(out, "disk: KV cache 1.02 GiB (4 sequences x 520 tokens, fp16; a file"))
    fail_msg("%s", out);
  free(out);
}

/* Combinations that make no sense, or that ferry does not do, are refused saying why; a profile
 * without a write rate cannot price the writes. */
static void test_refusals(void **state) {
  (void)state;
  static const struct {
    const char *args, *msg;
    int rc;
  } cases[] = {
      {"--kv-home disk --kv-attention device", "--kv-home disk with --kv-attention device: the rows would go from disk", 1},
      {"--kv-home disk --kv-block-tokens 4", "--kv-home disk with a paged KV cache (--kv-block-tokens): not supported", 1},
      {"--kv-home disk --offload-compute layers=cpu", "--kv-home disk with layers computed on the CPU", 1},
      {"--kv-home disk --kv-host-memory pinned", "--kv-host-memory is the memory of a KV cache in host memory", 2},
      {"--kv-home flash", "--kv-home: expected 'device', 'host', 'disk' or 'layer', got 'flash'", 2},
  };
  char *out = NULL;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const int rc = tu_run_ferryf(&out, "sim --model tiny-dense --hw h100-pcie --synthetic n=2 --as-fast-as-possible %s",
                                 cases[i].args);
    if (rc != cases[i].rc || !tu_contains(out, cases[i].msg)) fail_msg("%s: exit %d: %s", cases[i].args, rc, out);
    free(out);
  }
  assert_int_equal(tu_run_ferryf(&out, "run --model %s --synthetic n=2 --disk-dir %s", dense_dir, dir), 2);
  if (!tu_contains(out, "--disk-dir is where --kv-home disk keeps its KV cache's file")) fail_msg("%s", out);
  free(out);
  /* the library: the disk is the home of the host cache, both flags set */
  ferry_model *m = NULL;
  ferry_hw *hw = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_model_open(&m, "tiny-dense"), FERRY_OK);
  assert_int_equal(ferry_hw_open(&hw, "h100-pcie"), FERRY_OK);
  assert_int_equal(ferry_exec_create_sim(&ex, hw, NULL), FERRY_OK);
  const struct ferry_engine_config c = {.max_batch = 2, .kv_home_disk = 1};
  assert_int_equal(ferry_engine_create(&e, m, NULL, ex, &c), FERRY_ERR_INVALID);
  if (!tu_contains(ferry_last_error(), "kv_home_disk homes on disk the KV cache that kv_home_host keeps in host memory"))
    fail_msg("%s", ferry_last_error());
  ferry_exec_destroy(ex);
  ferry_hw_close(hw);
  ferry_model_close(m);
  /* a disk with a read rate only */
  char path[4096];
  snprintf(path, sizeof path, "%s/nowrite.json", dir);
  const char *json = "{\"name\": \"nowrite\", \"kind\": \"gpu\", \"gpu\": \"h100-pcie\", \"link\": \"pcie5-x16\", "
                     "\"host\": \"ddr5\", \"disk\": {\"name\": \"a read-only figure\", \"read_gbps\": 3.0}}";
  tu_write_file(path, json, strlen(json));
  assert_int_equal(tu_run_ferryf(&out, "sim --model tiny-dense --hw %s --synthetic n=2 --as-fast-as-possible --kv-home disk",
                                 path),
                   1);
  if (!tu_contains(out, "hardware profile nowrite has no disk.write_gbps, needed to simulate a write to a disk-tier buffer"))
    fail_msg("%s", out);
  free(out);
}

/* A disk-tier buffer on the host executor: a file in a private folder under disk_dir, a round
 * trip through it, its bounds, what it refuses, a failed read naming the file and offset, the
 * file and folder gone when freed and destroyed. In the simulator: accounting only. */
static void test_disk_buffers(void **state) {
  (void)state;
  char base[4096];
  snprintf(base, sizeof base, "%s/disk", dir);
  assert_int_equal(mkdir(base, 0700), 0);
  ferry_exec *ex = NULL;
  assert_int_equal(ferry_exec_create_host(&ex, &(struct ferry_exec_config){.compute_threads = 1, .disk_dir = base}),
                   FERRY_OK);
  int32_t q;
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_DISK, &q), FERRY_OK);
  ferry_buf *disk = NULL, *host = NULL, *dev = NULL;
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DISK, 1 << 16, "kv file", &disk), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_HOST, 1 << 16, "staging", &host), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 4096, "dev", &dev), FERRY_OK);
  const char *file = ferry_exec_buf_file(disk);
  assert_non_null(file);
  assert_true(!strncmp(file, base, strlen(base)) && tu_contains(file, "/ferry-disk-") && tu_contains(file, "kv-file"));
  assert_int_equal(access(file, R_OK | W_OK), 0);
  assert_null(ferry_exec_buf_host_ptr(ex, disk));
  assert_null(ferry_exec_buf_file(host));
  uint64_t used;
  ferry_exec_tier_usage(ex, FERRY_TIER_DISK, &used, NULL);
  assert_int_equal(used, 1 << 16);
  unsigned char *h = ferry_exec_buf_host_ptr(ex, host);
  for (int i = 0; i < 4096; i++) h[i] = (unsigned char)(i * 7 + 1);
  assert_int_equal(ferry_exec_copy(ex, q, (struct ferry_ref){disk, 12288, FERRY_DTYPE_U8},
                                   (struct ferry_ref){host, 0, FERRY_DTYPE_U8}, 4096), FERRY_OK);
  assert_int_equal(ferry_exec_copy(ex, q, (struct ferry_ref){host, 8192, FERRY_DTYPE_U8},
                                   (struct ferry_ref){disk, 12288, FERRY_DTYPE_U8}, 4096), FERRY_OK);
  assert_int_equal(ferry_exec_drain(ex), FERRY_OK);
  assert_memory_equal(h + 8192, h, 4096);
  /* bounds, and copies that are not between the disk and host memory */
  assert_int_equal(ferry_exec_copy(ex, q, (struct ferry_ref){host, 0, FERRY_DTYPE_U8},
                                   (struct ferry_ref){disk, 65000, FERRY_DTYPE_U8}, 4096), FERRY_ERR_RANGE);
  assert_true(tu_contains(ferry_exec_errmsg(ex), "overrun buffer 'kv file' of 65536 bytes"));
  assert_int_equal(ferry_exec_copy(ex, q, (struct ferry_ref){dev, 0, FERRY_DTYPE_U8},
                                   (struct ferry_ref){disk, 0, FERRY_DTYPE_U8}, 4096), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_exec_errmsg(ex), "a disk-tier buffer is copied to or from a host-tier buffer only"));
  struct ferry_kernel k = {.kind = FERRY_K_SWIGLU, .name = "relu", .m = 1, .n = 16, .fn = FERRY_FN_RELU,
                           .x = {disk, 0, FERRY_DTYPE_F32}, .y = {host, 0, FERRY_DTYPE_F32}};
  int32_t qc;
  assert_int_equal(ferry_exec_queue_create(ex, FERRY_QUEUE_COMPUTE, &qc), FERRY_OK);
  assert_int_equal(ferry_exec_compute(ex, qc, &k), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_exec_errmsg(ex), "operand x is in buffer 'kv file' of the disk tier"));
  /* the file cut short behind the executor's back: the read fails naming it and the offset */
  assert_int_equal(truncate(file, 16384), 0);
  assert_int_equal(ferry_exec_copy(ex, q, (struct ferry_ref){host, 0, FERRY_DTYPE_U8},
                                   (struct ferry_ref){disk, 14336, FERRY_DTYPE_U8}, 4096), FERRY_OK);
  assert_int_equal(ferry_exec_drain(ex), FERRY_ERR_IO);
  char want[4200];
  snprintf(want, sizeof want, "reading 4096 bytes at offset 14336 of %s (kv file): the file ends early after 2048 bytes",
           file);
  if (!tu_contains(ferry_exec_errmsg(ex), want)) fail_msg("%s", ferry_exec_errmsg(ex));
  char *kept = strdup(file);
  ferry_exec_free(ex, disk);
  assert_int_not_equal(access(kept, F_OK), 0);
  free(kept);
  ferry_exec_destroy(ex);
  assert_int_equal(entries(base), 0);
  /* the simulator keeps no file, only the tier's figures */
  ferry_hw *hw = NULL;
  assert_int_equal(ferry_hw_open(&hw, "h100-pcie"), FERRY_OK);
  assert_int_equal(ferry_exec_create_sim(&ex, hw, NULL), FERRY_OK);
  assert_int_equal(ferry_exec_alloc(ex, FERRY_TIER_DISK, 1 << 20, "kv file", &disk), FERRY_OK);
  assert_null(ferry_exec_buf_file(disk));
  ferry_exec_tier_usage(ex, FERRY_TIER_DISK, &used, NULL);
  assert_int_equal(used, 1 << 20);
  ferry_exec_destroy(ex);
  ferry_hw_close(hw);
}

/* A run recorded to a result database loses nothing of what it wrote to disk: its steps rows'
 * bytes_disk_write sum to the summary's host_to_disk (the steps' metrics), every step wrote its
 * new rows, on the simulator and on the host executor. */
static void check_db_disk_write(const char *args, const char *db_path) {
  char *out = NULL;
  if (tu_run_ferryf(&out, "%s --kv-home disk --quiet --format json --db '%s'", args, db_path) != 0)
    fail_msg("ferry %s: %s", args, out);
  cJSON *j = cJSON_Parse(out);
  if (!j) fail_msg("ferry %s: not JSON: %s", args, out);
  const cJSON *run = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "runs"), 0);
  const cJSON *moved = cJSON_GetObjectItemCaseSensitive(run, "bytes_moved");
  const cJSON *written = cJSON_GetObjectItemCaseSensitive(moved, "host_to_disk");
  const cJSON *steps = cJSON_GetObjectItemCaseSensitive(run, "steps");
  const cJSON *run_id = cJSON_GetObjectItemCaseSensitive(run, "run_id");
  if (!cJSON_IsNumber(written) || !cJSON_IsNumber(steps) || !cJSON_IsNumber(run_id))
    fail_msg("ferry %s: %s", args, out);
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  sqlite3_stmt *q = NULL;
  if (sqlite3_prepare_v2(db, "SELECT total(bytes_disk_write), count(*), count(nullif(bytes_disk_write, 0)) FROM steps "
                              "WHERE runId = ?1", -1, &q, NULL) != SQLITE_OK)
    fail_msg("%s: %s", db_path, sqlite3_errmsg(db));
  sqlite3_bind_int64(q, 1, (sqlite3_int64)run_id->valuedouble);
  assert_int_equal(sqlite3_step(q), SQLITE_ROW);
  const double sum = sqlite3_column_double(q, 0);
  const int64_t rows = sqlite3_column_int64(q, 1), writing = sqlite3_column_int64(q, 2);
  sqlite3_finalize(q);
  sqlite3_close(db);
  if (!(written->valuedouble > 0) || sum != written->valuedouble || rows != (int64_t)steps->valuedouble ||
      writing != rows)
    fail_msg("ferry %s: the summary wrote %.0f bytes in %.0f steps; the steps table %.0f bytes in %lld rows (%lld "
             "writing)", args, written->valuedouble, steps->valuedouble, sum, (long long)rows, (long long)writing);
  /* what the readers make of it: the run's stats, `db show` and its metrics (db diff's names) */
  const int64_t id = (int64_t)run_id->valuedouble;
  ferry_db *fdb = NULL;
  assert_int_equal(ferry_db_open(&fdb, db_path, FERRY_DB_READ_ONLY), FERRY_OK);
  struct ferry_run_stats stats;
  assert_int_equal(ferry_db_run_stats(fdb, id, &stats), FERRY_OK);
  assert_true((double)stats.bytes_disk_write == written->valuedouble);
  ferry_db_close(fdb);
  free(out);
  if (tu_run_ferryf(&out, "db show %lld --db '%s'", (long long)id, db_path) != 0) fail_msg("%s", out);
  assert_true(tu_contains(out, "disk writes  "));
  free(out);
  if (tu_run_ferryf(&out, "db show %lld --db '%s' --format json", (long long)id, db_path) != 0) fail_msg("%s", out);
  cJSON *shown = cJSON_Parse(out);
  const cJSON *metric = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(shown, "metrics"),
                                                         "bytes_disk_write");
  if (!cJSON_IsNumber(metric) || metric->valuedouble != written->valuedouble) fail_msg("db show --format json: %s", out);
  cJSON_Delete(shown);
  cJSON_Delete(j);
  free(out);
}

static void test_db_steps(void **state) {
  (void)state;
  char db_path[4096], args[4096];
  snprintf(db_path, sizeof db_path, "%s/kv-disk.db", dir);
  check_db_disk_write("sim --model llama-2-7b --hw h100-pcie --resident all --max-batch 2 --max-seq-tokens 520 "
                      "--synthetic n=3,prompt=100,output=4 --as-fast-as-possible",
                      db_path);
  snprintf(args, sizeof args, "run --model '%s' --max-batch 3 --max-step-tokens 16 --max-seq-tokens 24 "
                              "--synthetic n=4,prompt=9,output=4 --as-fast-as-possible", dense_dir);
  check_db_disk_write(args, db_path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_logits), cmocka_unit_test(test_sim_bytes), cmocka_unit_test(test_host_budget),
      cmocka_unit_test(test_plan),        cmocka_unit_test(test_refusals),  cmocka_unit_test(test_disk_buffers),
      cmocka_unit_test(test_db_steps),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
