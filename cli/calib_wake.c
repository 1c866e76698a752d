/* The wake-up of a queue blocked on an event, from a recorded timeline (calib_wake.h). The host
 * executor's queue threads sleep in a wait and are woken by the thread that completed the event:
 * on this 2-core machine about 55 us under a run's load, against 12 us for an idle queue woken by
 * a submit (`ferry calibrate --probe`), so the time is measured where runs spend it. */
#include "cli/calib_wake.h"

#include <stdlib.h>

#include "cli/cli.h"
#include "common/alloc.h"
#include "common/checked.h"
#include "common/error.h"

struct row {
  int64_t start, end, stream;
};

static int cmp_end(const void *a, const void *b) {
  const struct row *x = a, *y = b;
  return x->end < y->end ? -1 : x->end > y->end;
}

static int cmp_f64(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Rows (start, end, stream) of sql for run ?1 appended to *v; rows that end before they start
 * (a crafted database) are left out. */
static ferry_status load_rows(sqlite3 *db, const char *sql, int64_t run, struct row **v, size_t *n, size_t *cap) {
  sqlite3_stmt *q = NULL;
  if (sqlite3_prepare_v2(db, sql, -1, &q, NULL) != SQLITE_OK) return FERRY_OK; /* no such table: none */
  sqlite3_bind_int64(q, 1, run);
  ferry_status st = FERRY_OK;
  while (sqlite3_step(q) == SQLITE_ROW) {
    struct row *nv = cli_room(*v, cap, *n, sizeof **v, 1024);
    if (!nv) {
      st = ferry__fail(FERRY_ERR_NOMEM, "calibrate: out of memory");
      break;
    }
    *v = nv;
    const struct row r = {sqlite3_column_int64(q, 0), sqlite3_column_int64(q, 1), sqlite3_column_int64(q, 2)};
    if (r.end >= r.start) (*v)[(*n)++] = r;
  }
  sqlite3_finalize(q);
  return st;
}

/* The lags of one run's blocked waits, appended to *lags. */
static ferry_status run_lags(sqlite3 *db, int64_t run, double **lags, size_t *n_lags, size_t *cap_lags) {
  struct row *waits = NULL, *ends = NULL;
  size_t nw = 0, cw = 0, no = 0, co = 0;
  ferry_status st = load_rows(db,
                              "SELECT start, end, streamId FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION WHERE runId = ?1 AND "
                              "end > start",
                              run, &waits, &nw, &cw);
  if (st == FERRY_OK && nw)
    st = load_rows(db, "SELECT start, end, streamId FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE runId = ?1", run, &ends, &no, &co);
  if (st == FERRY_OK && nw)
    st = load_rows(db, "SELECT start, end, streamId FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE runId = ?1", run, &ends, &no, &co);
  if (st != FERRY_OK || !nw || !no) goto out;
  qsort(ends, no, sizeof *ends, cmp_end);
  for (size_t w = 0; w < nw; w++) {
    const int64_t start = waits[w].start, end = waits[w].end, stream = waits[w].stream;
    /* the last op end at or before the wait's end, then back past the waiting queue's own */
    size_t lo = 0, hi = no;
    while (lo < hi) {
      const size_t mid = lo + (hi - lo) / 2;
      if (ends[mid].end <= end) lo = mid + 1;
      else hi = mid;
    }
    /* a queue in a wait runs nothing, so only an op or two of its own can end inside one: a
     * crafted timeline with more is not walked through (that would be quadratic) */
    size_t k = lo, own = 0;
    while (k > 0 && ends[k - 1].end >= start && ends[k - 1].stream == stream && own < CALIB_WAKE_MAX_OWN) {
      k--;
      own++;
    }
    if (k == 0 || ends[k - 1].end < start || ends[k - 1].stream == stream) continue; /* no other queue's */
    double *nl = cli_room(*lags, cap_lags, *n_lags, sizeof **lags, 1024);
    if (!nl) {
      st = ferry__fail(FERRY_ERR_NOMEM, "calibrate: out of memory");
      goto out;
    }
    *lags = nl;
    (*lags)[(*n_lags)++] = ferry__span(ends[k - 1].end, end); /* in double: a crafted row may span the range */
  }
out:
  ferry_free(waits);
  ferry_free(ends);
  return st;
}

ferry_status calib_event_wake(sqlite3 *db, const int64_t *runs, size_t n_runs, double *median_ns, size_t *n_waits) {
  double *lags = NULL;
  size_t n = 0, cap = 0;
  ferry_status st = FERRY_OK;
  for (size_t r = 0; r < n_runs && st == FERRY_OK; r++) st = run_lags(db, runs[r], &lags, &n, &cap);
  *n_waits = st == FERRY_OK ? n : 0;
  if (st == FERRY_OK && n) {
    qsort(lags, n, sizeof *lags, cmp_f64);
    *median_ns = n % 2 ? lags[n / 2] : (lags[n / 2 - 1] + lags[n / 2]) / 2;
  }
  ferry_free(lags);
  return st;
}
