/* Data-parallel serving on real executors: each engine (replica) is stepped by its own thread on
 * the wall clock, as R servers would run, while the caller's thread replays the arrivals and
 * routes each request when it arrives, from the replicas' state at that moment (the router of
 * the simulated timeline, ferry__router_pick()).
 *
 * Only the replica's thread touches its engine while serving. After each step or admission it
 * publishes the engine's load (ferry_engine_serve_load(), read in that thread) under the
 * replica's mutex; the router reads that copy plus the requests it has routed there that the
 * thread has not taken yet, so a request just sent counts at once. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/error.h"
#include "common/units.h"
#include "engine_impl.h"

struct pool;

struct replica {
  ferry_engine *eng;
  struct pool *pool;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  /* under mu */
  int64_t *inbox;                /* requests (indices) routed here and not yet added, in order */
  int64_t in_head, in_tail;      /* inbox[in_head, in_tail) */
  int closed;                    /* every request has been routed */
  struct ferry_engine_load load; /* the engine's, as of its last step or admission */
  /* written by the thread before it ends (read after the join) */
  ferry_status st;
  char why[FERRY_ERRMSG_MAX];
};

struct pool {
  const struct ferry_engine_request *requests;
  atomic_int stop; /* a replica failed: every thread stops, routing ends */
};

static void *replica_main(void *arg) {
  struct replica *r = arg;
  ferry_status st = FERRY_OK;
  for (;;) {
    pthread_mutex_lock(&r->mu);
    while (!r->closed && r->in_head == r->in_tail && !r->load.requests && !atomic_load(&r->pool->stop))
      pthread_cond_wait(&r->cv, &r->mu);
    /* added under the lock, so the router never sees a request in neither the inbox nor the load */
    while (st == FERRY_OK && r->in_head < r->in_tail)
      st = ferry_engine_serve_add(r->eng, &r->pool->requests[r->inbox[r->in_head++]]);
    ferry_engine_serve_load(r->eng, &r->load);
    const int idle = !r->load.requests, last = r->closed && r->in_head == r->in_tail && idle;
    pthread_mutex_unlock(&r->mu);
    if (st != FERRY_OK || atomic_load(&r->pool->stop)) break;
    if (last) {
      st = ferry_engine_serve_finish(r->eng);
      break;
    }
    if (!idle && (st = ferry__engine_serve_step(r->eng)) != FERRY_OK) break;
    pthread_mutex_lock(&r->mu);
    ferry_engine_serve_load(r->eng, &r->load);
    pthread_mutex_unlock(&r->mu);
  }
  r->st = st;
  if (st != FERRY_OK) {
    snprintf(r->why, sizeof r->why, "%s", ferry_last_error()); /* this thread's last error */
    atomic_store(&r->pool->stop, 1);
  }
  return NULL;
}

/* Sleep until the monotonic clock reads `t` or a replica fails (checked every 20 ms). */
static void wait_until(const struct pool *p, int64_t t) {
  for (int64_t now = ferry__mono_ns(); now < t && !atomic_load(&p->stop); now = ferry__mono_ns()) {
    const int64_t until = t - now > 20000000 ? now + 20000000 : t;
    const struct timespec ts = {.tv_sec = (time_t)(until / 1000000000), .tv_nsec = (long)(until % 1000000000)};
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
  }
}

/* Replica i's load as the router sees it: the engine's plus what waits in its inbox. */
static void replica_load(struct replica *r, struct ferry_engine_load *out) {
  pthread_mutex_lock(&r->mu);
  *out = r->load;
  for (int64_t j = r->in_head; j < r->in_tail; j++) {
    const struct ferry_engine_request *q = &r->pool->requests[r->inbox[j]];
    out->requests++;
    out->tokens += (int64_t)q->prompt_tokens + q->output_tokens;
  }
  pthread_mutex_unlock(&r->mu);
}

static void replica_send(struct replica *r, int64_t index, int close) {
  pthread_mutex_lock(&r->mu);
  if (close) r->closed = 1;
  else r->inbox[r->in_tail++] = index;
  pthread_cond_signal(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

/* Each request at its arrival to the replica the router picks, then the end to every replica. */
static void route_all(struct replica *reps, int32_t n_eng, struct pool *p, const struct ferry__arrival *order,
                      int64_t n, enum ferry_router router, struct ferry_engine_load *loads, int32_t *replica_of) {
  const int64_t t0 = ferry__mono_ns();
  for (int64_t k = 0; k < n && !atomic_load(&p->stop); k++) {
    /* an arrival past the clock once scaled (INT64_MAX) is routed at once: its engine refuses it */
    if (order[k].ns < INT64_MAX - t0) wait_until(p, t0 + order[k].ns);
    for (int32_t i = 0; router != FERRY_ROUTER_ROUND_ROBIN && i < n_eng; i++) replica_load(&reps[i], &loads[i]);
    const int32_t picked = ferry__router_pick(router, loads, n_eng, k);
    replica_send(&reps[picked], order[k].index, 0);
    if (replica_of) replica_of[order[k].index] = picked;
  }
  for (int32_t i = 0; i < n_eng; i++) replica_send(&reps[i], 0, 1);
}

ferry_status ferry_replicas_serve_realtime(ferry_engine *const *engines, int32_t n_eng,
                                           const struct ferry_engine_request *requests, int64_t n,
                                           enum ferry_router router, const struct ferry_run_options *options,
                                           int32_t *replica_of) {
  if (n_eng < 1 || !engines || (n && !requests))
    return ferry__fail(FERRY_ERR_INVALID, "replicas: %d engines for %lld requests", n_eng, (long long)n);
  struct pool pool = {.requests = requests};
  atomic_init(&pool.stop, 0);
  struct ferry__arrival *order = ferry__replicas_order(requests, n, options);
  struct ferry_engine_load *loads = ferry__calloc((size_t)n_eng, sizeof *loads);
  struct replica *reps = ferry__calloc((size_t)n_eng, sizeof *reps);
  ferry_status st = FERRY_OK;
  int32_t opened = 0, started = 0;
  int ok = order && loads && reps;
  for (int32_t i = 0; reps && i < n_eng; i++)
    if (!(reps[i].inbox = ferry__calloc((size_t)(n ? n : 1), sizeof *reps[i].inbox))) ok = 0;
  if (!ok) {
    st = ferry__fail(FERRY_ERR_NOMEM, "replicas: out of memory for %lld requests", (long long)n);
    goto out;
  }
  /* the engines' clocks start together, before the first arrival is routed */
  for (; opened < n_eng; opened++)
    if ((st = ferry_engine_serve_begin(engines[opened], NULL, 0, options)) != FERRY_OK) {
      st = ferry__replica_failed(opened, st);
      goto out;
    }
  for (; started < n_eng; started++) {
    struct replica *r = &reps[started];
    r->eng = engines[started];
    r->pool = &pool;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    const int rc = pthread_create(&r->thread, NULL, replica_main, r);
    if (rc) {
      pthread_cond_destroy(&r->cv);
      pthread_mutex_destroy(&r->mu);
      atomic_store(&pool.stop, 1);
      st = ferry__fail(FERRY_ERR_NOMEM, "replicas: cannot start the thread of replica %d (%s)", started, strerror(rc));
      break;
    }
  }
  route_all(reps, started, &pool, order, started == n_eng ? n : 0, router, loads, replica_of);
  for (int32_t i = 0; i < started; i++) {
    pthread_join(reps[i].thread, NULL);
    if (st == FERRY_OK && reps[i].st != FERRY_OK) st = ferry__fail(reps[i].st, "replica %d: %s", i, reps[i].why);
    pthread_cond_destroy(&reps[i].cv);
    pthread_mutex_destroy(&reps[i].mu);
  }
out:
  for (int32_t i = 0; i < opened; i++) ferry__engine_serve_abort(engines[i]);
  for (int32_t i = 0; reps && i < n_eng; i++) ferry_free(reps[i].inbox);
  ferry_free(reps);
  ferry_free(loads);
  ferry_free(order);
  return st;
}
