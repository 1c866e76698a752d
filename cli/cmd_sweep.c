/* `ferry sweep`: the cartesian product of run parameters from a JSON spec, each combination run
 * as a child `ferry run` / `ferry sim` writing into one result database. Resumable (a
 * combination whose configuration hash has a complete run is skipped; the hash is computed by
 * the same code as the child's), parallel up to -j for simulations, one real run at a time.
 * Under mpirun the combinations are shared out over the ranks: each rank writes its own
 * database, which rank 0 receives and merges into the study (ferry_db_merge). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/mpi.h"
#include "cli/run_common.h"
#include "common/alloc.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/names.h"
#include "common/units.h"
#include "ferry/db.h"
#include "ferry/exec.h"
#include "ferry/exec_registry.h"

/* Spec keys: the options of `ferry run` / `ferry sim` that are part of the configuration (the
 * option table, run_options.h), named by their field: long names with underscores, and
 * executor for --backend (whose value sim runs `ferry sim`). A key that did not enter the hash
 * would make every value of it one run. */
static int is_key(enum run_opt id) { return run_option(id)->cfg != CFG_NO; }

static int is_flag(enum run_opt id) {
  const enum run_type t = run_option(id)->type;
  return t == TYPE_FLAG || t == TYPE_FLAG01;
}

enum state { PENDING, SKIPPED, RUNNING, DONE, FAILED, ELSEWHERE /* another MPI rank's */ };

struct combo {
  char **argv; /* "ferry", "run"|"sim", options..., NULL (owned) */
  int argc;
  char *desc;  /* swept keys only: "executor=sim block_layers=2" */
  char *config_json;
  char hash[17];
  int real;    /* host or cuda: measured alone */
  const char *kind; /* the executor's registry name (runs.kind) */
  char *model, *hw, *trace; /* for a failure row the child could not write */
  enum state state;
  pid_t pid;
  int log_fd;
  int64_t start_ns;
  char *error;
};

struct sweep {
  const char *spec_path, *db_path;
  int jobs, quiet, dry_run, tty;
  struct combo *c;
  size_t n;
  ferry_db *db;
  int64_t max_id_before;
  int64_t t0;
  size_t skipped, ran, failed, finished;
  size_t elsewhere; /* combinations other MPI ranks run */
};

static volatile sig_atomic_t interrupted;
static void on_signal(int sig) { interrupted = sig; }

static void usage(FILE *f) {
  fprintf(f,
          "Usage: ferry sweep --spec SPEC.json --db STUDY.db [-j N] [OPTIONS]\n"
          "Run every combination of the parameters in SPEC into one result database. SPEC is a JSON\n"
          "object mapping run options (long names with underscores) to lists of values, e.g.\n"
          "  {\"executor\": [\"host\", \"sim\"], \"hw\": [\"h100-pcie\"], \"model\": [\"build/tiny\"],\n"
          "   \"synthetic\": [\"rate=4,n=16,prompt=32,output=8\"], \"block_layers\": [1, 2, 4],\n"
          "   \"prefetch_depth\": [0, 1, 2]}\n"
          "executor names a registered executor (");
  for (size_t i = 0; i < ferry_exec_registry_count(); i++)
    fprintf(f, "%s%s", i ? ", " : "", ferry_exec_registry_at(i)->name);
  fprintf(f,
          "): one of a hardware profile (sim) runs\n"
          "'ferry sim', the others 'ferry run --backend X'; an option of the other command (hw for a host\n"
          "run, threads for a simulation) is left out of that combination.\n"
          "Booleans take true/false:\n  ");
  int n = 0;
  for (int i = 0; i < RUN_OPT_COUNT; i++)
    if (is_key((enum run_opt)i) && is_flag((enum run_opt)i))
      fprintf(f, "%s%s", n++ ? ", " : "", run_option((enum run_opt)i)->field);
  fprintf(f,
          "\n"
          "A combination whose configuration already has a complete run in the database is skipped, so\n"
          "an interrupted sweep is resumed by running it again. A failed run is recorded with its error\n"
          "and the sweep goes on; the exit status is 1 if any run failed.\n\n"
          "Options:\n"
          "  --spec FILE      the sweep specification (JSON)\n"
          "  --db FILE        result database (created if missing)\n"
          "  -j, --jobs N     simulations in parallel (default 1); real runs always run alone\n"
          "  --dry-run        list the combinations and whether each is done; run nothing\n"
          "  --quiet          no progress output\n"
          "  -h, --help       this help\n");
}

static void known_keys(char *buf, size_t len) {
  size_t n = 0;
  buf[0] = '\0';
  for (int i = 0; i < RUN_OPT_COUNT && n < len; i++)
    if (is_key((enum run_opt)i)) n += (size_t)snprintf(buf + n, len - n, "%s%s", n ? ", " : "", run_option((enum run_opt)i)->field);
}

/* The option a spec key names, or RUN_OPT_COUNT. */
static enum run_opt find_key(const char *name) {
  const enum run_opt id = run_option_by_field(name);
  return id != RUN_OPT_COUNT && is_key(id) ? id : RUN_OPT_COUNT;
}

/* "unknown parameter 'x'": with the nearest keys when there are some, else every key. */
static void unknown_key(const char *spec, const char *name) {
  const char *keys[RUN_OPT_COUNT], *near[3];
  size_t n = 0;
  for (int i = 0; i < RUN_OPT_COUNT; i++)
    if (is_key((enum run_opt)i)) keys[n++] = run_option((enum run_opt)i)->field;
  const size_t k = ferry__nearest_names(name, keys, n, 1, near, 3);
  char list[2048];
  if (k) {
    fprintf(stderr, "ferry: %s: unknown parameter '%s'; did you mean %s?\n", spec, name,
            ferry__join_names(near, k, "", list, sizeof list));
    return;
  }
  known_keys(list, sizeof list);
  fprintf(stderr, "ferry: %s: unknown parameter '%s' (known: %s)\n", spec, name, list);
}

/* A value as option text, whole whatever its length (owned); NULL on a type error or out of
 * memory (message printed). */
static char *value_text(const char *spec, const char *key, const cJSON *v, int flag) {
  char *out = NULL;
  if (flag) {
    if (!cJSON_IsBool(v)) {
      fprintf(stderr, "ferry: %s: %s: expected true or false\n", spec, key);
      return NULL;
    }
    out = ferry__strdup(cJSON_IsTrue(v) ? "true" : "false");
  } else if (cJSON_IsString(v)) {
    if (!*v->valuestring) {
      fprintf(stderr, "ferry: %s: %s: empty string\n", spec, key);
      return NULL;
    }
    out = ferry__strdup(v->valuestring);
  } else if (cJSON_IsNumber(v)) {
    double d = v->valuedouble;
    if (d == floor(d) && fabs(d) < 9e15) out = ferry__asprintf("%lld", (long long)d);
    else out = ferry__asprintf("%.17g", d);
  } else {
    fprintf(stderr, "ferry: %s: %s: expected a string or a number in the list\n", spec, key);
    return NULL;
  }
  if (!out) fprintf(stderr, "ferry: out of memory building the sweep\n");
  return out;
}

static void combo_free(struct combo *c) {
  if (c->argv)
    for (int i = 0; i < c->argc; i++) ferry_free(c->argv[i]);
  ferry_free(c->argv);
  ferry_free(c->desc);
  ferry_free(c->config_json);
  ferry_free(c->model);
  ferry_free(c->hw);
  ferry_free(c->trace);
  ferry_free(c->error);
  if (c->log_fd > 0) close(c->log_fd);
}

static int push_arg(struct combo *c, const char *s) {
  char **a = ferry__reallocarray(c->argv, (size_t)c->argc + 2, sizeof *a);
  if (!a) return -1;
  c->argv = a;
  if (!(a[c->argc] = ferry__strdup(s))) return -1;
  a[++c->argc] = NULL;
  return 0;
}

/* The value of one key in this combination (the idx-th of its list, or the value itself). */
static const cJSON *chosen(const cJSON *it, size_t idx) { return cJSON_IsArray(it) ? cJSON_GetArrayItem(it, (int)idx) : it; }

/* The combination's executor (default host), from the registry. */
static int combo_executor(const struct sweep *sw, const cJSON *spec, const size_t *idx,
                          const struct ferry_exec_info **out) {
  *out = ferry_exec_registry_find("host");
  size_t k = 0;
  const cJSON *it;
  cJSON_ArrayForEach(it, spec) {
    if (!strcmp(it->string, "executor")) {
      char *val = value_text(sw->spec_path, "executor", chosen(it, idx[k]), 0);
      if (!val) return CLI_USAGE;
      *out = ferry_exec_registry_find(val);
      if (!*out) {
        ferry_exec *none = NULL;
        ferry_exec_open(val, NULL, &none); /* fails, naming the executors nearest the value */
        fprintf(stderr, "ferry: %s: executor: %s\n", sw->spec_path, ferry_last_error());
      }
      ferry_free(val);
      if (!*out) return CLI_USAGE;
    }
    k++;
  }
  return 0;
}

/* The child's argv: `ferry sim` for an executor of a hardware profile, else `ferry run
 * --backend X`; every key that applies to that command as its option; and a description
 * naming the swept values (for progress lines: it may be cut short). */
static int combo_argv(const struct sweep *sw, const cJSON *spec, const size_t *idx, int sim, struct combo *c) {
  char desc[2048] = "";
  size_t dn = 0, k = 0;
  if (push_arg(c, "ferry") || push_arg(c, sim ? "sim" : "run")) return -1;
  if (!sim && (push_arg(c, "--backend") || push_arg(c, c->kind))) return -1;
  const cJSON *it;
  cJSON_ArrayForEach(it, spec) {
    const enum run_opt key = find_key(it->string);
    const struct run_option_info *row = run_option(key);
    const cJSON *v = chosen(it, idx[k++]);
    char *val = value_text(sw->spec_path, it->string, v, is_flag(key));
    if (!val) return CLI_USAGE;
    /* an option of the other command (hw for a host run, threads for a simulation) does not
     * apply to this combination */
    if (key != RUN_OPT_executor && !(row->modes & (sim ? SIM_M : RUN_M))) {
      ferry_free(val);
      continue;
    }
    if (cJSON_IsArray(it) && cJSON_GetArraySize(it) > 1 && dn < sizeof desc)
      dn += (size_t)snprintf(desc + dn, sizeof desc - dn, "%s%s=%s", dn ? " " : "", row->field, val);
    if (dn >= sizeof desc) dn = sizeof desc - 1;
    int pushed = 1;
    if (key != RUN_OPT_executor) {
      char opt[64];
      snprintf(opt, sizeof opt, "--%s", row->name);
      pushed = is_flag(key) ? !cJSON_IsTrue(v) || !push_arg(c, opt) : !push_arg(c, opt) && !push_arg(c, val);
    }
    ferry_free(val);
    if (!pushed) return -1;
  }
  if (push_arg(c, "--db") || push_arg(c, sw->db_path) || push_arg(c, "--quiet")) return -1;
  return (c->desc = ferry__strdup(dn ? desc : "(single configuration)")) ? 0 : -1;
}

/* Parse the argv with the child's own parser and compute its configuration hash, as the child
 * will (the KV capacity filled from the trace first). */
static int combo_hash(const struct sweep *sw, struct combo *c) {
  /* parse a copy: the parser may reorder nothing, but the argv stays the child's */
  char **copy = ferry__calloc((size_t)c->argc + 1, sizeof *copy);
  if (!copy) return -1;
  memcpy(copy, c->argv, (size_t)c->argc * sizeof *copy);
  struct run_args a;
  int rc = run_parse(c->argc - 1, copy + 1, c->argv[1], &a);
  if (rc != 0) {
    ferry_free(copy);
    fprintf(stderr, "ferry: %s: invalid combination: %s\n", sw->spec_path, c->desc);
    return rc < 0 ? CLI_USAGE : rc;
  }
  if (a.ec.max_seq_tokens <= 0) {
    struct ferry_engine_request *reqs = NULL;
    int64_t nreq = 0;
    ferry_status st = run_load_requests(&a, &reqs, &nreq);
    ferry_free(reqs);
    if (st != FERRY_OK) {
      ferry_free(copy);
      fprintf(stderr, "ferry: %s: %s: %s\n", sw->spec_path, c->desc, ferry_last_error());
      return CLI_FAIL;
    }
  }
  c->config_json = run_config_json(&a);
  c->model = a.model ? ferry__strdup(a.model) : NULL;
  c->hw = a.hw ? ferry__strdup(a.hw) : NULL;
  c->trace = (a.trace || a.synthetic) ? ferry__strdup(a.trace ? a.trace : a.synthetic) : NULL;
  ferry_free(copy);
  if (!c->config_json) return -1;
  run_config_hash(c->config_json, c->hash);
  return 0;
}

/* One combination: its executor, its argv, its configuration hash. */
static int build_combo(struct sweep *sw, const cJSON *spec, const size_t *idx, struct combo *c) {
  memset(c, 0, sizeof *c);
  c->log_fd = -1;
  const struct ferry_exec_info *executor;
  int rc = combo_executor(sw, spec, idx, &executor);
  if (rc) return rc;
  /* real executors are measured alone */
  c->real = !(executor->caps & FERRY_EXEC_CAP_VIRTUAL);
  c->kind = executor->name;
  if ((rc = combo_argv(sw, spec, idx, (executor->caps & FERRY_EXEC_CAP_HW) != 0, c)) == 0) rc = combo_hash(sw, c);
  if (rc < 0) {
    fprintf(stderr, "ferry: out of memory building the sweep\n");
    return CLI_FAIL;
  }
  return rc;
}

static int expand(struct sweep *sw, const cJSON *spec) {
  size_t nkeys = (size_t)cJSON_GetArraySize(spec);
  size_t *count = ferry__calloc(nkeys ? nkeys : 1, sizeof *count), *idx = ferry__calloc(nkeys ? nkeys : 1, sizeof *idx);
  int rc = 0;
  if (!count || !idx) {
    rc = cli_fail(FERRY_ERR_NOMEM, "out of memory");
    goto out;
  }
  size_t total = 1, k = 0;
  const cJSON *it;
  cJSON_ArrayForEach(it, spec) {
    if (find_key(it->string) == RUN_OPT_COUNT) {
      unknown_key(sw->spec_path, it->string);
      rc = CLI_USAGE;
      goto out;
    }
    if (cJSON_IsArray(it)) {
      count[k] = (size_t)cJSON_GetArraySize(it);
      if (count[k] == 0) {
        fprintf(stderr, "ferry: %s: %s: empty list of values\n", sw->spec_path, it->string);
        rc = CLI_USAGE;
        goto out;
      }
    } else if (cJSON_IsString(it) || cJSON_IsNumber(it) || cJSON_IsBool(it)) {
      count[k] = 1;
    } else {
      fprintf(stderr, "ferry: %s: %s: expected a list of values\n", sw->spec_path, it->string);
      rc = CLI_USAGE;
      goto out;
    }
    if (total > 100000 / count[k]) {
      fprintf(stderr, "ferry: %s: more than 100000 combinations\n", sw->spec_path);
      rc = CLI_USAGE;
      goto out;
    }
    total *= count[k];
    k++;
  }
  sw->c = ferry__calloc(total, sizeof *sw->c);
  if (!sw->c) {
    rc = cli_fail(FERRY_ERR_NOMEM, "out of memory");
    goto out;
  }
  for (size_t n = 0; n < total; n++) {
    struct combo *c = &sw->c[sw->n];
    if ((rc = build_combo(sw, spec, idx, c)) != 0) {
      combo_free(c);
      goto out;
    }
    /* host combinations that differed only by hw are the same run */
    int dup = 0;
    for (size_t i = 0; i < sw->n && !dup; i++) dup = !strcmp(sw->c[i].hash, c->hash);
    if (dup) combo_free(c);
    else sw->n++;
    /* odometer: the last key varies fastest */
    for (size_t d = nkeys; d-- > 0;) {
      if (++idx[d] < count[d]) break;
      idx[d] = 0;
    }
  }
out:
  ferry_free(count);
  ferry_free(idx);
  return rc;
}

static void fmt_dur(int64_t ns, char *buf, size_t len) {
  int64_t s = ns / 1000000000;
  if (s >= 3600) snprintf(buf, len, "%lld:%02lld:%02lld", (long long)(s / 3600), (long long)(s / 60 % 60), (long long)(s % 60));
  else snprintf(buf, len, "%lld:%02lld", (long long)(s / 60), (long long)(s % 60));
}

static void progress(struct sweep *sw, int final) {
  if (sw->quiet || !sw->tty) return;
  size_t done = sw->skipped + sw->finished + sw->elsewhere;
  int64_t el = ferry__mono_ns() - sw->t0;
  char e[32], eta[32] = "--:--";
  fmt_dur(el, e, sizeof e);
  size_t remaining = sw->n - done;
  if (sw->finished > 0 && remaining > 0) fmt_dur((int64_t)((double)el / (double)sw->finished * (double)remaining), eta, sizeof eta);
  else if (remaining == 0) snprintf(eta, sizeof eta, "0:00");
  const int width = 24;
  int fill = sw->n ? (int)((double)done / (double)sw->n * width) : width;
  char bar[32];
  for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
  bar[width] = '\0';
  const char *cur = "";
  int running = 0;
  for (size_t i = 0; i < sw->n; i++)
    if (sw->c[i].state == RUNNING) {
      if (!running) cur = sw->c[i].desc;
      running++;
    }
  fprintf(stderr, "\r\033[K[%s] %zu/%zu", bar, done, sw->n);
  if (sw->failed) fprintf(stderr, " (%zu failed)", sw->failed);
  fprintf(stderr, "  %s elapsed, ETA %s", e, eta);
  if (running) fprintf(stderr, "  running: %.60s%s", cur, running > 1 ? " +more" : "");
  if (final) fputc('\n', stderr);
  fflush(stderr);
}

static int launch(struct sweep *sw, struct combo *c) {
  char path[] = "/tmp/ferry-sweep-XXXXXX";
  const char *tmpdir = getenv("TMPDIR");
  char *tmpl = ferry__asprintf("%s/ferry-sweep-XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
  int fd = tmpl ? mkstemp(tmpl) : -1;
  if (fd < 0 && tmpl) {
    ferry_free(tmpl);
    tmpl = NULL;
    fd = mkstemp(path);
    if (fd >= 0) unlink(path);
  } else if (tmpl) {
    unlink(tmpl);
  }
  ferry_free(tmpl);
  if (fd < 0) return cli_fail(FERRY_ERR_IO, "sweep: cannot create a log file: %s", strerror(errno));
  fflush(NULL);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    close(fd);
    return cli_fail(FERRY_ERR_IO, "sweep: fork: %s", strerror(errno));
  }
  if (pid == 0) {
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    /* die with the sweep, even when it is killed outright (SIGKILL), so a resumed sweep never
     * runs beside orphans of the last one; the parent may have died before prctl */
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent) _exit(127);
    /* the database keeps one complete run per combination (runs.sweep_key) */
    if (setenv("FERRY_SWEEP_KEY", c->hash, 1) != 0) _exit(127);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(fd, 1);
    dup2(fd, 2);
    execv("/proc/self/exe", c->argv);
    dprintf(2, "ferry: sweep: cannot run /proc/self/exe: %s\n", strerror(errno));
    _exit(127);
  }
  c->pid = pid;
  c->log_fd = fd;
  c->state = RUNNING;
  c->start_ns = ferry__mono_ns();
  if (!sw->quiet && !sw->tty)
    fprintf(stderr, "ferry sweep: [%zu/%zu] start %s %s\n", sw->skipped + sw->finished + 1, sw->n - sw->elsewhere,
            c->kind, c->desc);
  return 0;
}

/* The child's error: its last "ferry..." line, else its last line. */
static char *child_error(int fd, int status) {
  char buf[4096];
  struct stat sb;
  size_t got = 0;
  if (fd >= 0 && fstat(fd, &sb) == 0 && sb.st_size > 0) {
    off_t off = sb.st_size > (off_t)sizeof buf - 1 ? sb.st_size - (off_t)sizeof buf + 1 : 0;
    ssize_t r = pread(fd, buf, sizeof buf - 1, off);
    got = r > 0 ? (size_t)r : 0;
  }
  buf[got] = '\0';
  char *best = NULL, *last = NULL;
  for (char *line = buf; line && *line;) {
    char *nl = strchr(line, '\n');
    if (nl) *nl = '\0';
    if (*line && strncmp(line, "Try 'ferry", 10)) {
      last = line;
      if (!strncmp(line, "ferry", 5)) best = line;
    }
    line = nl ? nl + 1 : NULL;
  }
  char how[64];
  if (WIFSIGNALED(status)) snprintf(how, sizeof how, "killed by signal %d", WTERMSIG(status));
  else snprintf(how, sizeof how, "exit status %d", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  const char *msg = best ? best : last;
  return msg ? ferry__asprintf("%s (%s)", msg, how) : ferry__strdup(how);
}

/* Make sure a failed combination has a run row that says why. */
static void record_failure(struct sweep *sw, struct combo *c) {
  struct ferry_run_summary *runs = NULL;
  size_t n = 0;
  int64_t found = -1;
  int finished = 0;
  if (ferry_db_list_runs(sw->db, &runs, &n) == FERRY_OK) {
    for (size_t i = 0; i < n; i++)
      if (runs[i].id > sw->max_id_before && runs[i].config_hash && !strcmp(runs[i].config_hash, c->hash)) {
        found = runs[i].id;
        finished = runs[i].finished_at != NULL;
      }
  }
  ferry_db_runs_free(runs, n);
  const char *err = c->error ? c->error : "failed";
  if (found >= 0) {
    if (!finished) ferry_db_run_finish(sw->db, found, err);
    return;
  }
  struct ferry_run_info info = {.executor = c->kind, .model = c->model, .hardware = c->hw ? c->hw : c->kind,
                                .trace = c->trace, .config_json = c->config_json, .config_hash = c->hash,
                                .notes = "recorded by ferry sweep: the run failed before it wrote its own row"};
  int64_t id;
  if (ferry_db_run_begin(sw->db, &info, &id) == FERRY_OK) ferry_db_run_finish(sw->db, id, err);
}

static void reap(struct sweep *sw, pid_t pid, int status) {
  for (size_t i = 0; i < sw->n; i++) {
    struct combo *c = &sw->c[i];
    if (c->state != RUNNING || c->pid != pid) continue;
    double secs = (double)(ferry__mono_ns() - c->start_ns) / 1e9;
    sw->finished++;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      c->state = DONE;
      sw->ran++;
      if (!sw->quiet && !sw->tty)
        fprintf(stderr, "ferry sweep: [%zu/%zu] done %s %s in %.1f s\n", sw->skipped + sw->finished, sw->n - sw->elsewhere,
                c->kind, c->desc, secs);
    } else {
      c->state = FAILED;
      sw->failed++;
      c->error = child_error(c->log_fd, status);
      if (!interrupted) record_failure(sw, c);
      if (!sw->quiet) {
        if (sw->tty) fputs("\r\033[K", stderr);
        fprintf(stderr, "ferry sweep: [%zu/%zu] FAILED %s %s: %s\n", sw->skipped + sw->finished, sw->n - sw->elsewhere,
                c->kind, c->desc, c->error ? c->error : "");
      }
    }
    close(c->log_fd);
    c->log_fd = -1;
    return;
  }
}

static int run_all(struct sweep *sw) {
  size_t running = 0;
  int64_t last_draw = 0;
  for (;;) {
    /* launch: simulations in parallel first, then real runs one at a time with nothing else */
    int real_running = 0;
    for (size_t i = 0; i < sw->n; i++) real_running |= sw->c[i].state == RUNNING && sw->c[i].real;
    while (!interrupted && !real_running && running < (size_t)sw->jobs) {
      struct combo *next = NULL;
      for (size_t i = 0; i < sw->n && !next; i++)
        if (sw->c[i].state == PENDING && !sw->c[i].real) next = &sw->c[i];
      if (!next && running == 0)
        for (size_t i = 0; i < sw->n && !next; i++)
          if (sw->c[i].state == PENDING) next = &sw->c[i];
      if (!next) break;
      if (launch(sw, next) != 0) return CLI_FAIL;
      running++;
      real_running = next->real;
    }
    if (running == 0) break;
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      reap(sw, pid, status);
      running--;
      progress(sw, 0);
      continue;
    }
    if (pid < 0 && errno != EINTR && errno != ECHILD) return cli_fail(FERRY_ERR_INTERNAL, "sweep: waitpid: %s", strerror(errno));
    if (interrupted) {
      for (size_t i = 0; i < sw->n; i++)
        if (sw->c[i].state == RUNNING) kill(sw->c[i].pid, SIGTERM);
      while (running > 0 && (pid = waitpid(-1, &status, 0)) > 0) {
        reap(sw, pid, status);
        running--;
      }
      break;
    }
    int64_t now = ferry__mono_ns();
    if (now - last_draw > 250000000) {
      progress(sw, 0);
      last_draw = now;
    }
    struct timespec ts = {0, 50000000};
    nanosleep(&ts, NULL);
  }
  return 0;
}

/* ---- MPI ---------------------------------------------------------------------------------- */

/* A fresh database path of this rank in its temporary folder. */
static int rank_database(const struct cli_mpi *mpi, char *path, size_t len) {
  const char *tmp = getenv("TMPDIR");
  snprintf(path, len, "%s/ferry-sweep-rank%d-XXXXXX", tmp && *tmp ? tmp : "/tmp", mpi->rank);
  int fd = mkstemp(path);
  if (fd < 0) {
    int e = errno;
    path[0] = '\0';
    return cli_fail(FERRY_ERR_IO, "sweep: rank %d: cannot create a database file: %s", mpi->rank, strerror(e));
  }
  close(fd);
  unlink(path); /* ferry_db_open creates it as a database */
  return CLI_OK;
}

static void remove_database(const char *path) {
  char side[4200];
  unlink(path);
  snprintf(side, sizeof side, "%s-wal", path);
  unlink(side);
  snprintf(side, sizeof side, "%s-shm", path);
  unlink(side);
}

/* Rank 0 (or a sweep without MPI): open the study, mark the combinations it holds complete. */
static int read_study(struct sweep *sw, const char *study, unsigned char *complete) {
  ferry_status st = ferry_db_open(&sw->db, study, FERRY_DB_CREATE);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  struct ferry_run_summary *runs = NULL;
  size_t nruns = 0;
  if ((st = ferry_db_list_runs(sw->db, &runs, &nruns)) != FERRY_OK) return cli_fail(st, NULL);
  for (size_t i = 0; i < nruns; i++)
    if (runs[i].id > sw->max_id_before) sw->max_id_before = runs[i].id;
  ferry_db_runs_free(runs, nruns);
  for (size_t i = 0; i < sw->n; i++) {
    int64_t id;
    complete[i] = ferry_db_find_complete_run(sw->db, sw->c[i].hash, &id) == FERRY_OK;
  }
  return CLI_OK;
}

/* Each rank its share of what is to run: simulations in turn, real runs all on rank 0 (one
 * machine measures them one at a time; ranks on other machines would measure those). */
static void share_out(struct sweep *sw, const struct cli_mpi *mpi) {
  size_t k = 0;
  for (size_t i = 0; i < sw->n; i++) {
    struct combo *c = &sw->c[i];
    if (c->state != PENDING) continue;
    const int owner = c->real ? 0 : (int)(k++ % (size_t)mpi->size);
    if (owner != mpi->rank) {
      c->state = ELSEWHERE;
      sw->elsewhere++;
    }
  }
}

/* After the runs: every rank's database to rank 0, merged into the study; totals summed. */
static int gather_ranks(struct sweep *sw, struct cli_mpi *mpi, const char *rank_db, int64_t totals[4]) {
  int rc = CLI_OK;
  if (mpi->rank > 0) {
    ferry_db_close(sw->db); /* checkpointed: the file holds every run */
    sw->db = NULL;
    rc = cli_mpi_send_file(mpi, rank_db, 0);
  } else {
    for (int r = 1; r < mpi->size; r++) {
      char path[4096];
      const char *tmp = getenv("TMPDIR");
      snprintf(path, sizeof path, "%s/ferry-sweep-from-rank%d-%d.db", tmp && *tmp ? tmp : "/tmp", r, (int)getpid());
      int got = cli_mpi_recv_file(mpi, path, r);
      struct ferry_db_merge_stats ms;
      ferry_status st = got == CLI_OK ? ferry_db_merge(sw->db, path, &ms) : FERRY_ERR_IO;
      if (st == FERRY_OK && !sw->quiet)
        fprintf(stderr, "ferry sweep: merged rank %d's %lld run(s) into %s\n", r, (long long)ms.runs_added,
                sw->db_path);
      if (st != FERRY_OK && got == CLI_OK) cli_fail(st, NULL);
      if (st != FERRY_OK) rc = CLI_FAIL;
      remove_database(path);
    }
  }
  int64_t failed = rc != CLI_OK;
  if (mpi->api->allreduce_sum_i64(totals, 3) || mpi->api->allreduce_max_i64(&totals[3], 1) ||
      mpi->api->allreduce_max_i64(&failed, 1))
    return cli_fail(FERRY_ERR_IO, "sweep: summing the ranks' results failed");
  return failed ? CLI_FAIL : CLI_OK;
}

static int sweep_parse(int argc, char **argv, struct sweep *sw) {
  static const struct option opts[] = {{"spec", required_argument, 0, 's'}, {"db", required_argument, 0, 'd'},
                                       {"jobs", required_argument, 0, 'j'}, {"dry-run", no_argument, 0, 'n'},
                                       {"quiet", no_argument, 0, 'q'},      {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  memset(sw, 0, sizeof *sw);
  sw->jobs = 1;
  int64_t v;
  optind = 1;
  int c;
  while ((c = cli_getopt_long(argc, argv, "hj:", opts, NULL)) != -1) {
    switch (c) {
      case 's': sw->spec_path = optarg; break;
      case 'd': sw->db_path = optarg; break;
      case 'j': if (cli_parse_int("--jobs", optarg, 1, 1024, &v)) return CLI_USAGE; sw->jobs = (int)v; break;
      case 'n': sw->dry_run = 1; break;
      case 'q': sw->quiet = 1; break;
      case 'h': usage(stdout); return -1;
      default: return cli_usage_error("sweep", "invalid option");
    }
  }
  if (optind < argc) return cli_usage_error("sweep", "unexpected argument '%s'", argv[optind]);
  if (!sw->spec_path) return cli_usage_error("sweep", "missing --spec FILE");
  if (!sw->db_path) return cli_usage_error("sweep", "missing --db FILE");
  const struct ferry_path_use paths[] = {{"--db", sw->db_path, FERRY_PATH_OUT | FERRY_PATH_SQLITE},
                                         {"--spec", sw->spec_path, 0}};
  if (cli_check_paths("sweep", paths, 2)) return CLI_USAGE;
  sw->tty = cli_is_tty(stderr);
  return 0;
}

/* Which combinations the study already holds: rank 0 reads it (read_study), every rank learns
 * it; a rank above 0 then opens its own database. */
static int learn_study(struct sweep *sw, struct cli_mpi *mpi, const char *study) {
  unsigned char *states = ferry__calloc(sw->n + 1, 1);
  int64_t study_ok = states != NULL;
  int rc = CLI_FAIL;
  if (mpi->rank == 0 && study_ok) study_ok = read_study(sw, study, states) == CLI_OK;
  if (mpi->size > 1 && (mpi->api->bcast(&study_ok, sizeof study_ok, 0) || (study_ok && mpi->api->bcast(states, sw->n, 0)))) {
    cli_fail(FERRY_ERR_IO, "sweep: broadcasting the combinations failed");
    goto out;
  }
  if (!study_ok) goto out;
  for (size_t i = 0; i < sw->n; i++)
    if (states[i]) {
      sw->c[i].state = SKIPPED;
      sw->skipped++;
    }
  ferry_status st;
  if (mpi->rank > 0 && (st = ferry_db_open(&sw->db, sw->db_path, FERRY_DB_CREATE)) != FERRY_OK) {
    cli_fail(st, NULL);
    goto out;
  }
  if (mpi->size > 1) share_out(sw, mpi);
  rc = CLI_OK;
out:
  ferry_free(states);
  return rc;
}

static void print_dry_run(const struct sweep *sw) {
  for (size_t i = 0; i < sw->n; i++) {
    printf("%s  %-4s  %-8s  ", sw->c[i].hash, sw->c[i].kind, sw->c[i].state == SKIPPED ? "complete" : "to run");
    for (int a = 1; a < sw->c[i].argc; a++) printf("%s%s", a > 1 ? " " : "", sw->c[i].argv[a]);
    printf("\n");
  }
  printf("ferry sweep: %zu combinations, %zu complete, %zu to run\n", sw->n, sw->skipped, sw->n - sw->skipped);
}

/* Run this rank's share, interruptible (SIGINT, SIGTERM stop the children; running again
 * resumes). 0, or a CLI exit code. */
static int run_share(struct sweep *sw, struct cli_mpi *mpi, const char *study) {
  if (!sw->quiet) {
    if (mpi->size > 1)
      fprintf(stderr, "ferry sweep: rank %d of %d: %zu combinations, %zu already complete in %s, %zu to run here (-j %d)\n",
              mpi->rank, mpi->size, sw->n, sw->skipped, study, sw->n - sw->skipped - sw->elsewhere, sw->jobs);
    else
      fprintf(stderr, "ferry sweep: %zu combinations, %zu already complete in %s, %zu to run (-j %d)\n", sw->n,
              sw->skipped, sw->db_path, sw->n - sw->skipped, sw->jobs);
  }
  struct sigaction sa, old_int, old_term;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  sw->t0 = ferry__mono_ns();
  progress(sw, 0);
  const int r = run_all(sw);
  progress(sw, 1);
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  if (r != 0) {
    /* the other ranks would wait for this one's database forever */
    if (mpi->size > 1) cli_mpi_abort(mpi, r);
    return CLI_FAIL;
  }
  for (size_t i = 0; i < sw->n; i++)
    if (sw->c[i].state == FAILED)
      fprintf(stderr, "  failed: %s %s: %s\n", sw->c[i].kind, sw->c[i].desc, sw->c[i].error ? sw->c[i].error : "");
  return 0;
}

/* Run, gather the ranks' databases into the study, and say how it went (rank 0). */
static int run_and_report(struct sweep *sw, struct cli_mpi *mpi, const char *rank_db, const char *study) {
  int rc = run_share(sw, mpi, study);
  if (rc) return rc;
  int64_t totals[4] = {(int64_t)sw->ran, (int64_t)sw->failed, (int64_t)sw->finished, interrupted};
  if (mpi->size > 1 && (rc = gather_ranks(sw, mpi, rank_db, totals)) != CLI_OK) return rc;
  if (mpi->rank == 0) {
    char el[32], not_run_text[64] = "";
    fmt_dur(ferry__mono_ns() - sw->t0, el, sizeof el);
    const size_t not_run = sw->n - sw->skipped - (size_t)totals[2];
    if (not_run) snprintf(not_run_text, sizeof not_run_text, ", %zu not run (interrupted)", not_run);
    fprintf(stderr, "ferry sweep: %zu combinations: %zu already complete, %lld ran, %lld failed%s in %s%s; database %s\n",
            sw->n, sw->skipped, (long long)totals[0], (long long)totals[1], not_run_text, el,
            mpi->size > 1 ? " over the ranks" : "", study);
  }
  if (totals[3]) {
    if (mpi->rank == 0) fprintf(stderr, "ferry sweep: interrupted; run the same command again to resume\n");
    return 128 + (int)totals[3];
  }
  return totals[1] ? CLI_FAIL : CLI_OK;
}

int cmd_sweep(int argc, char **argv) {
  struct sweep sw;
  int rc = sweep_parse(argc, argv, &sw);
  if (rc) return rc < 0 ? CLI_OK : rc;
  cJSON *spec = NULL;
  struct ferry_err err;
  struct cli_mpi mpi = {.size = 1};
  char rank_db[4096] = "";
  const char *study = sw.db_path;
  ferry_status st = ferry__json_load(sw.spec_path, 16 << 20, &spec, &err);
  if (st != FERRY_OK) return cli_fail(st, "%s", err.msg);
  if (!cJSON_IsObject(spec) || cJSON_GetArraySize(spec) == 0) {
    cJSON_Delete(spec);
    return cli_fail(FERRY_ERR_FORMAT, "%s: expected a JSON object mapping parameters to lists of values", sw.spec_path);
  }
  /* under mpirun each rank runs its share into its own database; rank 0's is the study */
  if ((rc = cli_mpi_start("sweep", &mpi)) != CLI_OK) {
    cJSON_Delete(spec);
    return rc;
  }
  if (mpi.rank > 0 && (rc = rank_database(&mpi, rank_db, sizeof rank_db)) != CLI_OK) goto out;
  if (mpi.rank > 0) sw.db_path = rank_db;
  if ((rc = expand(&sw, spec)) != 0 || (rc = learn_study(&sw, &mpi, study)) != CLI_OK) goto out;
  if (sw.dry_run) {
    if (mpi.rank == 0) print_dry_run(&sw);
  } else {
    rc = run_and_report(&sw, &mpi, rank_db, study);
  }
out:
  for (size_t i = 0; i < sw.n; i++) combo_free(&sw.c[i]);
  ferry_free(sw.c);
  ferry_db_close(sw.db);
  if (rank_db[0]) remove_database(rank_db);
  cJSON_Delete(spec);
  cli_mpi_stop(&mpi);
  return rc;
}
