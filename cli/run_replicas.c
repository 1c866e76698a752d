/* `ferry sim|run --replicas R`: R engines, each with its own executor (and --gpus devices),
 * serve the trace together: simulated executors on one timeline (ferry_replicas_serve()), real
 * ones each on its own thread in real time (ferry_replicas_serve_realtime()); either decides
 * where each request goes. This file creates them, refuses what one engine's hooks cannot
 * share, and prints and records each replica's figures. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/run_exec.h"
#include "common/alloc.h"
#include "common/error.h"
#include "common/units.h"
#include "ferry/exec_registry.h"

/* Options whose state belongs to one engine (a recorder, a predictor, a control socket, the
 * logits file, CUPTI) or to one executor (injected faults). */
static ferry_status refuse_shared_state(const struct run_args *a) {
  static const char *const one_engine[] = {"record-routing", "record-features", "predictor", "predictor-routing",
                                           "routing",        "dump-logits",     "profile",   "faults",
                                           "reload-at",      "reload-from",     "control-socket", "pressure-os",
                                           NULL};
  for (size_t i = 0; one_engine[i]; i++)
    if (run_given(a, one_engine[i]))
      return ferry__fail(FERRY_ERR_INVALID, "--%s with --replicas %lld: its state belongs to one engine; run one replica",
                         one_engine[i], (long long)a->replicas);
  return FERRY_OK;
}

ferry_status run_replicas_serve(struct run_ctx *c, const struct ferry_run_options *ro) {
  struct run_args *a = c->a;
  const int32_t n = (int32_t)a->replicas;
  enum ferry_router router;
  ferry_status st = refuse_shared_state(a);
  if (st == FERRY_OK) st = ferry_router_from_name(a->router, &router);
  if (st != FERRY_OK) return st;
  c->rep_ex = ferry__calloc((size_t)n, sizeof *c->rep_ex);
  c->rep_eng = ferry__calloc((size_t)n, sizeof *c->rep_eng);
  c->replica_of = ferry__calloc((size_t)(c->n_reqs ? c->n_reqs : 1), sizeof *c->replica_of);
  if (!c->rep_ex || !c->rep_eng || !c->replica_of) return ferry__fail(FERRY_ERR_NOMEM, "out of memory for %d replicas", n);
  c->n_rep = n;
  c->rep_ex[0] = c->ex; /* replica 0 is the run's own (borrowed) */
  c->rep_eng[0] = c->eng;
  for (int32_t i = 1; i < n && st == FERRY_OK; i++)
    if ((st = run_open_executor(c, 0, &c->rep_ex[i])) == FERRY_OK)
      st = ferry_engine_create(&c->rep_eng[i], c->model, c->store, c->rep_ex[i], &a->ec);
  if (st != FERRY_OK) return st;
  struct ferry_run_options o = *ro;
  o.on_tick = NULL; /* what it serves (reloads, the control socket) is refused above */
  const struct ferry_exec_info *x = ferry_exec_registry_find(a->executor);
  if (a->sim || (x && (x->caps & FERRY_EXEC_CAP_VIRTUAL)))
    return ferry_replicas_serve(c->rep_eng, n, c->reqs, c->n_reqs, router, &o, c->replica_of);
  return ferry_replicas_serve_realtime(c->rep_eng, n, c->reqs, c->n_reqs, router, &o, c->replica_of);
}

void run_replicas_summary(const struct run_ctx *c, struct ferry_serve_summary *out) {
  if (c->n_rep > 1) ferry_engine_summary_many((const ferry_engine *const *)c->rep_eng, c->n_rep, out);
  else ferry_engine_summary(c->eng, out);
}

/* One replica's line: what it served and how fast, and its fullest memory. */
static void replica_line(const struct run_ctx *c, int32_t i, char *line, size_t len) {
  struct ferry_serve_summary s;
  char t[3][32];
  ferry_engine_summary(c->rep_eng[i], &s);
  snprintf(line, len, "%lld requests, %lld tokens; TTFT mean %s, TPOT mean %s; peak device %s of %s",
           (long long)s.requests_done, (long long)s.tokens_generated, ferry__format_ns(s.ttft.mean, t[0], 32),
           ferry__format_ns(s.tpot.mean, t[1], 32), ferry__format_bytes(s.peak_bytes[FERRY_TIER_DEVICE], t[2], 32),
           s.budget_bytes[FERRY_TIER_DEVICE] ? ferry__format_bytes(s.budget_bytes[FERRY_TIER_DEVICE], (char[32]){0}, 32)
                                             : "unlimited");
}

void run_replicas_report(const struct run_ctx *c, FILE *f) {
  if (c->n_rep < 2) return;
  char name[32], line[256];
  if (f) fprintf(f, "replicas: %d, router %s\n", c->n_rep, c->a->router);
  for (int32_t i = 0; i < c->n_rep; i++) {
    replica_line(c, i, line, sizeof line);
    if (f) fprintf(f, "  replica %d: %s\n", i, line);
    snprintf(name, sizeof name, "REPLICA_%d", i);
    if (c->db && c->run_id >= 0) ferry_db_run_meta(c->db, c->run_id, name, line);
  }
  if (c->db && c->run_id >= 0) ferry_db_run_meta(c->db, c->run_id, "ROUTER", c->a->router);
}

void run_replicas_free(struct run_ctx *c) {
  for (int32_t i = 1; i < c->n_rep; i++) {
    ferry_engine_destroy(c->rep_eng[i]);
    ferry_exec_destroy(c->rep_ex[i]);
  }
  ferry_free(c->rep_eng);
  ferry_free(c->rep_ex);
  ferry_free(c->replica_of);
  c->rep_eng = NULL;
  c->rep_ex = NULL;
  c->n_rep = 0;
}
