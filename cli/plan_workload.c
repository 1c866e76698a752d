/* The requests `ferry plan` replays. The workload (a trace file after --time-window, or a
 * synthetic spec) is read once; for R replicas its first max(N, 50 R) requests are written to a
 * ferry JSONL file, which `ferry sim --replicas R` shares out with its router. Every probe
 * replays them at a scaled rate (--rate-scale), so the rates a search compares differ only in
 * how fast the same requests arrive. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/plan.h"
#include "common/alloc.h"
#include "common/fsutil.h"
#include "common/units.h"
#include "ferry/trace.h"

/* Requests per replica at least, whatever --requests says: fewer tell little of a queue. */
#define MIN_PER_REPLICA 50

struct plan_workload {
  ferry_trace *t;
  char dir[4096];
  int keep;
  int64_t per_replica;
  unsigned char prepared[PLAN_MAX_REPLICAS + 1];
};

size_t plan_workload_count(const struct plan_workload *w, int replicas) {
  int64_t want = w->per_replica;
  if (replicas > 1 && want < (int64_t)MIN_PER_REPLICA * replicas) want = (int64_t)MIN_PER_REPLICA * replicas;
  const size_t n = ferry_trace_count(w->t);
  return (size_t)want < n ? (size_t)want : n;
}

double plan_workload_rate(const struct plan_workload *w, int replicas) {
  const size_t n = plan_workload_count(w, replicas);
  if (n < 2) return 0;
  const int64_t span = ferry_trace_request(w->t, n - 1)->arrival_ns - ferry_trace_request(w->t, 0)->arrival_ns;
  return span > 0 ? (double)(n - 1) / ((double)span / 1e9) : 0;
}

double plan_workload_mean_output(const struct plan_workload *w) {
  const size_t n = plan_workload_count(w, 1);
  double sum = 0;
  for (size_t i = 0; i < n; i++) {
    const int32_t o = ferry_trace_request(w->t, i)->output_tokens;
    sum += o > 0 ? o : 1; /* the engine generates at least one token */
  }
  return n ? sum / (double)n : 0;
}

const char *plan_workload_dir(const struct plan_workload *w) { return w->dir; }

const char *plan_workload_file(const struct plan_workload *w, int replicas, char *buf, size_t len) {
  snprintf(buf, len, "%s/r%d.jsonl", w->dir, replicas);
  return buf;
}

int plan_workload_prepare(struct plan_workload *w, int replicas) {
  if (replicas < 1 || replicas > PLAN_MAX_REPLICAS) return cli_fail(FERRY_ERR_INVALID, "plan: %d replicas", replicas);
  if (w->prepared[replicas]) return CLI_OK;
  const size_t n = plan_workload_count(w, replicas);
  if (n < (size_t)replicas * 2)
    return cli_fail(FERRY_ERR_INVALID, "plan: the workload has %zu requests; %d replicas need at least %d", n, replicas,
                    replicas * 2);
  if (plan_workload_rate(w, replicas) <= 0)
    return cli_fail(FERRY_ERR_INVALID,
                    "plan: the workload's %zu requests all arrive at once: it has no rate to scale (give a trace "
                    "or a synthetic spec with arrivals over time)",
                    n);
  char path[4200];
  ferry_status st = ferry_trace_write_jsonl_subset(w->t, plan_workload_file(w, replicas, path, sizeof path), n, 0, 1);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  w->prepared[replicas] = 1;
  return CLI_OK;
}

/* The synthetic spec with n set to `n` and a rate (any: probes rescale it) when it has none. */
static char *synthetic_spec(const char *spec, int64_t n, int64_t *given_n) {
  size_t len = strlen(spec) + 64;
  char *out = ferry__calloc(1, len), *copy = ferry__strdup(spec);
  if (!out || !copy) {
    ferry_free(out);
    ferry_free(copy);
    return NULL;
  }
  int has_rate = 0;
  size_t used = 0;
  *given_n = 0;
  for (char *save = NULL, *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
    if (!strncmp(item, "n=", 2)) {
      *given_n = strtoll(item + 2, NULL, 10);
      continue;
    }
    if (!strncmp(item, "rate=", 5)) has_rate = 1;
    used += (size_t)snprintf(out + used, len - used, "%s%s", used ? "," : "", item);
  }
  snprintf(out + used, len - used, "%sn=%lld%s", used ? "," : "", (long long)n, has_rate ? "" : ",rate=1");
  ferry_free(copy);
  return out;
}

int plan_workload_open(const struct plan_opts *o, struct plan_workload **out) {
  *out = NULL;
  struct plan_workload *w = ferry__calloc(1, sizeof *w);
  if (!w) return cli_fail(FERRY_ERR_NOMEM, "out of memory");
  int max_replicas = o->max_gpus > 0 ? o->max_gpus : 1;
  /* the multi-GPU machines of the catalogue are replicas too: room for the largest allowed */
  if (max_replicas > PLAN_MAX_REPLICAS) max_replicas = PLAN_MAX_REPLICAS;
  w->per_replica = o->requests;
  struct ferry_trace_options to = {.skip_bad = o->skip_bad, .rate_scale = 1.0};
  ferry_status st;
  if (o->trace_format && (st = ferry_trace_format_parse(o->trace_format, &to.format)) != FERRY_OK) {
    ferry_free(w);
    return cli_usage_error("plan", "--trace-format: %s", ferry_last_error());
  }
  if (o->time_window && ferry__parse_window_ns(o->time_window, &to.window_start_ns, &to.window_end_ns) != FERRY_OK) {
    ferry_free(w);
    return cli_usage_error("plan", "--time-window: %s", ferry_last_error());
  }
  if (o->synthetic) {
    int64_t given_n = 0, n = o->requests;
    if (n < (int64_t)MIN_PER_REPLICA * max_replicas) n = (int64_t)MIN_PER_REPLICA * max_replicas;
    char *spec = synthetic_spec(o->synthetic, n, &given_n);
    if (!spec) {
      ferry_free(w);
      return cli_fail(FERRY_ERR_NOMEM, "out of memory");
    }
    st = ferry_trace_synthetic_open(&w->t, spec, o->seed, &to);
    ferry_free(spec);
  } else {
    st = ferry_trace_open(&w->t, o->trace, &to);
  }
  if (st != FERRY_OK) {
    ferry_free(w);
    return cli_fail(st, NULL);
  }
  if (ferry_trace_count(w->t) < 2) {
    plan_workload_close(w);
    return cli_fail(FERRY_ERR_INVALID, "plan: the workload has fewer than 2 requests");
  }
  if (o->db) {
    snprintf(w->dir, sizeof w->dir, "%s.plan", o->db);
    if (mkdir(w->dir, 0777) != 0 && errno != EEXIST) {
      int e = errno;
      plan_workload_close(w);
      return cli_fail(FERRY_ERR_IO, "plan: cannot create %s.plan: %s", o->db, strerror(e));
    }
    w->keep = 1;
  } else {
    const char *tmp = getenv("TMPDIR");
    snprintf(w->dir, sizeof w->dir, "%s/ferry-plan-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(w->dir)) {
      int e = errno;
      w->dir[0] = '\0';
      plan_workload_close(w);
      return cli_fail(FERRY_ERR_IO, "plan: cannot create a temporary folder: %s", strerror(e));
    }
  }
  *out = w;
  return plan_workload_prepare(w, 1);
}

void plan_workload_close(struct plan_workload *w) {
  if (!w) return;
  if (w->dir[0] && !w->keep) ferry__rm_rf(w->dir);
  ferry_trace_free(w->t);
  ferry_free(w);
}
