/* The simulations of `ferry plan`: one job is one configuration at one rate on one profile,
 * R replicas each replaying its share of the requests through `ferry sim`'s own code (the
 * option parser and run_execute, so a probe is exactly the `ferry sim` command it prints).
 * Workers are forked processes reading jobs from a pipe and writing results back: the
 * simulator is deterministic, so which worker runs a job changes nothing. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/mpi.h"
#include "cli/plan.h"
#include "cli/run_common.h"
#include "common/alloc.h"
#include "common/metrics.h"
#include "ferry/engine.h"

static void arg(struct plan_argv *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void arg(struct plan_argv *a, const char *fmt, ...) {
  if (a->n >= (int)(sizeof a->v / sizeof a->v[0]) - 1) return;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(a->store + a->used, sizeof a->store - a->used, fmt, ap);
  va_end(ap);
  if (k < 0 || (size_t)k >= sizeof a->store - a->used) return;
  a->v[a->n++] = a->store + a->used;
  a->v[a->n] = NULL;
  a->used += (size_t)k + 1;
}

void plan_knobs_text(const struct plan_opts *o, const struct plan_knobs *k, char *buf, size_t len) {
  size_t n = (size_t)snprintf(buf, len, "%s, batch %d", o->quant[k->quant] ? o->quant[k->quant] : "native", k->max_batch);
  if (k->block_layers > 0 && n < len) n += (size_t)snprintf(buf + n, len - n, ", block %d", k->block_layers);
  if (k->prefetch_depth >= 0 && n < len) n += (size_t)snprintf(buf + n, len - n, ", prefetch %d", k->prefetch_depth);
  if (k->expert_lfu > 0 && n < len) n += (size_t)snprintf(buf + n, len - n, ", expert cache lfu");
  if (k->gpus > 1 && n < len) snprintf(buf + n, len - n, ", %s %d", plan_parallel_name(k->parallel), k->gpus);
}

const char *plan_parallel_name(int parallel) {
  static const char *const names[] = {"none", "tp", "pp", "ep"};
  return parallel >= 0 && parallel <= PLAN_PAR_EP ? names[parallel] : "none";
}

/* Chunked prefill: at least 256 tokens a step (the engine's default), and room for a prefill
 * chunk beside a full batch of decodes. */
static int32_t step_tokens(int32_t batch) { return batch * 2 > 256 ? batch * 2 : 256; }

void plan_job_argv(const struct plan_opts *o, const char *hw_name, const struct plan_workload *w,
                   const struct plan_job *j, const char *db, struct plan_argv *a) {
  memset(a, 0, sizeof *a);
  char file[4200];
  arg(a, "sim");
  arg(a, "--model");
  arg(a, "%s", o->model);
  arg(a, "--hw");
  arg(a, "%s", hw_name);
  arg(a, "--trace");
  arg(a, "%s", plan_workload_file(w, j->replicas, file, sizeof file));
  if (j->kind == PLAN_JOB_BOUND) {
    arg(a, "--as-fast-as-possible");
  } else {
    arg(a, "--rate-scale");
    arg(a, "%.17g", j->rps / plan_workload_rate(w, j->replicas));
  }
  if (o->skip_bad) arg(a, "--skip-bad");
  if (o->moe) {
    /* the synthetic routing's seed; a dense model from a trace draws nothing */
    arg(a, "--seed");
    arg(a, "%llu", (unsigned long long)o->seed);
  }
  if (o->quant[j->k.quant]) {
    arg(a, "--quant");
    arg(a, "%s", o->quant[j->k.quant]);
  }
  arg(a, "--max-batch");
  arg(a, "%d", j->k.max_batch);
  arg(a, "--max-step-tokens");
  arg(a, "%d", step_tokens(j->k.max_batch));
  if (j->k.block_layers > 0) {
    arg(a, "--block-layers");
    arg(a, "%d", j->k.block_layers);
  }
  if (j->k.prefetch_depth >= 0) {
    arg(a, "--prefetch-depth");
    arg(a, "%d", j->k.prefetch_depth);
  }
  if (j->k.expert_lfu > 0) {
    arg(a, "--expert-cache");
    arg(a, "lfu");
  }
  if (j->k.gpus > 1) {
    arg(a, "--gpus");
    arg(a, "%d", j->k.gpus);
    arg(a, "--parallel");
    arg(a, "%s", plan_parallel_name(j->k.parallel));
  }
  if (j->replicas > 1) {
    arg(a, "--replicas");
    arg(a, "%d", j->replicas);
    arg(a, "--router");
    arg(a, "%s", PLAN_ROUTER);
  }
  if (o->runtime) {
    arg(a, "--runtime");
    arg(a, "%s", o->runtime);
  }
  if (db) {
    arg(a, "--db");
    arg(a, "%s", db);
  }
  arg(a, "--quiet");
}

void plan_on_served(void *user, const ferry_engine *eng) {
  struct plan_served *s = user;
  int64_t n;
  const struct ferry_request_metrics *m = ferry_engine_request_metrics(eng, &n);
  if (s->nseg < PLAN_MAX_REPLICAS) s->seg[s->nseg++] = s->n; /* this replica's start */
  for (int64_t i = 0; i < n; i++) {
    if (s->n == s->cap) {
      size_t cap = s->cap ? s->cap * 2 : 256;
      int64_t *v[4] = {ferry__reallocarray(s->arrival, cap, sizeof(int64_t)),
                       ferry__reallocarray(s->first, cap, sizeof(int64_t)),
                       ferry__reallocarray(s->finish, cap, sizeof(int64_t)),
                       ferry__reallocarray(s->output, cap, sizeof(int64_t))};
      if (v[0]) s->arrival = v[0];
      if (v[1]) s->first = v[1];
      if (v[2]) s->finish = v[2];
      if (v[3]) s->output = v[3];
      if (!v[0] || !v[1] || !v[2] || !v[3]) {
        s->oom = 1;
        return;
      }
      s->cap = cap;
    }
    s->arrival[s->n] = m[i].arrival_ns;
    s->first[s->n] = m[i].rejected ? -1 : m[i].first_token_ns;
    s->finish[s->n] = m[i].rejected ? -1 : m[i].finish_ns;
    s->output[s->n] = m[i].output_tokens;
    s->n++;
  }
}

void plan_served_free(struct plan_served *s) {
  ferry_free(s->arrival);
  ferry_free(s->first);
  ferry_free(s->finish);
  ferry_free(s->output);
  memset(s, 0, sizeof *s);
}

static void fill_stat(double *dst, double *v, size_t n) {
  struct ferry__dist d;
  ferry__dist_compute(v, n, &d);
  dst[0] = d.mean, dst[1] = d.p50, dst[2] = d.p90, dst[3] = d.p99;
}

void plan_job_run(const struct plan_opts *o, const char *hw_name, const struct plan_workload *w,
                  const struct plan_job *j, struct plan_result *r) {
  if (j->prefix > 0 && plan_floor_prove(o, hw_name, w, j, r)) {
    r->id = j->id;
    return;
  }
  memset(r, 0, sizeof *r);
  r->id = j->id;
  double *ttft = NULL, *tpot = NULL, *e2e = NULL;
  struct plan_served all = {0};
  struct plan_argv av;
  plan_job_argv(o, hw_name, w, j, j->kind == PLAN_JOB_RECORD ? o->db : NULL, &av);
  struct run_args a;
  struct ferry_serve_summary sum;
  int rc = run_parse(av.n, av.v, "sim", &a);
  if (rc == 0) {
    if (j->figure[0]) a.hw_figure_path = j->figure, a.hw_figure_value = j->figure_value;
    a.summary_out = &sum;
    a.on_served = plan_on_served;
    a.served_user = &all;
    rc = run_execute(&a);
  }
  r->ok = rc == 0 && !all.oom;
  if (!r->ok) {
    snprintf(r->error, sizeof r->error, "%s", all.oom ? "out of memory" : ferry_last_error());
    goto out;
  }
  if (j->kind == PLAN_JOB_RECORD) r->run_ids[r->n_run_ids++] = a.run_id_out;
  r->streams = sum.bytes_h2d > 0 || sum.bytes_disk > 0;
  r->duration_s = (double)sum.duration_ns / 1e9;
  all.seg[all.nseg] = all.n;
  for (int i = 0; i < all.nseg; i++) {
    /* each replica's queue on its own: one saturated replica is a saturated service */
    const size_t b = all.seg[i], e = all.seg[i + 1];
    struct ferry_plan_load load;
    if (ferry_plan_load_analyze(all.arrival + b, all.first + b, all.finish + b, e - b, &load) == FERRY_OK) {
      r->saturated |= load.saturated;
      if (load.queue_growth_rps > r->queue_growth_rps) r->queue_growth_rps = load.queue_growth_rps;
    }
  }
  if (!r->ok) goto out;
  ttft = ferry__calloc(all.n + 1, sizeof *ttft);
  tpot = ferry__calloc(all.n + 1, sizeof *tpot);
  e2e = ferry__calloc(all.n + 1, sizeof *e2e);
  if (!ttft || !tpot || !e2e) {
    r->ok = 0;
    snprintf(r->error, sizeof r->error, "out of memory");
    goto out;
  }
  size_t nt = 0, np = 0;
  double out_tokens = 0;
  for (size_t i = 0; i < all.n; i++) {
    struct ferry__request_latency l;
    r->requests++;
    if (!ferry__request_latency(all.arrival[i], all.first[i], all.finish[i], all.output[i], &l)) continue;
    r->done++;
    out_tokens += (double)all.output[i];
    ttft[nt] = l.ttft_ns;
    e2e[nt++] = l.e2e_ns;
    if (l.has_tpot) tpot[np++] = l.tpot_ns;
  }
  fill_stat(r->ttft, ttft, nt);
  fill_stat(r->e2e, e2e, nt);
  fill_stat(r->tpot, tpot, np);
  r->mean_output_tokens = r->done ? out_tokens / (double)r->done : 0;
  r->throughput_rps = r->duration_s > 0 ? (double)r->done / r->duration_s : 0;
out:
  ferry_free(ttft);
  ferry_free(tpot);
  ferry_free(e2e);
  plan_served_free(&all);
}

int plan_meets_slo(const struct plan_opts *o, const struct plan_result *r, char *why, size_t len, double *excess) {
  static const char *const metric[] = {"ttft", "tpot", "e2e"}, *const stat[] = {"mean", "p50", "p90", "p99"};
  double worst = 0;
  if (excess) *excess = 0;
  if (!r->ok) {
    snprintf(why, len, "failed: %s", r->error);
    return 0;
  }
  if (r->done < r->requests) {
    snprintf(why, len, "%lld of %lld requests never finished", (long long)(r->requests - r->done),
             (long long)r->requests);
    return 0;
  }
  if (r->saturated) {
    snprintf(why, len, "saturated: the queue grows without bound (%.3g requests/s more waiting each second)",
             r->queue_growth_rps);
    return 0;
  }
  int first = -1;
  for (int i = 0; i < o->n_slo; i++) {
    const struct plan_slo *s = &o->slo[i];
    const double *v = s->metric == PLAN_TTFT ? r->ttft : s->metric == PLAN_TPOT ? r->tpot : r->e2e;
    if (v[s->stat] / s->limit_ns > worst) worst = v[s->stat] / s->limit_ns;
    if (!(v[s->stat] <= s->limit_ns) && first < 0) first = i;
  }
  if (excess) *excess = worst;
  if (first >= 0) {
    const struct plan_slo *s = &o->slo[first];
    const double *v = s->metric == PLAN_TTFT ? r->ttft : s->metric == PLAN_TPOT ? r->tpot : r->e2e;
    snprintf(why, len, "%s_%s %.4g ms > %.4g ms", metric[s->metric], stat[s->stat], v[s->stat] / 1e6, s->limit_ns / 1e6);
    return 0;
  }
  snprintf(why, len, "meets the SLO");
  return 1;
}

/* ---- the worker pool ---------------------------------------------------------------------- */

struct worker {
  pid_t pid;
  int job_fd, result_fd;
  int busy;
};

struct plan_pool {
  struct worker *w;
  int n;
  struct cli_mpi *mpi;  /* the other ranks, one worker each; NULL or size 1 without */
  unsigned char *remote_busy; /* by rank */
  const struct plan_opts *o;
  struct plan_workload *w_files;
};

static int write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    p += k, n -= (size_t)k;
  }
  return 0;
}

static int read_all(int fd, void *buf, size_t n) {
  char *p = buf;
  while (n) {
    ssize_t k = read(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    p += k, n -= (size_t)k;
  }
  return 0;
}

/* The sims' own messages would interleave with the plan's: their errors come back in the
 * results instead. */
static void quiet_output(void) {
  int devnull = open("/dev/null", O_WRONLY);
  if (devnull >= 0) {
    dup2(devnull, 1);
    dup2(devnull, 2);
    close(devnull);
  }
}

static void worker_main(const struct plan_opts *o, const char *const *hw_names, const struct plan_workload *w,
                        int job_fd, int result_fd) {
  quiet_output();
  struct plan_job j;
  struct plan_result r;
  while (read_all(job_fd, &j, sizeof j) == 0) {
    plan_job_run(o, hw_names[j.hw], w, &j, &r);
    if (write_all(result_fd, &r, sizeof r) != 0) break;
  }
  _exit(0);
}

int plan_pool_start(const struct plan_opts *o, const char *const *hw_names, const struct plan_workload *w, int n,
                    struct cli_mpi *mpi, struct plan_pool **out) {
  *out = NULL;
  struct plan_pool *p = ferry__calloc(1, sizeof *p);
  if (!p || !(p->w = ferry__calloc((size_t)(n > 0 ? n : 1), sizeof *p->w)) ||
      !(p->remote_busy = ferry__calloc((size_t)(mpi ? mpi->size : 1) + 1, 1))) {
    if (p) ferry_free(p->w);
    ferry_free(p);
    return cli_fail(FERRY_ERR_NOMEM, "out of memory");
  }
  p->mpi = mpi && mpi->size > 1 ? mpi : NULL;
  p->o = o;
  fflush(NULL);
  const pid_t parent = getpid();
  for (int i = 0; i < n; i++) {
    int jobs[2], results[2];
    if (pipe(jobs) != 0 || pipe(results) != 0) {
      plan_pool_stop(p);
      return cli_fail(FERRY_ERR_IO, "plan: pipe: %s", strerror(errno));
    }
    pid_t pid = fork();
    if (pid < 0) {
      plan_pool_stop(p);
      return cli_fail(FERRY_ERR_IO, "plan: fork: %s", strerror(errno));
    }
    if (pid == 0) {
      /* die with the plan, even killed outright */
      if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent) _exit(127);
      for (int k = 0; k < i; k++) {
        close(p->w[k].job_fd);
        close(p->w[k].result_fd);
      }
      close(jobs[1]);
      close(results[0]);
      worker_main(o, hw_names, w, jobs[0], results[1]);
    }
    close(jobs[0]);
    close(results[1]);
    p->w[i] = (struct worker){.pid = pid, .job_fd = jobs[1], .result_fd = results[0]};
    p->n++;
  }
  *out = p;
  return CLI_OK;
}

int plan_pool_slots(const struct plan_pool *p) { return p->n + (p->mpi ? p->mpi->size - 1 : 0); }

int plan_pool_idle_local(const struct plan_pool *p) {
  int n = 0;
  for (int i = 0; i < p->n; i++) n += !p->w[i].busy;
  return n;
}

int plan_pool_idle(const struct plan_pool *p) {
  int n = plan_pool_idle_local(p);
  for (int r = 1; p->mpi && r < p->mpi->size; r++) n += !p->remote_busy[r];
  return n;
}

int plan_pool_submit(struct plan_pool *p, const struct plan_job *j, int local_only) {
  /* the other ranks first: this machine's workers stay free for what must run here */
  for (int r = 1; !local_only && p->mpi && r < p->mpi->size; r++) {
    if (p->remote_busy[r]) continue;
    if (p->mpi->api->send(j, sizeof *j, r, CLI_MPI_TAG_JOB))
      return cli_fail(FERRY_ERR_IO, "plan: sending a job to rank %d failed", r);
    p->remote_busy[r] = 1;
    return CLI_OK;
  }
  for (int i = 0; i < p->n; i++) {
    if (p->w[i].busy) continue;
    if (write_all(p->w[i].job_fd, j, sizeof *j) != 0) return cli_fail(FERRY_ERR_IO, "plan: a worker stopped");
    p->w[i].busy = 1;
    return CLI_OK;
  }
  return cli_fail(FERRY_ERR_INTERNAL, "plan: no idle worker");
}

int plan_pool_wait(struct plan_pool *p, struct plan_result *r) {
  struct pollfd fds[256];
  int map[256], n = 0, remote = 0;
  for (int i = 0; i < p->n && n < 256; i++)
    if (p->w[i].busy) {
      fds[n] = (struct pollfd){.fd = p->w[i].result_fd, .events = POLLIN};
      map[n++] = i;
    }
  for (int k = 1; p->mpi && k < p->mpi->size; k++) remote += p->remote_busy[k];
  if (n == 0 && remote == 0) return cli_fail(FERRY_ERR_INTERNAL, "plan: waiting with nothing running");
  for (;;) {
    /* with ranks out, look at them every millisecond between the local pipes */
    int k = poll(fds, (nfds_t)n, remote ? 1 : -1);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return cli_fail(FERRY_ERR_IO, "plan: poll: %s", strerror(errno));
    for (int i = 0; k > 0 && i < n; i++) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      struct worker *w = &p->w[map[i]];
      w->busy = 0;
      if (read_all(w->result_fd, r, sizeof *r) != 0)
        return cli_fail(FERRY_ERR_INTERNAL, "plan: a simulation worker died (pid %d)", (int)w->pid);
      return CLI_OK;
    }
    if (remote) {
      int flag = 0, from = -1;
      if (p->mpi->api->iprobe(FERRY_MPI_ANY_SOURCE, CLI_MPI_TAG_RESULT, &flag, &from))
        return cli_fail(FERRY_ERR_IO, "plan: MPI probe failed");
      if (flag) {
        if (p->mpi->api->recv(r, sizeof *r, from, CLI_MPI_TAG_RESULT, NULL))
          return cli_fail(FERRY_ERR_IO, "plan: receiving a result from rank %d failed", from);
        p->remote_busy[from] = 0;
        return CLI_OK;
      }
    }
  }
}

void plan_pool_stop(struct plan_pool *p) {
  if (!p) return;
  for (int i = 0; i < p->n; i++) {
    close(p->w[i].job_fd); /* the worker reads EOF and exits */
    close(p->w[i].result_fd);
  }
  for (int i = 0; i < p->n; i++) {
    if (p->w[i].busy) kill(p->w[i].pid, SIGTERM);
    waitpid(p->w[i].pid, NULL, 0);
  }
  /* the other ranks: a job of kind -1 says stop (one still busy sends its result first) */
  for (int r = 1; p->mpi && r < p->mpi->size; r++) {
    if (p->remote_busy[r]) {
      struct plan_result ignored;
      p->mpi->api->recv(&ignored, sizeof ignored, r, CLI_MPI_TAG_RESULT, NULL);
    }
    struct plan_job stop = {.kind = -1};
    p->mpi->api->send(&stop, sizeof stop, r, CLI_MPI_TAG_JOB);
  }
  ferry_free(p->w);
  ferry_free(p->remote_busy);
  ferry_free(p);
}

int plan_remote_worker(const struct plan_opts *o, const char *const *hw_names, struct plan_workload *w,
                       struct cli_mpi *mpi) {
  quiet_output();
  struct plan_job j;
  struct plan_result r;
  for (;;) {
    if (mpi->api->recv(&j, sizeof j, 0, CLI_MPI_TAG_JOB, NULL)) return CLI_FAIL;
    if (j.kind < 0) return CLI_OK;
    /* this rank's own copy of the request slices: the same content, written here */
    if (plan_workload_prepare(w, j.replicas) != CLI_OK) {
      memset(&r, 0, sizeof r);
      r.id = j.id;
      snprintf(r.error, sizeof r.error, "rank %d could not write its request slices", mpi->rank);
    } else {
      plan_job_run(o, hw_names[j.hw], w, &j, &r);
    }
    if (mpi->api->send(&r, sizeof r, 0, CLI_MPI_TAG_RESULT)) return CLI_FAIL;
  }
}

int plan_same_runs(const struct plan_opts *o, const char *hw_name, const struct plan_workload *w,
                   const struct plan_knobs *k, const struct plan_knobs *twin) {
  struct plan_knobs t = *k;
  t.prefetch_depth = twin->prefetch_depth;
  if (memcmp(&t, twin, sizeof t) != 0) return 0;
  /* one replica's slice (it sizes the KV cache); the rate changes no budget */
  struct plan_job j = {.kind = PLAN_JOB_BOUND, .replicas = 1, .k = *k};
  struct plan_argv av, tv;
  plan_job_argv(o, hw_name, w, &j, NULL, &av);
  j.k = *twin;
  plan_job_argv(o, hw_name, w, &j, NULL, &tv);
  struct run_args a, b, parsed;
  if (run_parse(av.n, av.v, "sim", &a) != 0 || run_parse(tv.n, tv.v, "sim", &parsed) != 0) return 0;
  /* the twin as the same options but its depth, so the configurations compare byte for byte */
  b = a;
  b.prefetch_depth = parsed.prefetch_depth;
  b.given[RUN_OPT_prefetch_depth] = parsed.given[RUN_OPT_prefetch_depth];
  b.ec.prefetch_depth = parsed.ec.prefetch_depth;
  int used_a = 1, used_b = 1;
  if (run_prefetch_depth_used(&a, &used_a) != CLI_OK || run_prefetch_depth_used(&b, &used_b) != CLI_OK || used_a ||
      used_b)
    return 0;
  a.ec.prefetch_depth = b.ec.prefetch_depth;
  return memcmp(&a.ec, &b.ec, sizeof a.ec) == 0;
}
