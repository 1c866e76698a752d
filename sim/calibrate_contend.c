/* The profile's link.contention measured two ways: a probe that times one kernel alone and then
 * beside a large copy on the host executor (the kernel's extra time per ns of overlap), and a fit
 * to a recorded timeline that compares ops of the same shape run with and without a copy in
 * flight. Either way a kernel of duration d alone lasts d + contention x overlap. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "ferry/calibrate.h"
#include "ferry/exec.h"
#include "sim/calibrate_contend.h"

/* ---- fit to a timeline ------------------------------------------------------------------------ */

static int cmp_sample_group(const void *a, const void *b) {
  const struct ferry_calib_overlap *x = a, *y = b;
  return x->group < y->group ? -1 : x->group > y->group;
}

static int cmp_dbl(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Within-group regression of duration on overlap, each group scaled by its median duration (so
 * long and short ops weigh alike) and demeaned (so the shape's own cost drops out). Samples
 * more than 3x their group's median (an op the OS descheduled) are left out. */
struct within {
  double sxx, sxy, syy;
  size_t n, groups, overlapped;
};

static void accumulate(const struct ferry_calib_overlap *s, size_t n, double c, double *tmp, struct within *w,
                       double *sse) {
  memset(w, 0, sizeof *w);
  if (sse) *sse = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && s[j].group == s[i].group) j++;
    for (size_t k = i; k < j; k++) tmp[k - i] = s[k].duration_ns;
    qsort(tmp, j - i, sizeof *tmp, cmp_dbl);
    const double med = tmp[(j - i) / 2];
    double mx = 0, my = 0;
    size_t m = 0, ov = 0;
    for (size_t k = i; k < j; k++)
      if (med > 0 && s[k].duration_ns <= 3 * med) mx += s[k].overlap_ns / med, my += s[k].duration_ns / med, m++;
    if (m >= 2) {
      mx /= (double)m;
      my /= (double)m;
      for (size_t k = i; k < j; k++) {
        if (!(s[k].duration_ns <= 3 * med)) continue;
        const double x = s[k].overlap_ns / med - mx, y = s[k].duration_ns / med - my;
        w->sxx += x * x;
        w->sxy += x * y;
        w->syy += y * y;
        if (sse) *sse += (y - c * x) * (y - c * x);
        ov += s[k].overlap_ns > 0;
      }
      w->n += m;
      w->groups++;
      w->overlapped += ov;
    }
    i = j;
  }
}

ferry_status ferry_calibrate_fit_contention(struct ferry_calib_overlap *s, size_t n, struct ferry_calib_contention *out) {
  memset(out, 0, sizeof *out);
  if (!s || !n) return ferry__fail(FERRY_ERR_INVALID, "calibrate: no kernels to fit the contention to");
  double *tmp = ferry_malloc(n * sizeof *tmp);
  if (!tmp) return ferry__fail(FERRY_ERR_NOMEM, "calibrate: out of memory");
  qsort(s, n, sizeof *s, cmp_sample_group);
  struct within w;
  accumulate(s, n, 0, tmp, &w, NULL);
  out->samples = w.n;
  out->overlapped = w.overlapped;
  if (w.sxx > 0 && w.n > w.groups + 1) {
    const double c = w.sxy / w.sxx;
    double sse = 0;
    accumulate(s, n, c, tmp, &w, &sse);
    out->contention = c;
    out->r2 = w.syy > 0 ? 1.0 - sse / w.syy : 0;
    out->std_error = sqrt(sse / (double)(w.n - w.groups - 1) / w.sxx);
  }
  ferry_free(tmp);
  return FERRY_OK;
}

/* ---- probe ------------------------------------------------------------------------------------ */

struct spans {
  pthread_mutex_t mu;
  int64_t kernel[2], copy[2];
};

static void spans_sink(void *user, const struct ferry_activity *a) {
  struct spans *sp = user;
  if (a->kind != FERRY_ACT_KERNEL && a->kind != FERRY_ACT_MEMCPY) return;
  pthread_mutex_lock(&sp->mu);
  int64_t *v = a->kind == FERRY_ACT_KERNEL ? sp->kernel : sp->copy;
  v[0] = a->start_ns;
  v[1] = a->end_ns;
  pthread_mutex_unlock(&sp->mu);
}

#define PROBE_REPS 9

/* One run of k, beside a copy of copy_bytes issued first when host is given: its duration and
 * the part of it the copy overlapped. */
static ferry_status time_kernel(ferry_exec *ex, int32_t q_compute, int32_t q_copy, const struct ferry_kernel *k,
                                ferry_buf *host, ferry_buf *dev, uint64_t copy_bytes, struct spans *sp, double *dur,
                                double *ov) {
  ferry_status st = FERRY_OK;
  if (host) st = ferry_exec_copy(ex, q_copy, (struct ferry_ref){dev, 0, FERRY_DTYPE_U8},
                                 (struct ferry_ref){host, 0, FERRY_DTYPE_U8}, copy_bytes);
  if (st == FERRY_OK) st = ferry_exec_compute(ex, q_compute, k);
  if (st == FERRY_OK) st = ferry_exec_drain(ex);
  if (st != FERRY_OK) return st;
  pthread_mutex_lock(&sp->mu);
  const int64_t from = sp->kernel[0] > sp->copy[0] ? sp->kernel[0] : sp->copy[0];
  const int64_t to = sp->kernel[1] < sp->copy[1] ? sp->kernel[1] : sp->copy[1];
  *dur = (double)(sp->kernel[1] - sp->kernel[0]);
  *ov = host && to > from ? (double)(to - from) : 0;
  pthread_mutex_unlock(&sp->mu);
  return FERRY_OK;
}

ferry_status ferry__calibrate_probe_contention(ferry_exec *ex, int32_t q_compute, int32_t q_copy, ferry_event *ev,
                                               const struct ferry_kernel *k, ferry_buf *host, ferry_buf *dev,
                                               uint64_t copy_bytes, double *contention) {
  (void)ev;
  struct spans sp = {.kernel = {0, 0}, .copy = {0, 0}};
  pthread_mutex_init(&sp.mu, NULL);
  ferry_exec_set_sink(ex, spans_sink, &sp);
  double alone[PROBE_REPS + 1], beside[PROBE_REPS], ov[PROBE_REPS], per_ns[PROBE_REPS], unused;
  ferry_status st = time_kernel(ex, q_compute, q_copy, k, NULL, dev, 0, &sp, &alone[0], &unused); /* warm-up */
  /* alone and beside a copy in turn, so that a machine getting busier or quieter between them
   * shifts both: each run beside a copy is compared with the runs alone just before and after */
  for (int r = 0; r <= PROBE_REPS && st == FERRY_OK; r++) {
    st = time_kernel(ex, q_compute, q_copy, k, NULL, dev, 0, &sp, &alone[r], &unused);
    if (st == FERRY_OK && r < PROBE_REPS)
      st = time_kernel(ex, q_compute, q_copy, k, host, dev, copy_bytes, &sp, &beside[r], &ov[r]);
  }
  ferry_exec_set_sink(ex, NULL, NULL);
  pthread_mutex_destroy(&sp.mu);
  if (st != FERRY_OK) return ferry__fail(st, "calibrate: %s", ferry_exec_errmsg(ex));
  int n = 0;
  for (int r = 0; r < PROBE_REPS; r++) /* a copy that covered most of the kernel */
    if (ov[r] > 0.5 * beside[r]) per_ns[n++] = (beside[r] - 0.5 * (alone[r] + alone[r + 1])) / ov[r];
  *contention = 0;
  if (n) {
    qsort(per_ns, (size_t)n, sizeof *per_ns, cmp_dbl);
    *contention = per_ns[n / 2];
  }
  return FERRY_OK;
}
