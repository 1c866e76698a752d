/* Data-parallel serving: several engines (replicas, each with its own executor and clock) serve
 * one trace. The engines are stepped in one thread on one timeline: before each arrival every
 * replica is advanced to it, so the router sees each replica's state at that time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "common/units.h"
#include "engine_impl.h"

static const char *const router_names[] = {"round-robin", "least-requests", "least-tokens"};

const char *ferry_router_name(enum ferry_router r) {
  return (unsigned)r < sizeof router_names / sizeof *router_names ? router_names[r] : "?";
}

ferry_status ferry_router_from_name(const char *name, enum ferry_router *out) {
  for (size_t i = 0; name && i < sizeof router_names / sizeof *router_names; i++)
    if (!strcmp(name, router_names[i])) {
      *out = (enum ferry_router)i;
      return FERRY_OK;
    }
  return ferry__fail(FERRY_ERR_INVALID, "router '%s': expected round-robin, least-requests or least-tokens",
                     name ? name : "(null)");
}

static int cmp_arrival(const void *a, const void *b) {
  const struct ferry__arrival *x = a, *y = b;
  if (x->ns != y->ns) return x->ns < y->ns ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

struct ferry__arrival *ferry__replicas_order(const struct ferry_engine_request *requests, int64_t n,
                                             const struct ferry_run_options *o) {
  struct ferry__arrival *order = ferry__calloc((size_t)(n ? n : 1), sizeof *order);
  if (!order) return NULL;
  const double scale = o && o->time_scale > 0 ? o->time_scale : 1.0;
  for (int64_t i = 0; i < n; i++) {
    order[i] = (struct ferry__arrival){.ns = 0, .id = requests[i].id, .index = i};
    if ((!o || !o->as_fast_as_possible) && ferry__scale_ns(requests[i].arrival_ns, scale, &order[i].ns) != FERRY_OK)
      order[i].ns = INT64_MAX;
  }
  qsort(order, (size_t)n, sizeof *order, cmp_arrival);
  return order;
}

int32_t ferry__router_pick(enum ferry_router r, const struct ferry_engine_load *loads, int32_t n, int64_t k) {
  if (r == FERRY_ROUTER_ROUND_ROBIN) return (int32_t)(k % n);
  int32_t best = 0;
  int64_t best_v = INT64_MAX;
  for (int32_t i = 0; i < n; i++) {
    const int64_t v = r == FERRY_ROUTER_LEAST_REQUESTS ? loads[i].requests : loads[i].tokens;
    if (v < best_v) best = i, best_v = v;
  }
  return best;
}

/* The replica for the k-th request from every engine's state now. */
static int32_t route(ferry_engine *const *engines, int32_t n, enum ferry_router r, int64_t k,
                     struct ferry_engine_load *loads) {
  for (int32_t i = 0; r != FERRY_ROUTER_ROUND_ROBIN && i < n; i++) ferry_engine_serve_load(engines[i], &loads[i]);
  return ferry__router_pick(r, loads, n, k);
}

/* A replica's failure, named (its message copied first: the last error is rewritten). */
ferry_status ferry__replica_failed(int32_t i, ferry_status st) {
  char why[FERRY_ERRMSG_MAX];
  snprintf(why, sizeof why, "%s", ferry_last_error());
  return ferry__fail(st, "replica %d: %s", i, why);
}

/* Every engine to time t, then the request to the one the router picks. */
static ferry_status dispatch(ferry_engine *const *engines, int32_t n_eng, const struct ferry_engine_request *rq,
                             int64_t t, enum ferry_router router, int64_t k, struct ferry_engine_load *loads,
                             int32_t *picked) {
  for (int32_t i = 0; i < n_eng; i++) {
    const ferry_status st = ferry_engine_serve_advance(engines[i], t);
    if (st != FERRY_OK) return ferry__replica_failed(i, st);
  }
  *picked = route(engines, n_eng, router, k, loads);
  const ferry_status st = ferry_engine_serve_add(engines[*picked], rq);
  return st == FERRY_OK ? FERRY_OK : ferry__replica_failed(*picked, st);
}

ferry_status ferry_replicas_serve(ferry_engine *const *engines, int32_t n_eng, const struct ferry_engine_request *requests,
                                  int64_t n, enum ferry_router router, const struct ferry_run_options *options,
                                  int32_t *replica_of) {
  if (n_eng < 1 || !engines || (n && !requests))
    return ferry__fail(FERRY_ERR_INVALID, "replicas: %d engines for %lld requests", n_eng, (long long)n);
  struct ferry__arrival *order = ferry__replicas_order(requests, n, options);
  struct ferry_engine_load *loads = ferry__calloc((size_t)n_eng, sizeof *loads);
  ferry_status st = FERRY_OK;
  int32_t opened = 0;
  if (!order || !loads) {
    st = ferry__fail(FERRY_ERR_NOMEM, "replicas: out of memory for %lld requests", (long long)n);
    goto out;
  }
  for (; opened < n_eng && st == FERRY_OK; opened++)
    if ((st = ferry_engine_serve_begin(engines[opened], NULL, 0, options)) != FERRY_OK) break;
  for (int64_t k = 0; k < n && st == FERRY_OK; k++) {
    int32_t picked = 0;
    st = dispatch(engines, n_eng, &requests[order[k].index], order[k].ns, router, k, loads, &picked);
    if (replica_of) replica_of[order[k].index] = picked;
  }
  for (int32_t i = 0; i < opened && st == FERRY_OK; i++)
    if ((st = ferry_engine_serve_finish(engines[i])) != FERRY_OK) st = ferry__replica_failed(i, st);
  for (int32_t i = 0; i < opened; i++) ferry__engine_serve_abort(engines[i]);
out:
  ferry_free(order);
  ferry_free(loads);
  return st;
}
