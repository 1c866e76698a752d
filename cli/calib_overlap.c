/* `ferry calibrate --db`: the copies beside each kernel of a recorded run, the fit of the link's
 * contention with kernels (link.contention) to them, and what it takes out of the kernels' costs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/calib_overlap.h"
#include "cli/cli.h"
#include "common/alloc.h"
#include "common/error.h"
#include "ferry/calibrate.h"

static int cmp_copy(const void *a, const void *b) {
  const struct calib_copy *x = a, *y = b;
  return x->start < y->start ? -1 : x->start > y->start;
}

ferry_status calib_copies_load(sqlite3 *db, int64_t run, struct calib_copies *out) {
  memset(out, 0, sizeof *out);
  sqlite3_stmt *q = NULL;
  /* 1 = host->device, 2 = device->host (disk reads, 100, land in host memory) */
  if (sqlite3_prepare_v2(db,
                         "SELECT start, end, COALESCE(correlationId, 0) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE runId = ?1 "
                         "AND copyKind IN (1, 2) LIMIT 2000000",
                         -1, &q, NULL) != SQLITE_OK)
    return FERRY_OK; /* no copies table: nothing beside the kernels */
  sqlite3_bind_int64(q, 1, run);
  size_t cap = 0;
  while (sqlite3_step(q) == SQLITE_ROW) {
    const int64_t s = sqlite3_column_int64(q, 0), e = sqlite3_column_int64(q, 1);
    if (s < 0 || e <= s) continue; /* an empty copy, or a crafted row (negative, ending before it starts) */
    struct calib_copy *v = cli_room(out->v, &cap, out->n, sizeof *v, 1024);
    if (!v) {
      sqlite3_finalize(q);
      calib_copies_free(out);
      return ferry__fail(FERRY_ERR_NOMEM, "calibrate: out of memory");
    }
    out->v = v;
    out->v[out->n++] = (struct calib_copy){s, e, sqlite3_column_int64(q, 2)};
    if (e - s > out->longest) out->longest = e - s;
  }
  sqlite3_finalize(q);
  if (out->n) qsort(out->v, out->n, sizeof *out->v, cmp_copy);
  return FERRY_OK;
}

void calib_copies_free(struct calib_copies *c) {
  ferry_free(c->v);
  memset(c, 0, sizeof *c);
}

struct piece {
  int64_t a, b;
};

static int cmp_piece(const void *x, const void *y) {
  const struct piece *p = x, *q = y;
  return p->a < q->a ? -1 : p->a > q->a;
}

/* The length of the union of n pieces (sorted here). */
static double union_ns(struct piece *v, size_t n) {
  qsort(v, n, sizeof *v, cmp_piece);
  double total = 0;
  int64_t a = 0, b = 0;
  for (size_t i = 0; i < n; i++) {
    if (i && v[i].a <= b) {
      if (v[i].b > b) b = v[i].b;
      continue;
    }
    if (i) total += (double)(b - a);
    a = v[i].a, b = v[i].b;
  }
  return n ? total + (double)(b - a) : 0;
}

#define MAX_PIECES 512 /* copies beside one kernel; more are summed as if apart (they are, on one queue) */

void calib_overlap(const struct calib_copies *c, int64_t start, int64_t end, int64_t correlation, double *all,
                   double *before) {
  struct piece pa[MAX_PIECES], pb[MAX_PIECES];
  size_t na = 0, nb = 0;
  double extra_a = 0, extra_b = 0;
  *all = *before = 0;
  if (start < 0 || end <= start) return; /* a crafted row: nothing of it can be measured */
  /* the first copy starting at or after the kernel's end; the ones before it may overlap */
  size_t lo = 0, hi = c->n;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (c->v[mid].start < end) lo = mid + 1;
    else hi = mid;
  }
  for (size_t j = lo; j-- > 0 && c->v[j].start > start - c->longest;) {
    const int64_t a = c->v[j].start > start ? c->v[j].start : start, b = c->v[j].end < end ? c->v[j].end : end;
    if (b <= a) continue;
    if (na < MAX_PIECES) pa[na++] = (struct piece){a, b};
    else extra_a += (double)(b - a);
    if (c->v[j].correlation < correlation) {
      if (nb < MAX_PIECES) pb[nb++] = (struct piece){a, b};
      else extra_b += (double)(b - a);
    }
  }
  *all = union_ns(pa, na) + extra_a;
  *before = union_ns(pb, nb) + extra_b;
}

/* A kernel's shape: its kind, bytes and flops. */
static uint64_t shape_key(const unsigned char *kind, int64_t bytes, double flops) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (; kind && *kind; kind++) h = (h ^ *kind) * 0x100000001b3ULL;
  h = (h ^ (uint64_t)bytes) * 0x100000001b3ULL;
  uint64_t f;
  memcpy(&f, &flops, sizeof f);
  return (h ^ f) * 0x100000001b3ULL;
}

/* A fit is kept when this many kernels had a copy beside them and it is clear of zero by two
 * standard errors; otherwise the run cannot tell the figure from the noise. */
#define MIN_OVERLAPPED 30

ferry_status calib_fit_contention(sqlite3 *db, const int64_t *runs, size_t n_runs, const struct calib_copies *c,
                                  struct ferry_hw_profile *p, int *fitted) {
  *fitted = 0;
  sqlite3_stmt *q = NULL;
  if (sqlite3_prepare_v2(db,
                         "SELECT k.start, k.end, COALESCE(k.correlationId, 0), n.value, k.bytes, k.flops FROM "
                         "CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds n ON n.id = k.shortName WHERE k.runId = ?1 "
                         "LIMIT 2000000",
                         -1, &q, NULL) != SQLITE_OK)
    return FERRY_OK;
  struct ferry_calib_overlap *v = NULL;
  size_t n = 0, cap = 0;
  ferry_status st = FERRY_OK;
  double busy = 0, beside = 0, beside_before = 0; /* kernel time, and the part with a copy beside it */
  for (size_t r = 0; r < n_runs && st == FERRY_OK; r++) {
    sqlite3_reset(q);
    sqlite3_bind_int64(q, 1, runs[r]);
    while (sqlite3_step(q) == SQLITE_ROW) {
      const int64_t s = sqlite3_column_int64(q, 0), e = sqlite3_column_int64(q, 1);
      const double flops = sqlite3_column_double(q, 5);
      if (s < 0 || e <= s || !isfinite(flops)) continue; /* crafted rows */
      struct ferry_calib_overlap *nv = cli_room(v, &cap, n, sizeof *nv, 4096);
      if (!nv) {
        st = ferry__fail(FERRY_ERR_NOMEM, "calibrate: out of memory");
        break;
      }
      v = nv;
      double all, before;
      calib_overlap(&c[r], s, e, sqlite3_column_int64(q, 2), &all, &before);
      busy += (double)(e - s);
      beside += all;
      beside_before += before;
      v[n++] = (struct ferry_calib_overlap){shape_key(sqlite3_column_text(q, 3), sqlite3_column_int64(q, 4), flops),
                                            (double)(e - s), all};
    }
  }
  sqlite3_finalize(q);
  struct ferry_calib_contention f;
  if (st == FERRY_OK && n) st = ferry_calibrate_fit_contention(v, n, &f);
  ferry_free(v);
  if (st != FERRY_OK || !n) return st;
  const int clear = f.overlapped >= MIN_OVERLAPPED && f.contention > 2 * f.std_error;
  /* how much the figure can matter: the share of kernel time a copy overlapped, and of that the
   * part the simulator charges (copies issued before the kernel) */
  printf("%-12s %.2f%% of the kernels' %.0f ms had a copy beside them (%.2f%% one issued before the kernel)\n",
         "overlap", busy > 0 ? 100 * beside / busy : 0, busy / 1e6, busy > 0 ? 100 * beside_before / busy : 0);
  printf("%-12s %6zu ops, %zu beside a copy: %.3f +- %.3f ns more per ns of overlap (R^2 %.3f within shapes)%s\n",
         "contention", f.samples, f.overlapped, f.contention, f.std_error, f.r2,
         clear ? "" : ": too uncertain to use");
  if (clear) {
    p->link.contention = f.contention > FERRY_HW_CONTENTION_MAX ? FERRY_HW_CONTENTION_MAX : f.contention;
    *fitted = 1;
  } else {
    printf("%-12s kept the base profile's link.contention %.3f\n", "", p->link.contention);
  }
  return FERRY_OK;
}
