/* The GPU check's measuring tool (driven by scripts/gpu-check.sh): kernel-by-kernel comparison
 * of the cuda executor against the host executor, end-to-end logits of a model on both,
 * probes of pinned H2D/D2H bandwidth and GEMM throughput written as a calibrated hardware
 * profile, and the measured-vs-simulated table over result databases. Everything goes through
 * the public executor API, so the same code would check any executor that computes.
 * Exit status: 0 pass, 1 fail, 2 usage or I/O error, 77 no CUDA device (skip). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "common/half.h"
#include "common/rng.h"
#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/hw.h"
#include "ferry/model.h"
#include "ferry/quant.h"
#include "ferry/store.h"
#include "kernel_cases.h"

#define EXIT_SKIP 77

typedef ferry_status (*make_fn)(ferry_exec **out, const struct ferry_exec_config *c);

static int die(const char *what) {
  fprintf(stderr, "gpu_check: %s: %s\n", what, ferry_last_error());
  return 2;
}

/* Create the cuda executor or explain why not (77 = skip). */
static int make_cuda(ferry_exec **ex) {
  struct ferry_exec_config c = {0};
  ferry_status st = ferry_exec_create_cuda(ex, &c);
  if (st == FERRY_OK) return 0;
  fprintf(stderr, "gpu_check: %s\n", ferry_last_error());
  return st == FERRY_ERR_NO_DEVICE || st == FERRY_ERR_UNSUPPORTED ? EXIT_SKIP : 2;
}

/* --- kernels: the table every executor is checked on (tests/kernel_cases.c) ----------------- */

/* second = the executor checked against the host one (the host itself for a self-test of the
 * harness, where every error must be exactly zero) */
static int cmd_kernels(int self_test) {
  size_t n_cases;
  const struct kcase *cases = kc_cases(&n_cases);
  ferry_exec *cu = NULL;
  if (!self_test) {
    int rc = make_cuda(&cu);
    if (rc) return rc;
    ferry_exec_destroy(cu);
  }
  int failures = 0, unsupported = 0;
  printf("%-24s %12s %10s %s\n", "kernel", "max rel err", "tolerance", "result");
  for (size_t i = 0; i < n_cases; i++) {
    const struct kcase *c = &cases[i];
    ferry_exec *host = NULL;
    char *a = NULL, *b = NULL;
    struct ferry_exec_config xc = {.compute_threads = 1};
    if (ferry_exec_create_host(&host, &xc) != FERRY_OK) return die("host executor");
    if (self_test ? ferry_exec_create_host(&cu, &xc) != FERRY_OK : make_cuda(&cu) != 0) return 2;
    ferry_status sa = kc_run(host, c, c->bytes, &a), sb = kc_run(cu, c, c->bytes, &b);
    if (sa == FERRY_OK && sb == FERRY_ERR_UNSUPPORTED) {
      /* a kernel the cuda executor declines (the newer families' features): said, not failed */
      printf("%-24s %12s %10s unsupported (%s)\n", c->name, "-", "-", ferry_exec_errmsg(cu));
      unsupported++;
    } else if (sa != FERRY_OK || sb != FERRY_OK) {
      printf("%-24s %12s %10s FAIL (%s: %s)\n", c->name, "-", "-", sa ? "host" : "cuda",
             ferry_exec_errmsg(sa ? host : cu));
      failures++;
    } else {
      int ids_ok, nonfinite;
      const double rel = kc_max_rel_error(c, a, b, &ids_ok, &nonfinite);
      int ok = !nonfinite && rel <= (self_test ? 0.0 : c->tol) && ids_ok;
      printf("%-24s %12.3e %10.1e %s%s\n", c->name, rel, c->tol, ok ? "ok" : "FAIL", ids_ok ? "" : " (ids differ)");
      failures += !ok;
    }
    free(a);
    free(b);
    ferry_exec_destroy(host);
    ferry_exec_destroy(cu);
  }
  printf("kernels: %d of %zu failed, %d unsupported by the executor checked\n", failures, n_cases, unsupported);
  return failures ? 1 : 0;
}

/* --- logits: a whole model on both executors ------------------------------------------------- */

struct logit_log {
  float *data;
  size_t floats, cap;
  int64_t rows, vocab;
};

static void on_logits(void *user, int64_t req, int32_t tok, const int32_t *tokens, int32_t n_tokens,
                      const float *logits, int64_t vocab) {
  (void)req;
  (void)tok;
  (void)tokens;
  (void)n_tokens;
  struct logit_log *l = user;
  if (l->floats + (size_t)vocab > l->cap) {
    size_t cap = (l->cap + (size_t)vocab) * 2;
    float *p = realloc(l->data, cap * sizeof(float));
    if (!p) return;
    l->data = p;
    l->cap = cap;
  }
  memcpy(l->data + l->floats, logits, (size_t)vocab * sizeof(float));
  l->floats += (size_t)vocab;
  l->rows++;
  l->vocab = vocab;
}

static const struct ferry_engine_request logit_requests[] = {
    {.id = 0, .arrival_ns = 0, .prompt_tokens = 12, .output_tokens = 8},
    {.id = 1, .arrival_ns = 0, .prompt_tokens = 5, .output_tokens = 12},
    {.id = 2, .arrival_ns = 0, .prompt_tokens = 30, .output_tokens = 4},
};

static ferry_status run_model(const char *dir, make_fn make, struct logit_log *log) {
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  ferry_status st;
  struct ferry_exec_config xc = {.compute_threads = 0};
  if ((st = ferry_model_open(&m, dir)) || (st = ferry_store_open(&s, dir)) || (st = make(&ex, &xc))) goto out;
  struct ferry_engine_config c = {.max_batch = 3, .max_step_tokens = 16, .max_seq_tokens = 64, .seed = 5, .greedy = 1};
  c.on_logits = on_logits;
  c.logits_user = log;
  if ((st = ferry_engine_create(&e, m, s, ex, &c))) goto out;
  struct ferry_run_options ro = {.as_fast_as_possible = 1};
  st = ferry_engine_run(e, logit_requests, (int64_t)(sizeof logit_requests / sizeof logit_requests[0]), &ro);
out:
  if (st) fprintf(stderr, "gpu_check: %s\n", ferry_last_error());
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_store_close(s);
  ferry_model_close(m);
  return st;
}

static int64_t argmax(const float *v, int64_t n) {
  int64_t b = 0;
  for (int64_t i = 1; i < n; i++)
    if (v[i] > v[b]) b = i;
  return b;
}

/* self_test: host against host, every logit identical (checks the harness, as kernels --self-test) */
static int cmd_logits(const char *dir, double tol, int self_test) {
  if (self_test) {
    tol = 0;
  } else {
    ferry_exec *probe = NULL;
    int rc = make_cuda(&probe);
    if (rc) return rc;
    ferry_exec_destroy(probe);
  }
  struct logit_log lh = {0}, lc = {0};
  if (run_model(dir, ferry_exec_create_host, &lh) ||
      run_model(dir, self_test ? ferry_exec_create_host : ferry_exec_create_cuda, &lc)) {
    free(lh.data);
    free(lc.data);
    return 2;
  }
  int64_t rows = lh.rows < lc.rows ? lh.rows : lc.rows, top1_same = 0, first_diff = -1;
  double worst = 0;
  for (int64_t r = 0; r < rows; r++) {
    const float *a = lh.data + r * lh.vocab, *b = lc.data + r * lc.vocab;
    double maxdiff = 0, maxabs = 0;
    for (int64_t i = 0; i < lh.vocab; i++) {
      double d = fabs((double)a[i] - (double)b[i]);
      if (!(d <= maxdiff)) maxdiff = d; /* NaN counts as the worst */
      if (fabs((double)a[i]) > maxabs) maxabs = fabs((double)a[i]);
    }
    double rel = maxdiff / (maxabs > 1e-30 ? maxabs : 1.0);
    if (!(rel <= worst)) worst = rel;
    if (argmax(a, lh.vocab) == argmax(b, lc.vocab)) top1_same++;
    else if (first_diff < 0) first_diff = r;
  }
  int ok = lh.rows == lc.rows && rows > 0 && top1_same == rows && worst <= tol;
  printf("logits: %lld rows (host %lld, %s %lld), max relative error %.3e (tolerance %.1e), same top-1 %lld/%lld%s -> %s\n",
         (long long)rows, (long long)lh.rows, self_test ? "host again" : "cuda", (long long)lc.rows, worst, tol, (long long)top1_same, (long long)rows,
         first_diff >= 0 ? " (first difference at a row; greedy decoding diverges after it)" : "", ok ? "ok" : "FAIL");
  free(lh.data);
  free(lc.data);
  return ok ? 0 : 1;
}

/* --- probe: link bandwidth and GEMM throughput into a calibrated profile --------------------- */

static double copy_gbps(ferry_exec *ex, int32_t q, struct ferry_ref dst, struct ferry_ref src, uint64_t bytes, int reps) {
  ferry_event *ev = NULL;
  if (ferry_exec_event_create(ex, &ev)) return 0;
  double best = 0;
  for (int r = 0; r < reps + 1; r++) { /* the first round warms up */
    int64_t t0 = ferry_exec_now(ex);
    if (ferry_exec_copy(ex, q, dst, src, bytes) || ferry_exec_record(ex, q, ev) || ferry_exec_sync(ex, ev)) break;
    int64_t dt = ferry_exec_now(ex) - t0;
    double gbps = dt > 0 ? (double)bytes / (double)dt : 0;
    if (r > 0 && gbps > best) best = gbps;
  }
  ferry_exec_event_destroy(ex, ev);
  return best;
}

/* TFLOP/s of y[m,n] = x[m,k] W[n,k]^T with weights of dtype wdt: after one warm-up, reps
 * products issued back to back and synchronised once, so a short product (a GEMV takes tens of
 * microseconds on a large GPU) is not charged the host's submit-to-completion round trip. */
static double gemm_tflops(ferry_exec *ex, int32_t qc, ferry_buf *d, int64_t m, int64_t n, int64_t k,
                          enum ferry_dtype wdt, int reps) {
  const uint64_t xb = (uint64_t)(m * k) * 4, wb = (uint64_t)(n * k) * (wdt == FERRY_DTYPE_F32 ? 4 : 2);
  struct ferry_kernel kk = {.kind = FERRY_K_MATMUL, .name = "probe_gemm", .layer = -1, .expert = -1, .m = m, .n = n, .k = k};
  kk.x = (struct ferry_ref){d, 0, FERRY_DTYPE_F32};
  kk.w = (struct ferry_ref){d, xb, wdt};
  kk.y = (struct ferry_ref){d, xb + wb, FERRY_DTYPE_F32};
  ferry_event *ev = NULL;
  if (ferry_exec_event_create(ex, &ev)) return 0;
  double tf = 0;
  if (ferry_exec_compute(ex, qc, &kk) || ferry_exec_record(ex, qc, ev) || ferry_exec_sync(ex, ev)) goto fail;
  const int64_t t0 = ferry_exec_now(ex);
  for (int r = 0; r < reps; r++)
    if (ferry_exec_compute(ex, qc, &kk)) goto fail;
  if (ferry_exec_record(ex, qc, ev) || ferry_exec_sync(ex, ev)) goto fail;
  const int64_t dt = ferry_exec_now(ex) - t0;
  tf = dt > 0 ? 2.0 * (double)m * (double)n * (double)k * reps / (double)dt / 1e3 : 0;
  ferry_exec_event_destroy(ex, ev);
  return tf;
fail:
  fprintf(stderr, "gpu_check: gemm probe: %s\n", ferry_exec_errmsg(ex));
  ferry_exec_event_destroy(ex, ev);
  return 0;
}

/* The calibrated profile: BASE composed with the measured link rates and GEMM/GEMV
 * efficiencies, listed under "fitted"; reloaded to check it. 0, or 2 on an I/O error. */
static int write_profile(const char *out_path, const char *base, const char *link, const char *hostp, const char *disk,
                         double h2d, double d2h, double pageable_h2d, double eff_gemm, double eff_gemv) {
  FILE *f = fopen(out_path, "w");
  if (!f) {
    fprintf(stderr, "gpu_check: cannot write %s\n", out_path);
    return 2;
  }
  /* the pageable rate only where it was measured (else the loader derives it from h2d_gbps) */
  char pageable[64] = "", pageable_fitted[40] = "";
  if (pageable_h2d > 0) {
    snprintf(pageable, sizeof pageable, ", \"pageable_h2d_gbps\": %.3f", pageable_h2d);
    snprintf(pageable_fitted, sizeof pageable_fitted, ", \"link.pageable_h2d_gbps\"");
  }
  fprintf(f,
          "{\n  \"name\": \"calibrated\",\n  \"kind\": \"gpu\",\n"
          "  \"gpu\": {\"base\": \"%s\", \"efficiency\": {\"gemm\": %.4f, \"gemv\": %.4f}},\n"
          "  \"link\": {\"base\": \"%s\", \"h2d_gbps\": %.3f, \"d2h_gbps\": %.3f%s},\n"
          "  \"host\": \"%s\",\n  \"disk\": \"%s\",\n"
          "  \"fitted\": [\"gpu.efficiency.gemm\", \"gpu.efficiency.gemv\", \"link.h2d_gbps\", \"link.d2h_gbps\"%s]\n}\n",
          base, eff_gemm, eff_gemv, link, h2d, d2h, pageable, hostp, disk, pageable_fitted);
  if (fclose(f) != 0) {
    fprintf(stderr, "gpu_check: cannot write %s\n", out_path);
    return 2;
  }
  ferry_hw *check = NULL;
  if (ferry_hw_open(&check, out_path) != FERRY_OK) return die("the written profile does not load");
  ferry_hw_close(check);
  return 0;
}

/* profile OUT.json H2D D2H EFF_GEMM EFF_GEMV [BASE LINK HOST DISK]: the profile the probe
 * writes, from given figures (the rehearsal checks the format loads and simulates). */
static int cmd_profile(int argc, char **argv) {
  if (argc < 7) {
    fprintf(stderr, "usage: gpu_check profile OUT.json H2D_GBPS D2H_GBPS EFF_GEMM EFF_GEMV [BASE LINK HOST DISK]\n");
    return 2;
  }
  double v[4];
  for (int i = 0; i < 4; i++) {
    char *end = NULL;
    v[i] = strtod(argv[3 + i], &end);
    if (!end || *end || !(v[i] > 0)) {
      fprintf(stderr, "gpu_check: profile: '%s' is not a positive number\n", argv[3 + i]);
      return 2;
    }
  }
  return write_profile(argv[2], argc > 7 ? argv[7] : "h200", argc > 8 ? argv[8] : "pcie5-x16",
                       argc > 9 ? argv[9] : "ddr5", argc > 10 ? argv[10] : "nvme-gen4", v[0], v[1], 0, v[2], v[3]);
}

static int cmd_probe(const char *out_path, const char *base, const char *link, const char *hostp, const char *disk) {
  ferry_exec *ex = NULL;
  int rc = make_cuda(&ex);
  if (rc) return rc;
  ferry_hw *hw = NULL;
  if (ferry_hw_open(&hw, base) != FERRY_OK) {
    ferry_exec_destroy(ex);
    return die("base profile");
  }
  const struct ferry_hw_profile *bp = ferry_hw_get(hw);
  const uint64_t N = 512ull << 20;
  int32_t qh, qd, qc;
  ferry_buf *h = NULL, *hp = NULL, *d = NULL;
  /* the host buffers' kinds named, not left to the configuration's default (pageable): the
   * profile's link.h2d_gbps is the pinned rate */
  if (ferry_exec_queue_create(ex, FERRY_QUEUE_H2D, &qh) || ferry_exec_queue_create(ex, FERRY_QUEUE_D2H, &qd) ||
      ferry_exec_queue_create(ex, FERRY_QUEUE_COMPUTE, &qc) ||
      ferry_exec_alloc_host(ex, N, FERRY_HOST_MEMORY_PINNED, "probe pinned host", &h) ||
      ferry_exec_alloc_host(ex, N, FERRY_HOST_MEMORY_PAGEABLE, "probe pageable host", &hp) ||
      ferry_exec_alloc(ex, FERRY_TIER_DEVICE, 2 * N, "probe device", &d)) {
    rc = die("probe set-up");
    goto out;
  }
  memset(ferry_exec_buf_host_ptr(ex, h), 0, N);
  memset(ferry_exec_buf_host_ptr(ex, hp), 0, N); /* its pages touched, as a loaded weight's are */
  struct ferry_ref rh = {h, 0, FERRY_DTYPE_U8}, rhp = {hp, 0, FERRY_DTYPE_U8}, rd = {d, 0, FERRY_DTYPE_U8};
  const double h2d = copy_gbps(ex, qh, rd, rh, N, 5), d2h = copy_gbps(ex, qd, rh, rd, N, 5);
  const double pageable_h2d = copy_gbps(ex, qh, rd, rhp, N, 5);
  /* zero the GEMM operands (device to device copies of the zeroed host buffer) */
  struct ferry_ref rd2 = {d, N, FERRY_DTYPE_U8};
  ferry_event *ev = NULL;
  if (ferry_exec_copy(ex, qh, rd2, rh, N) || ferry_exec_event_create(ex, &ev) || ferry_exec_record(ex, qh, ev) ||
      ferry_exec_sync(ex, ev)) {
    rc = die("probe zeroing");
    goto out;
  }
  ferry_exec_event_destroy(ex, ev);
  const double tf16 = gemm_tflops(ex, qc, d, 4096, 8192, 8192, FERRY_DTYPE_F16, 10);
  const double tf32 = gemm_tflops(ex, qc, d, 2048, 4096, 4096, FERRY_DTYPE_F32, 5);
  /* GEMV: one token through 8192 x 16384 fp16 weights: bytes of the weights over the time */
  const double gemv_tf = gemm_tflops(ex, qc, d, 1, 16384, 8192, FERRY_DTYPE_F16, 100);
  const double gemv_gbps = gemv_tf * 1e3; /* 2 flops and 2 bytes per fp16 weight */
  printf("probe: pinned h2d %.2f GB/s, d2h %.2f GB/s; pageable h2d %.2f GB/s; gemm fp16 %.1f TFLOP/s, fp32 %.1f "
         "TFLOP/s; gemv %.0f GB/s\n",
         h2d, d2h, pageable_h2d, tf16, tf32, gemv_gbps);
  double eff_gemm = bp->has_gpu && bp->gpu.peak_tflops.fp16 > 0 ? tf16 / bp->gpu.peak_tflops.fp16 : 0.7;
  double eff_gemv = bp->has_gpu && bp->gpu.mem_bw_gbps > 0 ? gemv_gbps / bp->gpu.mem_bw_gbps : 0.8;
  if (eff_gemm > 1) eff_gemm = 1;
  if (eff_gemv > 1) eff_gemv = 1;
  if (!(h2d > 0 && d2h > 0 && eff_gemm > 0 && eff_gemv > 0)) {
    fprintf(stderr, "gpu_check: probe measured a zero rate; not writing %s\n", out_path);
    rc = 1;
    goto out;
  }
  rc = write_profile(out_path, base, link, hostp, disk, h2d, d2h, pageable_h2d, eff_gemm, eff_gemv);
  if (rc) goto out;
  printf("probe: wrote %s\n", out_path);
out:
  ferry_hw_close(hw);
  ferry_exec_destroy(ex);
  return rc;
}

/* --- table: measured vs simulated over result databases -------------------------------------- */

struct run_figures {
  int ok;
  double ttft_ns, tpot_ns, decode_ns, decode_h2d_bytes, h2d_bytes, h2d_busy_ns;
};

static double q1(sqlite3 *db, const char *sql, int64_t run) {
  sqlite3_stmt *s = NULL;
  double v = NAN;
  if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK) {
    for (int i = 1; i <= sqlite3_bind_parameter_count(s); i++) sqlite3_bind_int64(s, i, run);
    if (sqlite3_step(s) == SQLITE_ROW && sqlite3_column_type(s, 0) != SQLITE_NULL) v = sqlite3_column_double(s, 0);
  } else {
    fprintf(stderr, "gpu_check: %s\n", sqlite3_errmsg(db));
  }
  sqlite3_finalize(s);
  return v;
}

static struct run_figures read_run(const char *path) {
  struct run_figures r = {0};
  sqlite3 *db = NULL;
  if (!path || sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
    sqlite3_close(db);
    return r;
  }
  double run = q1(db, "SELECT MAX(id) FROM runs WHERE complete = 1 AND ?1 = ?1", 0);
  if (!isnan(run)) {
    int64_t id = (int64_t)run;
    r.ok = 1;
    r.ttft_ns = q1(db, "SELECT AVG(first_token_ns - arrival_ns) FROM requests WHERE runId = ?1 AND first_token_ns >= 0", id);
    r.tpot_ns = q1(db, "SELECT AVG((finish_ns - first_token_ns) * 1.0 / (output_tokens - 1)) FROM requests "
                       "WHERE runId = ?1 AND output_tokens > 1 AND finish_ns >= 0", id);
    /* decode steps: one token per sequence */
    r.decode_ns = q1(db, "SELECT SUM(end_ns - start_ns) FROM steps WHERE runId = ?1 AND tokens = batch", id);
    r.decode_h2d_bytes = q1(db, "SELECT SUM(bytes_h2d) FROM steps WHERE runId = ?1 AND tokens = batch", id);
    r.h2d_bytes = q1(db, "SELECT SUM(m.bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY m WHERE m.runId = ?1 AND m.copyKind = 1 "
                         "AND m.start >= (SELECT MIN(start_ns) FROM steps WHERE runId = ?1 AND tokens = batch)", id);
    r.h2d_busy_ns = q1(db, "SELECT SUM(m.end - m.start) FROM CUPTI_ACTIVITY_KIND_MEMCPY m WHERE m.runId = ?1 AND m.copyKind = 1 "
                           "AND m.start >= (SELECT MIN(start_ns) FROM steps WHERE runId = ?1 AND tokens = batch)", id);
  }
  sqlite3_close(db);
  return r;
}

static void fmt_ms(char *buf, size_t n, double ns) {
  if (isnan(ns)) snprintf(buf, n, "-");
  else snprintf(buf, n, "%.2f", ns / 1e6);
}

static void fmt_err(char *buf, size_t n, double real, double sim) {
  if (isnan(real) || isnan(sim) || real <= 0) snprintf(buf, n, "-");
  else snprintf(buf, n, "%+.1f%%", 100.0 * (sim - real) / real);
}

/* table --h2d-gbps X [--goals sim] LABEL REAL.db SIM.db|- [LABEL REAL.db SIM.db|- ...]
 * --goals sim: count only the simulation goal (rows that do not stream pinned weights, whose
 * link figures are not issue 8's) */
static int cmd_table(int argc, char **argv) {
  const int goals = argc > 5 && !strcmp(argv[4], "--goals");
  const int first = goals ? 6 : 4, sim_goal_only = goals && !strcmp(argv[5], "sim");
  if ((goals && !sim_goal_only && strcmp(argv[5], "all")) || argc < first + 1 || strcmp(argv[2], "--h2d-gbps") ||
      (argc - first) % 3) {
    fprintf(stderr, "usage: gpu_check table --h2d-gbps X [--goals all|sim] LABEL REAL.db SIM.db|- ...\n");
    return 2;
  }
  const double peak = atof(argv[3]);
  /* issue 8's goals, counted over the rows that have the figure */
  int h2d_ok = 0, h2d_n = 0, floor_ok = 0, floor_n = 0, sim_ok = 0, sim_n = 0;
  printf("| config | TTFT ms real | TTFT ms sim | err | TPOT ms real | TPOT ms sim | err | H2D GB/s (of probe) | "
         "pipeline eff | decode / floor |\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (int i = first; i + 2 < argc; i += 3) {
    struct run_figures r = read_run(argv[i + 1]), s = read_run(strcmp(argv[i + 2], "-") ? argv[i + 2] : NULL);
    char a[32], b[32], c[32], d[32], e[32], f[32], g[48], h[32], k[32];
    if (!r.ok) {
      printf("| %s | (no complete run in %s) | | | | | | | | |\n", argv[i], argv[i + 1]);
      continue;
    }
    fmt_ms(a, sizeof a, r.ttft_ns);
    fmt_ms(b, sizeof b, s.ok ? s.ttft_ns : NAN);
    fmt_err(c, sizeof c, r.ttft_ns, s.ok ? s.ttft_ns : NAN);
    fmt_ms(d, sizeof d, r.tpot_ns);
    fmt_ms(e, sizeof e, s.ok ? s.tpot_ns : NAN);
    fmt_err(f, sizeof f, r.tpot_ns, s.ok ? s.tpot_ns : NAN);
    const double gbps = r.h2d_busy_ns > 0 ? r.h2d_bytes / r.h2d_busy_ns : NAN;
    if (isnan(gbps)) snprintf(g, sizeof g, "- (no decode copies)");
    else snprintf(g, sizeof g, "%.2f (%.0f%%)", gbps, peak > 0 ? 100.0 * gbps / peak : 0.0);
    if (r.decode_ns > 0 && !isnan(r.h2d_busy_ns)) snprintf(h, sizeof h, "%.2f", r.h2d_busy_ns / r.decode_ns);
    else snprintf(h, sizeof h, "-");
    const double floor_ns = peak > 0 && r.decode_h2d_bytes > 0 ? r.decode_h2d_bytes / peak : NAN;
    if (!isnan(floor_ns) && floor_ns > 0) snprintf(k, sizeof k, "%.2f", r.decode_ns / floor_ns);
    else snprintf(k, sizeof k, "-");
    if (!isnan(gbps) && peak > 0) {
      h2d_n++;
      h2d_ok += gbps >= 0.9 * peak;
    }
    const char *depth = strstr(argv[i], "_d");
    if (depth && atoi(depth + 2) >= 2 && !isnan(floor_ns) && floor_ns > 0) {
      floor_n++;
      floor_ok += r.decode_ns <= 1.15 * floor_ns;
    }
    if (s.ok && !isnan(s.tpot_ns) && !isnan(r.tpot_ns) && r.tpot_ns > 0) {
      sim_n++;
      sim_ok += fabs(s.tpot_ns - r.tpot_ns) <= 0.10 * r.tpot_ns;
    }
    printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", argv[i], a, b, c, d, e, f, g, h, k);
  }
  printf("\nTTFT/TPOT: mean per request. H2D GB/s: bytes over busy time of the host-to-device copies during "
         "decode steps. pipeline eff: H2D busy time / decode time. decode / floor: decode time / (decode H2D bytes / "
         "probed H2D GB/s).\n");
  if (sim_goal_only)
    printf("\nRows with the simulated TPOT within 10%% of the measured: %d/%d.\n", sim_ok, sim_n);
  else
    printf("\nGoals (issue 8), rows meeting each: H2D >= 90%% of the probe %d/%d; decode / floor <= 1.15 at "
           "prefetch depth >= 2 %d/%d; simulated TPOT within 10%% %d/%d.\n",
           h2d_ok, h2d_n, floor_ok, floor_n, sim_ok, sim_n);
  return 0;
}

static int usage(void) {
  fprintf(stderr,
          "usage: gpu_check kernels [--self-test]   (--self-test: host against host, checks the harness)\n"
          "       gpu_check logits MODEL_DIR [TOLERANCE] [--self-test]\n"
          "       gpu_check probe OUT.json [BASE_PROFILE LINK HOST DISK]   (default h200 pcie5-x16 ddr5 nvme-gen4)\n"
          "       gpu_check table --h2d-gbps X [--goals all|sim] LABEL REAL.db SIM.db|- ...\n"
          "       gpu_check profile OUT.json H2D_GBPS D2H_GBPS EFF_GEMM EFF_GEMV [BASE LINK HOST DISK]\n"
          "exit: 0 pass, 1 fail, 2 error, 77 no CUDA device\n");
  return 2;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage();
  if (!strcmp(argv[1], "kernels")) return cmd_kernels(argc >= 3 && !strcmp(argv[2], "--self-test"));
  if (!strcmp(argv[1], "logits") && argc >= 3)
    return cmd_logits(argv[2], argc >= 4 && strcmp(argv[3], "--self-test") ? atof(argv[3]) : 1e-2,
                      !strcmp(argv[argc - 1], "--self-test"));
  if (!strcmp(argv[1], "probe") && argc >= 3)
    return cmd_probe(argv[2], argc >= 4 ? argv[3] : "h200", argc >= 5 ? argv[4] : "pcie5-x16",
                     argc >= 6 ? argv[5] : "ddr5", argc >= 7 ? argv[6] : "nvme-gen4");
  if (!strcmp(argv[1], "table")) return cmd_table(argc, argv);
  if (!strcmp(argv[1], "profile")) return cmd_profile(argc, argv);
  return usage();
}
