/* Calibration: a non-negative least-squares fit of per-kernel-kind costs, the probe that
 * measures this machine through the host executor itself (so the costs include the executor's
 * own overheads), and the profile writer. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/fsutil.h"
#include "common/half.h"
#include "common/json.h"
#include "common/rng.h"
#include "common/units.h"
#include "ferry/calibrate.h"
#include "ferry/exec.h"
#include "ferry/store.h"
#include "sim/calibrate_contend.h"
#include "sim/hw_internal.h"

/* ---- fit ------------------------------------------------------------------------------------ */

/* Solve the k x k system a x = b in place (Gaussian elimination, partial pivoting). */
static int solve(double a[3][3], double b[3], int k) {
  for (int c = 0; c < k; c++) {
    int p = c;
    for (int r = c + 1; r < k; r++)
      if (fabs(a[r][c]) > fabs(a[p][c])) p = r;
    if (fabs(a[p][c]) < 1e-300) return -1;
    if (p != c) {
      for (int j = 0; j < k; j++) {
        double t = a[c][j];
        a[c][j] = a[p][j];
        a[p][j] = t;
      }
      double t = b[c];
      b[c] = b[p];
      b[p] = t;
    }
    for (int r = c + 1; r < k; r++) {
      double f = a[r][c] / a[c][c];
      for (int j = c; j < k; j++) a[r][j] -= f * a[c][j];
      b[r] -= f * b[c];
    }
  }
  for (int c = k - 1; c >= 0; c--) {
    for (int j = c + 1; j < k; j++) b[c] -= a[c][j] * b[j];
    b[c] /= a[c][c];
  }
  return 0;
}

/* Relative least squares: each op's error counts in proportion to its own duration, so the
 * many small decode ops are fitted as well as the few large prefill ones. */
static double weight(double duration_ns) {
  double d = duration_ns > 1000.0 ? duration_ns : 1000.0;
  return 1.0 / (d * d);
}

/* Best non-negative fit of duration = c0 + c1 * x1 + c2 * x2 where, per sample, x1 is its bytes
 * when regime[i] is 0 (else 0) and x2 its flops when regime[i] is 1 (else 0); NULL regime: both.
 * Every subset of free coefficients is tried. Returns the weighted SSE (INFINITY: no fit). */
static double fit_masked(const struct ferry_calib_sample *s, size_t n, const uint8_t *regime, const double scale[3],
                         double best[3]) {
  double best_sse = INFINITY;
  for (int mask = 1; mask < 8; mask++) {
    int cols[3], k = 0;
    for (int c = 0; c < 3; c++)
      if ((mask >> c & 1) && scale[c] > 0) cols[k++] = c;
    if (!k) continue;
    double a[3][3] = {{0}}, b[3] = {0};
    for (size_t i = 0; i < n; i++) {
      double x[3] = {1.0, (!regime || regime[i] == 0) ? s[i].bytes / scale[1] : 0,
                     (!regime || regime[i] == 1) ? s[i].flops / scale[2] : 0};
      double wt = weight(s[i].duration_ns);
      for (int p = 0; p < k; p++) {
        b[p] += wt * x[cols[p]] * s[i].duration_ns;
        for (int q = 0; q < k; q++) a[p][q] += wt * x[cols[p]] * x[cols[q]];
      }
    }
    if (solve(a, b, k)) continue;
    int feasible = 1;
    for (int p = 0; p < k; p++) feasible &= b[p] >= 0;
    if (!feasible) continue;
    double coef[3] = {0, 0, 0};
    for (int p = 0; p < k; p++) coef[cols[p]] = b[p];
    double sse = 0;
    for (size_t i = 0; i < n; i++) {
      double xb = s[i].bytes / scale[1] * coef[1], xf = s[i].flops / scale[2] * coef[2];
      double pred = coef[0] + (regime ? (xb > xf ? xb : xf) : xb + xf);
      sse += weight(s[i].duration_ns) * (pred - s[i].duration_ns) * (pred - s[i].duration_ns);
    }
    if (sse < best_sse) {
      best_sse = sse;
      memcpy(best, coef, 3 * sizeof *best);
    }
  }
  return best_sse;
}

/* The roofline form's refinement: alternately give every op to the bound (bytes or flops) that
 * dominates for it and refit, until the assignment settles; best[] holds the best coefficients
 * seen, scored as the simulator uses them (overhead + the larger term). Returns their error. */
static double refine_roofline(const struct ferry_calib_sample *s, size_t n, const double sc[3], double best[3],
                              double best_sse) {
  double cur[3];
  uint8_t *regime = ferry_malloc(n ? n : 1);
  if (regime && isfinite(best_sse)) {
    memcpy(cur, best, sizeof cur);
    for (int iter = 0; iter < 20; iter++) {
      int changed = 0;
      for (size_t i = 0; i < n; i++) {
        uint8_t r = s[i].flops / sc[2] * cur[2] > s[i].bytes / sc[1] * cur[1];
        changed |= iter == 0 || r != regime[i];
        regime[i] = r;
      }
      if (!changed) break;
      double next[3] = {0, 0, 0};
      double sse = fit_masked(s, n, regime, sc, next);
      if (!isfinite(sse)) break;
      memcpy(cur, next, sizeof cur);
      /* score the candidate as the simulator will use it: overhead + max of the two terms */
      double full = 0;
      for (size_t i = 0; i < n; i++) {
        double xb = s[i].bytes / sc[1] * cur[1], xf = s[i].flops / sc[2] * cur[2];
        double pred = cur[0] + (xb > xf ? xb : xf);
        full += weight(s[i].duration_ns) * (pred - s[i].duration_ns) * (pred - s[i].duration_ns);
      }
      if (full < best_sse) {
        best_sse = full;
        memcpy(best, cur, sizeof cur);
      }
    }
  }
  ferry_free(regime);
  return best_sse;
}

static double log_r2(const struct ferry_calib_sample *s, size_t n, const struct ferry_hw_cost *c) {
  /* the share of the variance of the log durations the fit explains: how well it tells each
   * op's duration relative to the others (the relative error the fit minimises); on logs, an
   * op the OS descheduled for a few milliseconds does not drown the rest */
  double mean = 0, sst = 0, sse = 0;
  for (size_t i = 0; i < n; i++) mean += log(fmax(s[i].duration_ns, 1.0));
  mean /= (double)n;
  for (size_t i = 0; i < n; i++) {
    double xb = s[i].bytes * c->ns_per_byte, xf = s[i].flops * c->ns_per_flop;
    double pred = c->overhead_ns + (c->roofline ? (xb > xf ? xb : xf) : xb + xf);
    double lm = log(fmax(s[i].duration_ns, 1.0)), lp = log(fmax(pred, 1.0));
    sst += (lm - mean) * (lm - mean);
    sse += (lp - lm) * (lp - lm);
  }
  return sst > 0 ? 1.0 - sse / sst : 1.0;
}

ferry_status ferry_calibrate_fit(const struct ferry_calib_sample *s, size_t n, struct ferry_hw_cost *out, double *r2) {
  if (!s || !n || !out) return ferry__fail(FERRY_ERR_INVALID, "calibrate: no samples to fit");
  /* columns scaled to comparable magnitudes for conditioning */
  double scale[3] = {1, 1e-300, 1e-300};
  for (size_t i = 0; i < n; i++) {
    if (s[i].bytes > scale[1]) scale[1] = s[i].bytes;
    if (s[i].flops > scale[2]) scale[2] = s[i].flops;
  }
  if (scale[1] <= 1e-300) scale[1] = 0;
  if (scale[2] <= 1e-300) scale[2] = 0;
  const double sc[3] = {1, scale[1] > 0 ? scale[1] : 1, scale[2] > 0 ? scale[2] : 1};
  /* The roofline shape: each op is bound by its bytes or by its flops, whichever costs more.
   * Start from a plain linear fit, then alternate: give every op to the bound that dominates
   * for it, refit, until the assignment settles. */
  /* the sum form: both terms paid (a CPU converting weights, then multiplying) */
  double sum_coef[3] = {0, 0, 0};
  const double sum_sse = fit_masked(s, n, NULL, sc, sum_coef);
  /* the roofline form, started from the sum fit and scored as max */
  double best[3] = {0, 0, 0};
  memcpy(best, sum_coef, sizeof best);
  double best_sse = INFINITY;
  if (isfinite(sum_sse)) {
    best_sse = 0;
    for (size_t i = 0; i < n; i++) {
      double xb = s[i].bytes / sc[1] * best[1], xf = s[i].flops / sc[2] * best[2];
      double pred = best[0] + (xb > xf ? xb : xf);
      best_sse += weight(s[i].duration_ns) * (pred - s[i].duration_ns) * (pred - s[i].duration_ns);
    }
  }
  best_sse = refine_roofline(s, n, sc, best, best_sse);
  out->roofline = 1;
  if (isfinite(sum_sse) && sum_sse <= best_sse) {
    memcpy(best, sum_coef, sizeof best);
    best_sse = sum_sse;
    out->roofline = 0;
  }
  if (!isfinite(best_sse)) {
    /* degenerate: a constant */
    double mean = 0;
    for (size_t i = 0; i < n; i++) mean += s[i].duration_ns;
    best[0] = mean / (double)n;
    best_sse = 0;
  } else {
    /* Relative least squares fits the shape across op sizes but comes out low on the whole
     * (a minimiser of relative error sits below the mean of noisy durations); a run's latency
     * is a sum of durations, so scale the fit to the measured total. */
    double measured = 0, predicted = 0;
    for (size_t i = 0; i < n; i++) {
      double xb = s[i].bytes / sc[1] * best[1], xf = s[i].flops / sc[2] * best[2];
      predicted += best[0] + (out->roofline ? (xb > xf ? xb : xf) : xb + xf);
      measured += s[i].duration_ns;
    }
    if (predicted > 0 && measured > 0) {
      const double f = measured / predicted;
      for (int j = 0; j < 3; j++) best[j] *= f;
      best_sse = 0;
      for (size_t i = 0; i < n; i++) {
        double xb = s[i].bytes / sc[1] * best[1], xf = s[i].flops / sc[2] * best[2];
        double pred = best[0] + (out->roofline ? (xb > xf ? xb : xf) : xb + xf);
        best_sse += weight(s[i].duration_ns) * (pred - s[i].duration_ns) * (pred - s[i].duration_ns);
      }
    }
  }
  out->overhead_ns = best[0];
  out->ns_per_byte = scale[1] > 0 ? best[1] / sc[1] : 0;
  out->ns_per_flop = scale[2] > 0 ? best[2] / sc[2] : 0;
  if (r2) *r2 = log_r2(s, n, out);
  return FERRY_OK;
}

/* ---- probe ---------------------------------------------------------------------------------- */

struct probe {
  ferry_exec *ex;
  int32_t q_compute, q_h2d, q_d2h, q_disk;
  ferry_event *ev;
  pthread_mutex_t mu;
  struct ferry_activity last; /* the last op's record */
  int64_t last_ns, last_start;
  FILE *progress;
};

static void probe_sink(void *user, const struct ferry_activity *a) {
  struct probe *p = user;
  if (a->kind != FERRY_ACT_KERNEL && a->kind != FERRY_ACT_MEMCPY) return;
  pthread_mutex_lock(&p->mu);
  p->last = *a;
  p->last_ns = a->end_ns - a->start_ns;
  p->last_start = a->start_ns;
  pthread_mutex_unlock(&p->mu);
}

/* Wait for the op just enqueued on q and return its sample. */
static ferry_status finish(struct probe *p, int32_t q, struct ferry_calib_sample *out) {
  ferry_status st = ferry_exec_record(p->ex, q, p->ev);
  if (st == FERRY_OK) st = ferry_exec_sync(p->ex, p->ev);
  if (st != FERRY_OK) return ferry__fail(st, "calibrate: %s", ferry_exec_errmsg(p->ex));
  pthread_mutex_lock(&p->mu);
  out->bytes = (double)p->last.bytes;
  out->flops = p->last.flops;
  out->duration_ns = (double)p->last_ns;
  pthread_mutex_unlock(&p->mu);
  return FERRY_OK;
}

struct samples {
  struct ferry_calib_sample *v;
  size_t n, cap;
};

static int push(struct samples *s, struct ferry_calib_sample x) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 64;
    struct ferry_calib_sample *v = ferry__reallocarray(s->v, cap, sizeof *v);
    if (!v) return -1;
    s->v = v;
    s->cap = cap;
  }
  s->v[s->n++] = x;
  return 0;
}

static void fill_random(void *ptr, size_t floats, enum ferry_dtype dt, uint64_t seed) {
  struct ferry_rng r;
  ferry__rng_seed(&r, seed);
  for (size_t i = 0; i < floats; i++) {
    float v = (float)(ferry__rng_uniform(&r) - 0.5) * 0.1f;
    if (dt == FERRY_DTYPE_F16) ((uint16_t *)ptr)[i] = ferry__f32_to_f16(v);
    else if (dt == FERRY_DTYPE_BF16) ((uint16_t *)ptr)[i] = ferry__f32_to_bf16(v);
    else ((float *)ptr)[i] = v;
  }
}

#define REPS 3

/* Latency from the smallest transfers (median), bandwidth from the largest (median of
 * bytes / time): fitting one line across sizes that live in caches and sizes that stream from
 * DRAM would blur both. */
static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void latency_bandwidth(const struct ferry_calib_sample *s, size_t n, struct ferry_hw_cost *fit) {
  double small = INFINITY, large = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i].bytes < small) small = s[i].bytes;
    if (s[i].bytes > large) large = s[i].bytes;
  }
  double lat[16], rate[16];
  size_t nl = 0, nr = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i].bytes == small && nl < 16) lat[nl++] = s[i].duration_ns;
    if (s[i].bytes == large && nr < 16) rate[nr++] = s[i].duration_ns / s[i].bytes;
  }
  qsort(lat, nl, sizeof *lat, cmp_dbl);
  qsort(rate, nr, sizeof *rate, cmp_dbl);
  fit->overhead_ns = nl ? lat[nl / 2] : 0;
  fit->ns_per_byte = nr ? rate[nr / 2] : 0;
  fit->ns_per_flop = 0;
}

/* Copies of several sizes on one queue: latency + bytes / bandwidth. */
static ferry_status probe_copies(struct probe *p, ferry_buf *host, ferry_buf *dev, int32_t q, int to_device,
                                 struct ferry_hw_cost *fit) {
  static const uint64_t sizes[] = {4096, 65536, 1u << 20, 8u << 20, 32u << 20, 64u << 20};
  struct samples s = {0};
  ferry_status st = FERRY_OK;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && st == FERRY_OK; i++)
    for (int r = 0; r < REPS + 1 && st == FERRY_OK; r++) {
      struct ferry_ref h = {host, 0, FERRY_DTYPE_U8}, d = {dev, 0, FERRY_DTYPE_U8};
      st = to_device ? ferry_exec_copy(p->ex, q, d, h, sizes[i]) : ferry_exec_copy(p->ex, q, h, d, sizes[i]);
      struct ferry_calib_sample x = {0, 0, 0};
      if (st == FERRY_OK) st = finish(p, q, &x);
      if (st == FERRY_OK && r > 0 && push(&s, x)) st = ferry__fail(FERRY_ERR_NOMEM, "calibrate: out of memory");
    }
  if (st == FERRY_OK) latency_bandwidth(s.v, s.n, fit);
  ferry_free(s.v);
  return st;
}

/* O_DIRECT reads of a scratch file written in dir. */
static ferry_status probe_disk(struct probe *p, const char *dir, ferry_buf *host, struct ferry_hw_cost *fit) {
  const uint64_t file_bytes = 256u << 20;
  char *sub = ferry__path_join(dir, ".ferry-calibrate");
  if (!sub) return ferry__fail(FERRY_ERR_NOMEM, "calibrate: out of memory");
  ferry_status st = ferry__mkdir_p(sub, NULL);
  ferry_store_writer *w = NULL;
  ferry_store *store = NULL;
  struct samples s = {0};
  char *chunk = NULL;
  if (st != FERRY_OK) goto out;
  int64_t shape[1] = {(int64_t)file_bytes};
  if ((st = ferry_store_writer_create(&w, sub, 0)) || (st = ferry_store_writer_add(w, "probe", FERRY_DTYPE_U8, 1, shape)))
    goto out;
  chunk = ferry_malloc(8u << 20);
  if (!chunk) {
    st = ferry__fail(FERRY_ERR_NOMEM, "calibrate: out of memory");
    goto out;
  }
  for (size_t i = 0; i < (8u << 20); i++) chunk[i] = (char)(i * 131);
  for (uint64_t done = 0; done < file_bytes && st == FERRY_OK; done += 8u << 20) st = ferry_store_writer_write(w, chunk, 8u << 20);
  if (st == FERRY_OK) st = ferry_store_writer_finish(w);
  if (st == FERRY_OK) st = ferry_store_open(&store, sub);
  if (st != FERRY_OK) goto out;
  const struct ferry_store_tensor *t = ferry_store_tensor_at(store, 0);
  static const uint64_t sizes[] = {4096, 65536, 1u << 20, 8u << 20, 32u << 20, 64u << 20};
  uint64_t offset = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && st == FERRY_OK; i++)
    for (int r = 0; r < REPS && st == FERRY_OK; r++) {
      /* a fresh part of the file each time, so nothing is served from a cache */
      offset = (offset + sizes[i] + 12345) % (t->nbytes - sizes[i]);
      st = ferry_exec_read(p->ex, p->q_disk, store, t->file, t->offset + offset, sizes[i],
                           (struct ferry_ref){host, 0, FERRY_DTYPE_U8}, FERRY_READ_DIRECT);
      struct ferry_calib_sample x = {0, 0, 0};
      if (st == FERRY_OK) st = finish(p, p->q_disk, &x);
      if (st == FERRY_OK && push(&s, x)) st = ferry__fail(FERRY_ERR_NOMEM, "calibrate: out of memory");
    }
  if (st == FERRY_OK) latency_bandwidth(s.v, s.n, fit);
out:
  ferry_store_close(store);
  ferry_store_writer_free(w);
  ferry_free(chunk);
  ferry_free(s.v);
  ferry__rm_rf(sub);
  ferry_free(sub);
  return st;
}

/* Kernels at engine-like shapes. Buffers: x/y activations, w weights, aux workspace. */
struct kbufs {
  ferry_buf *x, *y, *w, *w2, *w3, *a0, *a1, *a2, *a3, *ints;
};

static ferry_status run_kernel(struct probe *p, struct ferry_kernel *k, struct samples *s) {
  ferry_status st = FERRY_OK;
  for (int r = 0; r < REPS + 1 && st == FERRY_OK; r++) {
    st = ferry_exec_compute(p->ex, p->q_compute, k);
    struct ferry_calib_sample x = {0, 0, 0};
    if (st == FERRY_OK) st = finish(p, p->q_compute, &x);
    else st = ferry__fail(st, "calibrate: %s", ferry_exec_errmsg(p->ex));
    if (st == FERRY_OK && r > 0 && push(s, x)) st = ferry__fail(FERRY_ERR_NOMEM, "calibrate: out of memory");
  }
  return st;
}

/* The element-wise kinds (norm, rope, activation, router, combine, gather, embed) at a few sizes. */
static ferry_status probe_elementwise(struct probe *p, const struct kbufs *b, enum ferry_dtype wdt, int32_t *ids,
                                      struct samples *s) {
  struct ferry_ref X = {b->x, 0, FERRY_DTYPE_F32}, Y = {b->y, 0, FERRY_DTYPE_F32};
  ferry_status st = FERRY_OK;
  for (int64_t m = 1; m <= 256 && st == FERRY_OK; m *= 16) {
    for (int64_t t = 0; t < m; t++) ids[t] = (int32_t)t, ids[256 + t] = (int32_t)t;
    struct ferry_kernel norm = {.kind = FERRY_K_NORM, .name = "norm", .layer = -1, .expert = -1, .m = m, .n = 2048,
                                .x = X, .y = Y, .w = {b->w, 0, wdt}, .eps = 1e-5f};
    struct ferry_kernel rope = {.kind = FERRY_K_ROPE, .name = "rope", .layer = -1, .expert = -1, .m = m, .x = X,
                                .ints = ids, .n_ints = m, .heads = 16, .kv_heads = 4, .head_dim = 64, .theta = 1e4};
    rope.aux[0] = (struct ferry_ref){b->a0, 0, FERRY_DTYPE_F32};
    struct ferry_kernel act = {.kind = FERRY_K_SWIGLU, .name = "activation", .layer = -1, .expert = -1, .m = m,
                               .n = 4096, .x = X, .y = Y, .fn = FERRY_FN_SILU_MUL};
    act.aux[0] = (struct ferry_ref){b->a0, 0, FERRY_DTYPE_F32};
    struct ferry_kernel router = {.kind = FERRY_K_ROUTER, .name = "router", .layer = -1, .expert = -1, .m = m, .n = 64,
                                  .x = X, .y = Y, .top_k = 4, .renormalize = 1};
    router.aux[0] = (struct ferry_ref){b->a0, 0, FERRY_DTYPE_I32};
    struct ferry_kernel comb = {.kind = FERRY_K_MOE_COMBINE, .name = "moe_combine", .layer = -1, .expert = -1, .m = m,
                                .n = 2048, .y = Y, .top_k = 2};
    comb.aux[0] = (struct ferry_ref){b->a0, 0, FERRY_DTYPE_F32};
    comb.aux[1] = (struct ferry_ref){b->a1, 0, FERRY_DTYPE_F32};
    struct ferry_kernel gather = {.kind = FERRY_K_GATHER_ROWS, .name = "gather_rows", .layer = -1, .expert = -1,
                                  .m = m, .n = 2048, .x = X, .y = Y, .ints = ids, .n_ints = m};
    struct ferry_kernel embed = {.kind = FERRY_K_EMBED, .name = "embed", .layer = -1, .expert = -1, .m = m, .n = 2048,
                                 .y = Y, .w = {b->w, 0, wdt}, .ints = ids, .ints2 = ids, .n_ints = m};
    if ((st = run_kernel(p, &norm, &s[3])) || (st = run_kernel(p, &rope, &s[4])) || (st = run_kernel(p, &act, &s[5])) ||
        (st = run_kernel(p, &router, &s[6])) || (st = run_kernel(p, &comb, &s[7])) ||
        (st = run_kernel(p, &gather, &s[8])) || (st = run_kernel(p, &embed, &s[9])))
      break;
  }
  return st;
}

/* Matrix-vector and matrix-matrix products are priced apart (kinds "<kind>_gemm"): the samples
 * above the GEMM intensity move to the _gemm kind. */
static ferry_status split_gemm(struct samples *s) {
  static const int split[][2] = {{0, 11}, {2, 12}};
  ferry_status st = FERRY_OK;
  for (int k = 0; k < 2 && st == FERRY_OK; k++) {
    struct samples *lo = &s[split[k][0]], *hi = &s[split[k][1]];
    size_t keep = 0;
    for (size_t j = 0; j < lo->n && st == FERRY_OK; j++) {
      struct ferry_calib_sample x = lo->v[j];
      if (x.bytes > 0 && x.flops / x.bytes > FERRY_HW_GEMM_INTENSITY) {
        if (push(hi, x)) st = ferry__fail(FERRY_ERR_NOMEM, "calibrate: out of memory");
      } else {
        lo->v[keep++] = x;
      }
    }
    lo->n = keep;
  }
  return st;
}

static ferry_status probe_kernels(struct probe *p, const struct kbufs *b, enum ferry_dtype wdt, int32_t *ids,
                                  struct ferry_hw_profile *out, double *best_gflops) {
  struct samples s[FERRY_HW_COST_KINDS];
  memset(s, 0, sizeof s);
  ferry_status st = FERRY_OK;
  struct ferry_ref X = {b->x, 0, FERRY_DTYPE_F32}, Y = {b->y, 0, FERRY_DTYPE_F32}, Wt = {b->w, 0, wdt};
  /* matmul: decode (m = 1) and batched shapes */
  static const int64_t mm[][3] = {{1, 1024, 1024}, {1, 4096, 1024}, {1, 1024, 4096}, {4, 2048, 1024},
                                  {16, 1024, 1024}, {64, 2048, 1024}, {256, 1024, 1024}};
  for (size_t i = 0; i < sizeof mm / sizeof mm[0] && st == FERRY_OK; i++) {
    struct ferry_kernel k = {.kind = FERRY_K_MATMUL, .name = "matmul", .layer = -1, .expert = -1, .m = mm[i][0],
                             .n = mm[i][1], .k = mm[i][2], .x = X, .y = Y, .w = Wt};
    size_t before = s[0].n;
    st = run_kernel(p, &k, &s[0]);
    for (size_t j = before; j < s[0].n; j++) {
      double g = s[0].v[j].flops / s[0].v[j].duration_ns;
      if (g > *best_gflops) *best_gflops = g;
    }
  }
  /* expert FFN over m routed tokens */
  for (int64_t m = 1; m <= 64 && st == FERRY_OK; m *= 4) {
    for (int64_t i = 0; i < m; i++) ids[i] = (int32_t)i, ids[256 + i] = 0;
    struct ferry_kernel k = {.kind = FERRY_K_EXPERT, .name = "expert", .layer = -1, .expert = 0, .m = m, .n = 1024,
                             .k = 1024, .x = X, .y = Y, .w = Wt, .top_k = 1, .ints = ids, .ints2 = ids + 256,
                             .n_ints = m};
    k.aux[0] = (struct ferry_ref){b->w2, 0, wdt};
    k.aux[1] = (struct ferry_ref){b->w3, 0, wdt};
    k.aux[2] = (struct ferry_ref){b->a0, 0, FERRY_DTYPE_F32};
    k.aux[3] = (struct ferry_ref){b->a1, 0, FERRY_DTYPE_F32};
    k.aux[4] = (struct ferry_ref){b->a2, 0, FERRY_DTYPE_F32};
    st = run_kernel(p, &k, &s[2]);
  }
  /* attention: decode over growing contexts and a prefill chunk; fp16 cache */
  static const int64_t ctx[][2] = {{1, 128}, {1, 1024}, {1, 4096}, {8, 512}, {64, 64}};
  for (size_t i = 0; i < sizeof ctx / sizeof ctx[0] && st == FERRY_OK; i++) {
    int64_t m = ctx[i][0], pos0 = ctx[i][1], total = 0;
    for (int64_t t = 0; t < m; t++) {
      ids[t] = (int32_t)(pos0 + t);
      ids[256 + t] = 0;
      total += pos0 + t + 1;
    }
    struct ferry_kernel k = {.kind = FERRY_K_ATTENTION, .name = "attention", .layer = 0, .expert = -1, .m = m, .x = X,
                             .y = Y, .ints = ids, .ints2 = ids + 256, .n_ints = m, .heads = 16, .kv_heads = 4,
                             .head_dim = 64, .kv_capacity = 4200, .context_tokens = total};
    k.aux[0] = (struct ferry_ref){b->a0, 0, FERRY_DTYPE_F32};
    k.aux[1] = (struct ferry_ref){b->a1, 0, FERRY_DTYPE_F32};
    k.aux[2] = (struct ferry_ref){b->a2, 0, FERRY_DTYPE_F16};
    k.aux[3] = (struct ferry_ref){b->a3, 0, FERRY_DTYPE_F16};
    st = run_kernel(p, &k, &s[1]);
  }
  if (st == FERRY_OK) st = probe_elementwise(p, b, wdt, ids, s);
  if (st == FERRY_OK) st = split_gemm(s);
  for (int i = 0; i < FERRY_HW_COST_KINDS && st == FERRY_OK; i++) {
    if (!s[i].n) continue;
    st = ferry_calibrate_fit(s[i].v, s[i].n, &out->cost[i], &out->cost[i].r2);
    if (st == FERRY_OK) out->cost_set |= 1u << i;
  }
  for (int i = 0; i < FERRY_HW_COST_KINDS; i++) ferry_free(s[i].v);
  out->has_cost = 1;
  return st;
}

/* The host thread's own costs: issuing an op (enqueue only, the queue thread runs it later),
 * and the round trip of waiting for an event on an idle queue (queue thread and host wake-ups). */
static ferry_status probe_host_overheads(struct probe *p, ferry_buf *host, ferry_buf *dev, int64_t *submit_ns,
                                         int64_t *sync_ns, int64_t *wake_ns) {
  struct ferry_ref d = {dev, 0, FERRY_DTYPE_U8}, h = {host, 0, FERRY_DTYPE_U8};
  ferry_status st = FERRY_OK;
  const int n_submit = 2000, n_sync = 500;
  double best_submit = INFINITY;
  for (int rep = 0; rep < 3 && st == FERRY_OK; rep++) {
    int64_t t0 = ferry__mono_ns();
    for (int i = 0; i < n_submit && st == FERRY_OK; i++) st = ferry_exec_copy(p->ex, p->q_h2d, d, h, 64);
    double per = (double)(ferry__mono_ns() - t0) / n_submit;
    if (per < best_submit) best_submit = per;
    if (st == FERRY_OK) st = ferry_exec_drain(p->ex);
  }
  double lat[500];
  for (int i = 0; i < n_sync && st == FERRY_OK; i++) {
    int64_t t0 = ferry__mono_ns();
    if ((st = ferry_exec_record(p->ex, p->q_compute, p->ev)) == FERRY_OK) st = ferry_exec_sync(p->ex, p->ev);
    lat[i] = (double)(ferry__mono_ns() - t0);
  }
  if (st != FERRY_OK) return ferry__fail(st, "calibrate: %s", ferry_exec_errmsg(p->ex));
  qsort(lat, n_sync, sizeof *lat, cmp_dbl);
  *submit_ns = (int64_t)llround(best_submit);
  *sync_ns = (int64_t)llround(lat[n_sync / 2]);
  /* an idle queue's wake-up: from submitting a copy to an idle queue to the copy starting */
  for (int i = 0; i < n_sync && st == FERRY_OK; i++) {
    int64_t t0 = ferry_exec_now(p->ex);
    if ((st = ferry_exec_copy(p->ex, p->q_h2d, d, h, 64)) == FERRY_OK &&
        (st = ferry_exec_record(p->ex, p->q_h2d, p->ev)) == FERRY_OK && (st = ferry_exec_sync(p->ex, p->ev)) == FERRY_OK) {
      pthread_mutex_lock(&p->mu);
      lat[i] = (double)(p->last_start - t0);
      pthread_mutex_unlock(&p->mu);
    }
  }
  if (st != FERRY_OK) return ferry__fail(st, "calibrate: %s", ferry_exec_errmsg(p->ex));
  qsort(lat, n_sync, sizeof *lat, cmp_dbl);
  *wake_ns = (int64_t)llround(lat[n_sync / 2] > 0 ? lat[n_sync / 2] : 0);
  /* the round trip includes the queue's wake-up, which the simulator charges separately */
  *sync_ns = *sync_ns > *wake_ns ? *sync_ns - *wake_ns : 0;
  return FERRY_OK;
}

/* The profile a probe measured: the host executor's "device" is this CPU and its RAM. */
static void fill_probe_profile(struct ferry_hw_profile *out, const char *dir, const struct ferry_hw_cost *h2d,
                               const struct ferry_hw_cost *d2h, const struct ferry_hw_cost *disk, double best_gflops,
                               int64_t submit_ns, int64_t sync_ns, int64_t wake_ns) {
  snprintf(out->name, sizeof out->name, "host-probe");
  out->kind = FERRY_HW_KIND_GPU;
  out->has_gpu = out->has_link = out->has_host = out->has_disk = 1;
  char hostname[40] = "this machine"; /* "CPU of " + 39 + " (host executor)" fits gpu.name[64] */
  gethostname(hostname, sizeof hostname - 1);
  snprintf(out->gpu.name, sizeof out->gpu.name, "CPU of %.30s (host executor)", hostname);
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  uint64_t ram = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 1ull << 34;
  const double memcpy_gbps = h2d->ns_per_byte > 0 ? 1.0 / h2d->ns_per_byte : 10.0;
  out->gpu.memory_bytes = ram;
  out->gpu.mem_bw_gbps = 2.0 * memcpy_gbps; /* a copy reads and writes each byte */
  out->gpu.peak_tflops.fp32 = out->gpu.peak_tflops.fp16 = out->gpu.peak_tflops.bf16 = best_gflops / 1e3;
  out->gpu.launch_overhead_ns = (int64_t)llround(out->cost[3].overhead_ns);
  out->gpu.efficiency = (struct ferry_hw_efficiency){1, 1, 1, 1, 1};
  snprintf(out->link.name, sizeof out->link.name, "memcpy (host executor copy queues)");
  out->link.h2d_gbps = memcpy_gbps;
  out->link.d2h_gbps = d2h->ns_per_byte > 0 ? 1.0 / d2h->ns_per_byte : memcpy_gbps;
  out->link.pageable_h2d_gbps = out->link.h2d_gbps;
  out->link.latency_ns = (int64_t)llround(h2d->overhead_ns);
  out->link.copy_engines = 1;
  snprintf(out->host.name, sizeof out->host.name, "RAM of %.40s", hostname);
  out->host.dram_gbps = out->gpu.mem_bw_gbps;
  out->host.cpu_gflops = best_gflops;
  out->host.memory_bytes = ram;
  out->host.submit_ns = submit_ns;
  out->host.sync_ns = sync_ns;
  out->host.queue_wake_ns = wake_ns;
  /* not measured: the catalogue's default, written as such (the profile's file says every figure
   * its reader will use; a 0 here would be written as a measured 0) */
  out->host.cpu_op_ns = FERRY_HW_CPU_OP_NS;
  snprintf(out->disk.name, sizeof out->disk.name, "O_DIRECT reads in %.40s", dir);
  out->disk.read_gbps = disk->ns_per_byte > 0 ? 1.0 / disk->ns_per_byte : 1.0;
  out->disk.latency_ns = (int64_t)llround(disk->overhead_ns);
  out->disk.queue_depth = 1;
  /* the host executor issues its own ops: their cost is host.submit_ns; it expands quantized
   * weights before multiplying */
  out->has_runtime = 1;
  snprintf(out->runtime.name, sizeof out->runtime.name, "ferry host executor");
  out->runtime.fused_dequant = 0;
  out->runtime.act_bytes = out->runtime.dequant_bytes = 4; /* it computes in fp32 */
}

/* The kernels' buffers (the executor frees them with itself), filled with random values. */
static ferry_status alloc_kbufs(struct probe *p, struct kbufs *b) {
  const uint64_t act_bytes = 256u * 8192u * 4u, w_bytes = 4096u * 4096u * 2u;
  const uint64_t kv_bytes = 4200u * 4u * 64u * 2u;
  ferry_status st;
  if ((st = ferry_exec_alloc(p->ex, FERRY_TIER_DEVICE, act_bytes, "x", &b->x)) ||
      (st = ferry_exec_alloc(p->ex, FERRY_TIER_DEVICE, act_bytes * 4, "y", &b->y)) ||
      (st = ferry_exec_alloc(p->ex, FERRY_TIER_DEVICE, w_bytes, "w", &b->w)) ||
      (st = ferry_exec_alloc(p->ex, FERRY_TIER_DEVICE, w_bytes, "w2", &b->w2)) ||
      (st = ferry_exec_alloc(p->ex, FERRY_TIER_DEVICE, w_bytes, "w3", &b->w3)) ||
      (st = ferry_exec_alloc(p->ex, FERRY_TIER_DEVICE, act_bytes * 4, "a0", &b->a0)) ||
      (st = ferry_exec_alloc(p->ex, FERRY_TIER_DEVICE, act_bytes * 4, "a1", &b->a1)) ||
      (st = ferry_exec_alloc(p->ex, FERRY_TIER_DEVICE, act_bytes > kv_bytes ? act_bytes : kv_bytes, "a2", &b->a2)) ||
      (st = ferry_exec_alloc(p->ex, FERRY_TIER_DEVICE, act_bytes > kv_bytes ? act_bytes : kv_bytes, "a3", &b->a3)))
    return st;
  fill_random(ferry_exec_buf_host_ptr(p->ex, b->x), act_bytes / 4, FERRY_DTYPE_F32, 1);
  fill_random(ferry_exec_buf_host_ptr(p->ex, b->w), w_bytes / 2, FERRY_DTYPE_F16, 2);
  fill_random(ferry_exec_buf_host_ptr(p->ex, b->w2), w_bytes / 2, FERRY_DTYPE_F16, 3);
  fill_random(ferry_exec_buf_host_ptr(p->ex, b->w3), w_bytes / 2, FERRY_DTYPE_F16, 4);
  fill_random(ferry_exec_buf_host_ptr(p->ex, b->a0), act_bytes, FERRY_DTYPE_F32, 5);
  fill_random(ferry_exec_buf_host_ptr(p->ex, b->a1), act_bytes, FERRY_DTYPE_F32, 6);
  memset(ferry_exec_buf_host_ptr(p->ex, b->a2), 0, act_bytes > kv_bytes ? act_bytes : kv_bytes);
  memset(ferry_exec_buf_host_ptr(p->ex, b->a3), 0, act_bytes > kv_bytes ? act_bytes : kv_bytes);
  return FERRY_OK;
}

ferry_status ferry_calibrate_probe(const char *dir, FILE *progress, struct ferry_hw_profile *out) {
  memset(out, 0, sizeof *out);
  struct probe p = {.progress = progress};
  pthread_mutex_init(&p.mu, NULL);
  ferry_status st;
  struct kbufs b = {0};
  ferry_buf *host = NULL, *dev = NULL;
  if ((st = ferry_exec_create_host(&p.ex, NULL))) goto out;
  ferry_exec_set_sink(p.ex, probe_sink, &p);
  if ((st = ferry_exec_queue_create(p.ex, FERRY_QUEUE_COMPUTE, &p.q_compute)) ||
      (st = ferry_exec_queue_create(p.ex, FERRY_QUEUE_H2D, &p.q_h2d)) ||
      (st = ferry_exec_queue_create(p.ex, FERRY_QUEUE_D2H, &p.q_d2h)) ||
      (st = ferry_exec_queue_create(p.ex, FERRY_QUEUE_DISK, &p.q_disk)) || (st = ferry_exec_event_create(p.ex, &p.ev)))
    goto out;
  const uint64_t big = 64u << 20;
  if ((st = ferry_exec_alloc(p.ex, FERRY_TIER_HOST, big + 2 * FERRY_DIRECT_ALIGN, "probe host", &host)) ||
      (st = ferry_exec_alloc(p.ex, FERRY_TIER_DEVICE, big, "probe device", &dev)))
    goto out;
  memset(ferry_exec_buf_host_ptr(p.ex, host), 1, big);
  memset(ferry_exec_buf_host_ptr(p.ex, dev), 2, big);
  struct ferry_hw_cost h2d, d2h, disk;
  if (progress) fprintf(progress, "ferry: calibrate: copies\n");
  if ((st = probe_copies(&p, host, dev, p.q_h2d, 1, &h2d)) || (st = probe_copies(&p, host, dev, p.q_d2h, 0, &d2h)))
    goto out;
  int64_t submit_ns = 0, sync_ns = 0, wake_ns = 0;
  if ((st = probe_host_overheads(&p, host, dev, &submit_ns, &sync_ns, &wake_ns))) goto out;
  if (progress) fprintf(progress, "ferry: calibrate: O_DIRECT reads in %s\n", dir);
  if ((st = probe_disk(&p, dir, host, &disk))) goto out;
  if (progress) fprintf(progress, "ferry: calibrate: kernels\n");
  if ((st = alloc_kbufs(&p, &b))) goto out;
  int32_t ids[512];
  double best_gflops = 0;
  if ((st = probe_kernels(&p, &b, FERRY_DTYPE_F16, ids, out, &best_gflops))) goto out;

  /* a memory-bound product (decode: 4 rows through 8 MiB of fp16 weights) alone and beside a
   * 64 MiB copy that covers it: the host executor's "device" and "link" are one DRAM */
  if (progress) fprintf(progress, "ferry: calibrate: a kernel beside a copy\n");
  struct ferry_kernel mk = {.kind = FERRY_K_MATMUL, .name = "matmul", .layer = -1, .expert = -1, .m = 4, .n = 1024,
                            .k = 4096, .x = {b.x, 0, FERRY_DTYPE_F32}, .y = {b.y, 0, FERRY_DTYPE_F32},
                            .w = {b.w, 0, FERRY_DTYPE_F16}};
  double contention = 0;
  st = ferry__calibrate_probe_contention(p.ex, p.q_compute, p.q_h2d, p.ev, &mk, host, dev, big, &contention);
  ferry_exec_set_sink(p.ex, probe_sink, &p);
  if (st) goto out;
  fill_probe_profile(out, dir, &h2d, &d2h, &disk, best_gflops, submit_ns, sync_ns, wake_ns);
  out->link.contention = contention < 0 ? 0 : contention > FERRY_HW_CONTENTION_MAX ? FERRY_HW_CONTENTION_MAX : contention;
out:
  if (p.ev) ferry_exec_event_destroy(p.ex, p.ev); /* events are the caller's, unlike buffers */
  ferry_exec_destroy(p.ex);
  pthread_mutex_destroy(&p.mu);
  return st;
}

/* ---- writer ----------------------------------------------------------------------------------- */

static int is_fitted(const char *figure, const char *const *fitted, size_t n_fitted) {
  for (size_t i = 0; i < n_fitted; i++)
    if (!strcmp(figure, fitted[i])) return 1;
  return 0;
}

/* The sources: every figure the profile carried from its base keeps the source it had (a
 * datasheet, a paper, a ferry default's words: calibrating one figure must not cost the others
 * their provenance), and the figures a calibration fitted get the note and today's date. */
static void json_sources(cJSON *root, const struct ferry_hw_profile *p, const char *const *fitted, size_t n_fitted,
                         const char *source_note) {
  cJSON *src = cJSON_AddArrayToObject(root, "sources");
  for (size_t i = 0; src && i < p->n_sources; i++) {
    const struct ferry_hw_source *s = &p->sources[i];
    if (is_fitted(s->figure, fitted, n_fitted)) continue;
    cJSON *o = cJSON_CreateObject();
    if (!o) break;
    cJSON_AddStringToObject(o, "figure", s->figure);
    cJSON_AddStringToObject(o, "value", s->value);
    cJSON_AddStringToObject(o, "source", s->source);
    cJSON_AddStringToObject(o, "date", s->date);
    cJSON_AddItemToArray(src, o);
  }
  if (!fitted || !n_fitted) return;
  cJSON *fit = cJSON_AddArrayToObject(root, "fitted");
  time_t now = time(NULL);
  char date[16];
  strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
  for (size_t i = 0; i < n_fitted; i++) {
    cJSON_AddItemToArray(fit, cJSON_CreateString(fitted[i]));
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "figure", fitted[i]);
    cJSON_AddStringToObject(o, "value", "measured");
    cJSON_AddStringToObject(o, "source", source_note ? source_note : "ferry calibrate");
    cJSON_AddStringToObject(o, "date", date);
    cJSON_AddItemToArray(src, o);
  }
}

ferry_status ferry_hw_write_json(const struct ferry_hw_profile *p, const char *const *fitted, size_t n_fitted,
                                 const char *source_note, const char *path) {
  ferry__json_init();
  cJSON *root = cJSON_CreateObject();
  if (!root) return ferry__fail(FERRY_ERR_NOMEM, "out of memory");
  cJSON_AddStringToObject(root, "name", p->name[0] ? p->name : "calibrated");
  cJSON_AddStringToObject(root, "kind", ferry_hw_kind_name(p->kind));
  /* every section and figure the profile has, from the reader's own field table, so that what is
   * written reads back the same (a hand-kept list here lost host.cores, core_gflops, disk.write_gbps
   * and the interconnect section of a profile composed from catalogue parts) */
  ferry_status st = ferry__hw_figures_to_json(root, p);
  if (st != FERRY_OK) {
    cJSON_Delete(root);
    return st;
  }
  json_sources(root, p, fitted, n_fitted, source_note);
  char *text = cJSON_Print(root);
  cJSON_Delete(root);
  if (!text) return ferry__fail(FERRY_ERR_NOMEM, "out of memory");
  st = ferry__write_file_atomic(path, text, strlen(text), NULL);
  ferry_free(text);
  return st;
}
