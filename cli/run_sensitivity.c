/* `ferry sim --sensitivity PCT`: which figures of the hardware profile and runtime an answer
 * hinges on. The run is simulated once as given and once more per figure that scales a cost
 * (ferry_hw_figures(): rates, times, efficiencies) with that one figure PCT % lower; the table
 * gives how mean TTFT, mean TPOT, e2e p99 and throughput move, with what each figure rests on.
 * A figure that moves the answer and rests on no source (a ferry default, an estimate) is
 * warned about: it is the one to measure (ferry calibrate) before trusting the answer. The runs
 * share out over --jobs processes forked before any of them (the simulations are independent;
 * each child writes its results as fixed-size records down a pipe of its own). */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/run_common.h"
#include "common/alloc.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"

/* The summary figures compared, as the table heads them. */
enum { M_TTFT, M_TPOT, M_E2E_P99, M_TOK_S, M_COUNT };
static const char *const metric_head[M_COUNT] = {"TTFT mean", "TPOT mean", "e2e p99", "tok/s"};
static const char *const metric_key[M_COUNT] = {"ttft_mean_change_pct", "tpot_mean_change_pct",
                                                "e2e_p99_change_pct", "tokens_per_s_change_pct"};

/* A change below this (percent) is no change: the simulation is deterministic, so anything
 * above it is the figure's doing, but a table of 0.0 % rows says nothing. */
#define SENS_NOISE_PCT 0.05

struct sens_row {
  const struct ferry_hw_figure *fig;
  char value_text[40]; /* the lowered value as set */
  int ok;              /* the run succeeded */
  char error[160];     /* why not */
  double change_pct[M_COUNT];
  double largest; /* the largest |change|, for ordering */
};

static void metrics(const struct ferry_serve_summary *s, double out[M_COUNT]) {
  out[M_TTFT] = s->ttft.count ? s->ttft.mean : NAN;
  out[M_TPOT] = s->tpot.count ? s->tpot.mean : NAN;
  out[M_E2E_P99] = s->e2e.count ? s->e2e.p99 : NAN;
  out[M_TOK_S] = s->tokens_per_s;
}

int run_figure_lowered(const struct ferry_hw_figure *f, double pct, char *out, size_t len) {
  const double v = f->value * (1.0 - pct / 100.0);
  if (f->integer) {
    const long long r = llround(v);
    if ((double)r == f->value) return 0;
    snprintf(out, len, "%lld", r);
  } else {
    char text[FERRY_DOUBLE_TEXT_MAX];
    ferry__double_text(v, text);
    snprintf(out, len, "%s", text);
  }
  return 1;
}

static int run_one(const struct run_args *given, const char *path, const char *value,
                   struct ferry_serve_summary *sum) {
  struct run_args a = *given; /* run_execute() fills defaults in: each run starts afresh */
  a.summary_out = sum;
  a.hw_figure_path = path;
  a.hw_figure_value = value;
  if (path) { /* nothing of a lowered run is printed: no progress, no replica lines (text only) */
    a.progress = 0;
    a.output_format = CLI_FORMAT_JSON;
  }
  return run_execute(&a);
}

static int by_largest(const void *x, const void *y) {
  const struct sens_row *a = x, *b = y;
  if (a->ok != b->ok) return a->ok ? -1 : 1;
  if (a->largest != b->largest) return a->largest > b->largest ? -1 : 1;
  return a->fig < b->fig ? -1 : a->fig > b->fig; /* the profile's order among equals */
}

const char *run_basis_unsourced(enum ferry_hw_basis b) {
  switch (b) {
  case FERRY_HW_BASIS_DEFAULT: return "a ferry default, not a measurement";
  case FERRY_HW_BASIS_ESTIMATE: return "an estimate";
  case FERRY_HW_BASIS_NONE: return "given without a source";
  default: return NULL;
  }
}

static void print_text(const struct ferry_serve_summary *base, const struct sens_row *rows, size_t n, double pct) {
  ferry_serve_summary_print(base, stdout);
  printf("\nsensitivity: each figure %g %% lower, one run each (%zu runs); change of the run's figures\n", pct, n);
  printf("%-34s %12s  %-8s", "figure", "value", "basis");
  for (int m = 0; m < M_COUNT; m++) printf(" %10s", metric_head[m]);
  printf("\n");
  size_t quiet = 0;
  for (size_t i = 0; i < n; i++) {
    const struct sens_row *r = &rows[i];
    if (r->ok && r->largest < SENS_NOISE_PCT) {
      quiet++;
      continue;
    }
    printf("%-34s %12.6g  %-8s", r->fig->path, r->fig->value, ferry_hw_basis_name(r->fig->basis));
    if (!r->ok) {
      printf(" failed: %s\n", r->error);
      continue;
    }
    for (int m = 0; m < M_COUNT; m++) {
      if (isnan(r->change_pct[m])) printf(" %10s", "-");
      else printf(" %+8.1f %%", r->change_pct[m]);
    }
    printf("\n");
  }
  if (quiet) {
    printf("no change (under %g %%):", SENS_NOISE_PCT);
    for (size_t i = 0; i < n; i++)
      if (rows[i].ok && rows[i].largest < SENS_NOISE_PCT) printf(" %s", rows[i].fig->path);
    printf("\n");
  }
}

static int emit(const struct run_args *given, const struct ferry_serve_summary *base, const struct sens_row *rows,
                size_t n) {
  cJSON *doc = cJSON_CreateObject();
  if (!doc) return cli_fail(FERRY_ERR_NOMEM, "out of memory");
  cJSON_AddStringToObject(doc, "schema", "ferry.sensitivity.v1");
  cli_json_str(doc, "hw", given->hw);
  cli_json_str(doc, "runtime", given->runtime);
  cJSON_AddNumberToObject(doc, "step_pct", given->sensitivity);
  cJSON *b = cJSON_AddObjectToObject(doc, "base");
  cli_json_num(b, "ttft_mean_ms", base->ttft.count ? base->ttft.mean * 1e-6 : NAN);
  cli_json_num(b, "tpot_mean_ms", base->tpot.count ? base->tpot.mean * 1e-6 : NAN);
  cli_json_num(b, "e2e_p99_ms", base->e2e.count ? base->e2e.p99 * 1e-6 : NAN);
  cli_json_num(b, "tokens_per_s", base->tokens_per_s);
  cJSON *list = cJSON_AddArrayToObject(doc, "figures");
  for (size_t i = 0; list && i < n; i++) {
    const struct sens_row *r = &rows[i];
    cJSON *o = cJSON_CreateObject();
    if (!o) break;
    cJSON_AddStringToObject(o, "figure", r->fig->path);
    cJSON_AddNumberToObject(o, "value", r->fig->value);
    cJSON_AddStringToObject(o, "lowered_to", r->value_text);
    cJSON_AddStringToObject(o, "basis", ferry_hw_basis_name(r->fig->basis));
    cJSON_AddStringToObject(o, "source", r->fig->source);
    for (int m = 0; m < M_COUNT; m++) cli_json_num(o, metric_key[m], r->ok ? r->change_pct[m] : NAN);
    cli_json_str(o, "error", r->ok ? NULL : r->error);
    cJSON_AddItemToArray(list, o);
  }
  const int rc = cli_emit(stdout, doc, given->output_format == CLI_FORMAT_JSON ? NULL : "figures", given->output_format);
  cJSON_Delete(doc);
  return rc;
}

/* A figure that moves the answer by at least a tenth of its own change and rests on no source:
 * said on stderr, as calibrate warns of a poor fit. */
static void warn_unsourced(const struct sens_row *rows, size_t n, double pct) {
  fflush(stdout); /* after the table, not inside it */
  for (size_t i = 0; i < n; i++) {
    const struct sens_row *r = &rows[i];
    const char *what = run_basis_unsourced(r->fig->basis);
    if (!r->ok || !what || r->largest < pct / 10) continue;
    int m = 0;
    for (int k = 1; k < M_COUNT; k++)
      if (!isnan(r->change_pct[k]) && (isnan(r->change_pct[m]) || fabs(r->change_pct[k]) > fabs(r->change_pct[m])))
        m = k;
    fprintf(stderr,
            "ferry: sensitivity: %s moves %+.1f %% with %s %g %% lower, and that figure is %s: measure it (ferry "
            "calibrate) or give a sourced one (--hw BASE+%s=VALUE)\n",
            metric_head[m], r->change_pct[m], r->fig->path, pct, what, r->fig->path);
  }
}

/* What one lowered run gives back: the summary figures compared, or why it failed. Written whole
 * down a pipe by a worker (smaller than PIPE_BUF: one write, never torn). */
struct sens_result {
  int32_t index; /* into the rows */
  int32_t ok;
  double after[M_COUNT];
  char error[160];
};

static void run_row(const struct run_args *given, const struct sens_row *r, int32_t index, struct sens_result *out) {
  memset(out, 0, sizeof *out);
  out->index = index;
  struct ferry_serve_summary sum;
  if (run_one(given, r->fig->path, r->value_text, &sum) != CLI_OK) {
    snprintf(out->error, sizeof out->error, "%s", ferry_last_error());
    return;
  }
  out->ok = 1;
  metrics(&sum, out->after);
}

static void take_result(struct sens_row *rows, const double before[M_COUNT], const struct sens_result *res) {
  struct sens_row *r = &rows[res->index];
  r->ok = res->ok;
  if (!res->ok) {
    snprintf(r->error, sizeof r->error, "%s", res->error);
    return;
  }
  for (int m = 0; m < M_COUNT; m++) {
    r->change_pct[m] = before[m] > 0 && isfinite(res->after[m]) ? 100.0 * (res->after[m] - before[m]) / before[m] : NAN;
    if (!isnan(r->change_pct[m]) && fabs(r->change_pct[m]) > r->largest) r->largest = fabs(r->change_pct[m]);
  }
}

/* Worker w of `jobs`: rows w, w + jobs, ... down its pipe, then exit without flushing what the
 * parent's stdio holds. */
static void worker(const struct run_args *given, const struct sens_row *rows, size_t n, int w, int jobs, int fd) {
  for (size_t i = (size_t)w; i < n; i += (size_t)jobs) {
    struct sens_result res;
    run_row(given, &rows[i], (int32_t)i, &res);
    if (ferry__write_all(fd, &res, sizeof res, "sensitivity results", NULL) != FERRY_OK) _exit(1);
  }
  _exit(0);
}

/* At most --jobs' own bound (run_options.h): the default, the cores online, may exceed it. */
#define SENS_MAX_JOBS 256

struct sens_pool {
  int n;
  pid_t pid[SENS_MAX_JOBS];
  int fd[SENS_MAX_JOBS];
};

/* Fork `jobs` workers; the parent keeps the read ends. */
static int pool_start(struct sens_pool *p, const struct run_args *given, const struct sens_row *rows, size_t n,
                      int jobs) {
  p->n = 0;
  fflush(stdout);
  fflush(stderr);
  for (int w = 0; w < jobs; w++) {
    int fds[2];
    if (pipe(fds)) return cli_fail(FERRY_ERR_IO, "sensitivity: pipe: %s", strerror(errno));
    const pid_t pid = fork();
    if (pid < 0) {
      close(fds[0]), close(fds[1]);
      return cli_fail(FERRY_ERR_IO, "sensitivity: fork: %s", strerror(errno));
    }
    if (pid == 0) {
      close(fds[0]);
      for (int i = 0; i < p->n; i++) close(p->fd[i]);
      worker(given, rows, n, w, jobs, fds[1]);
    }
    close(fds[1]);
    p->pid[p->n] = pid, p->fd[p->n] = fds[0];
    p->n++;
  }
  return CLI_OK;
}

static void pool_stop(struct sens_pool *p) {
  for (int i = 0; i < p->n; i++) kill(p->pid[i], SIGTERM);
  for (int i = 0; i < p->n; i++) {
    close(p->fd[i]);
    waitpid(p->pid[i], NULL, 0);
  }
  p->n = 0;
}

/* Read every worker's results as they come; a worker that died leaves its rows failed. */
static int pool_collect(struct sens_pool *p, struct sens_row *rows, size_t n, const double before[M_COUNT],
                        int progress) {
  struct pollfd pfd[SENS_MAX_JOBS];
  size_t done = 0;
  int open_fds = p->n;
  for (int i = 0; i < p->n; i++) pfd[i] = (struct pollfd){.fd = p->fd[i], .events = POLLIN};
  while (open_fds > 0) {
    if (poll(pfd, (nfds_t)p->n, -1) < 0) {
      if (errno == EINTR) continue;
      return cli_fail(FERRY_ERR_IO, "sensitivity: poll: %s", strerror(errno));
    }
    for (int i = 0; i < p->n; i++) {
      if (pfd[i].fd < 0 || !(pfd[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      struct sens_result res;
      ssize_t got;
      do got = read(pfd[i].fd, &res, sizeof res);
      while (got < 0 && errno == EINTR);
      if (got == (ssize_t)sizeof res && res.index >= 0 && (size_t)res.index < n) {
        take_result(rows, before, &res);
        if (progress) fprintf(stderr, "ferry: sensitivity: %zu of %zu runs done (%s)\n", ++done, n, rows[res.index].fig->path);
        continue;
      }
      close(pfd[i].fd); /* end of its results (a record is one write: never torn) */
      pfd[i].fd = -1;
      open_fds--;
    }
  }
  for (int i = 0; i < p->n; i++) waitpid(p->pid[i], NULL, 0);
  return CLI_OK;
}

int run_sensitivity(const struct run_args *given) {
  const double pct = given->sensitivity;
  struct ferry_serve_summary base;
  struct ferry_hw_figure *figs = NULL;
  struct sens_row *rows = NULL;
  size_t n = 0, kept = 0;
  ferry_hw *hw = NULL;
  int rc = CLI_OK;
  ferry_status st = run_open_sim_profile(given, &hw);
  if (st == FERRY_OK) st = ferry_hw_figures(ferry_hw_get(hw), &figs, &n);
  if (st != FERRY_OK) {
    rc = cli_fail(st, NULL);
    goto out;
  }
  if (n && !(rows = ferry__calloc(n, sizeof *rows))) {
    rc = cli_fail(FERRY_ERR_NOMEM, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++) { /* a figure lowering does not change (a time of 1 ns) is left out */
    rows[kept].fig = &figs[i];
    if (run_figure_lowered(&figs[i], pct, rows[kept].value_text, sizeof rows[kept].value_text)) kept++;
  }
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int jobs = given->jobs > 0 ? (int)given->jobs : cores > 0 ? (int)cores : 1;
  if (jobs > SENS_MAX_JOBS) jobs = SENS_MAX_JOBS;
  if ((size_t)jobs > kept) jobs = (int)kept;
  /* the workers go first, before this process has run anything (no thread of a run to fork) */
  struct sens_pool pool = {0};
  if (jobs > 1 && (rc = pool_start(&pool, given, rows, kept, jobs)) != CLI_OK) goto out;
  rc = run_one(given, NULL, NULL, &base);
  double before[M_COUNT];
  metrics(&base, before);
  if (jobs > 1 && rc != CLI_OK) { /* the run as given fails: the others are not wanted */
    pool_stop(&pool);
  } else if (jobs > 1) {
    rc = pool_collect(&pool, rows, kept, before, given->progress);
  } else if (rc == CLI_OK) {
    for (size_t i = 0; i < kept; i++) {
      if (given->progress)
        fprintf(stderr, "ferry: sensitivity %zu of %zu: %s %g -> %s\n", i + 1, kept, rows[i].fig->path,
                rows[i].fig->value, rows[i].value_text);
      struct sens_result res;
      run_row(given, &rows[i], (int32_t)i, &res);
      take_result(rows, before, &res);
    }
  }
  if (rc != CLI_OK) goto out;
  for (size_t i = 0; i < kept; i++)
    if (!rows[i].ok && !rows[i].error[0]) snprintf(rows[i].error, sizeof rows[i].error, "its worker process died");
  qsort(rows, kept, sizeof *rows, by_largest);
  if (given->output_format == CLI_FORMAT_TEXT) print_text(&base, rows, kept, pct);
  else rc = emit(given, &base, rows, kept);
  warn_unsourced(rows, kept, pct);
out:
  ferry_free(rows);
  ferry_hw_figures_free(figs);
  ferry_hw_close(hw);
  return rc;
}
