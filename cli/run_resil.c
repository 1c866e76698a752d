/* The command-line side of staying up: options, fault rules and retry policy, the control
 * socket and SIGHUP reloads (a thread that verifies a folder and stages it: the engine swaps it
 * at a step boundary), timed reloads, and the engine_events rows of a run. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/run_resil.h"
#include "common/alloc.h"
#include "common/error.h"
#include "common/units.h"
#include "ferry/fault.h"
#include "ferry/model.h"
#include "ferry/store.h"

/* ---- options -------------------------------------------------------------------------------- */

int resil_parse_schedule(const char *cmd, const char *text, struct resil_opts *o) {
  char buf[2048];
  if (strlen(text) >= sizeof buf) return cli_usage_error(cmd, "--host-budget-schedule: too long");
  snprintf(buf, sizeof buf, "%s", text);
  o->n_schedule = 0;
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *colon = strchr(tok, ':');
    if (!colon) return cli_usage_error(cmd, "--host-budget-schedule: '%s' is not SECONDS:SIZE (e.g. 2.5:64MiB)", tok);
    *colon = '\0';
    if (o->n_schedule == RESIL_MAX_CHANGES)
      return cli_usage_error(cmd, "--host-budget-schedule: at most %d changes", RESIL_MAX_CHANGES);
    struct ferry_budget_change *c = &o->schedule[o->n_schedule];
    if (ferry__parse_seconds_ns(tok, &c->at_ns) != FERRY_OK)
      return cli_usage_error(cmd, "--host-budget-schedule: time '%s': %s", tok, ferry_last_error());
    if (cli_parse_size("--host-budget-schedule", colon + 1, &c->bytes)) return CLI_USAGE;
    c->tier = FERRY_TIER_HOST;
    o->n_schedule++;
  }
  if (!o->n_schedule) return cli_usage_error(cmd, "--host-budget-schedule: no change given");
  o->host_schedule = text;
  return 0;
}

int resil_parse_reload_at(const char *cmd, const char *text, struct resil_opts *o) {
  char buf[8192];
  if (strlen(text) >= sizeof buf) return cli_usage_error(cmd, "--reload-at: too long");
  snprintf(buf, sizeof buf, "%s", text);
  o->n_reload_at = 0;
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *colon = strchr(tok, ':');
    if (!colon || !colon[1]) return cli_usage_error(cmd, "--reload-at: '%s' is not SECONDS:DIR", tok);
    *colon = '\0';
    if (o->n_reload_at == RESIL_MAX_RELOADS) return cli_usage_error(cmd, "--reload-at: at most %d reloads", RESIL_MAX_RELOADS);
    if (ferry__parse_seconds_ns(tok, &o->reload_at[o->n_reload_at].at_ns) != FERRY_OK)
      return cli_usage_error(cmd, "--reload-at: time '%s': %s", tok, ferry_last_error());
    if (strlen(colon + 1) >= sizeof o->reload_at[0].dir) return cli_usage_error(cmd, "--reload-at: folder name too long");
    snprintf(o->reload_at[o->n_reload_at].dir, sizeof o->reload_at[0].dir, "%s", colon + 1);
    o->reload_at[o->n_reload_at].done = 0;
    o->n_reload_at++;
  }
  if (!o->n_reload_at) return cli_usage_error(cmd, "--reload-at: no reload given");
  o->reload_at_text = text;
  return 0;
}

int resil_parse_marks(const char *cmd, const char *text, struct resil_opts *o) {
  char buf[64];
  snprintf(buf, sizeof buf, "%s", text);
  char *colon = strchr(buf, ':');
  if (!colon) return cli_usage_error(cmd, "--pressure-marks: expected HIGH:LOW, e.g. 0.85:0.7");
  *colon = '\0';
  if (cli_parse_double("--pressure-marks (high)", buf, 0.01, 1.0, &o->high_water) ||
      cli_parse_double("--pressure-marks (low)", colon + 1, 0.01, 1.0, &o->low_water))
    return CLI_USAGE;
  if (!(o->low_water < o->high_water))
    return cli_usage_error(cmd, "--pressure-marks: the low-water mark %g must be below the high-water mark %g",
                           o->low_water, o->high_water);
  return 0;
}

ferry_status resil_prepare(struct resil_opts *o, struct ferry_engine_config *ec) {
  ferry_status st = o->faults ? ferry_fault_set(o->faults) : ferry_fault_from_env();
  if (st != FERRY_OK) return ferry__fail(st, "%s%s", o->faults ? "--faults: " : "", ferry_last_error());
  ferry_io_stats_reset();
  if (o->io_retries >= 0) {
    struct ferry_io_policy p;
    ferry_io_get_policy(&p);
    p.max_attempts = (int32_t)o->io_retries + 1;
    ferry_io_set_policy(&p);
  }
  if (o->pressure || o->n_schedule) {
    ec->pressure.enabled = 1;
    ec->pressure.high_water = o->high_water;
    ec->pressure.low_water = o->low_water;
    ec->pressure.watch_os = o->pressure_os;
  }
  ec->budget_schedule = o->n_schedule ? o->schedule : NULL;
  ec->n_budget_changes = o->n_schedule;
  return FERRY_OK;
}

/* ---- events --------------------------------------------------------------------------------- */

static void add_event(struct run_resil *r, const char *kind, const char *action, const char *fmt, ...)
    FERRY_PRINTF(4, 5);
static void add_event(struct run_resil *r, const char *kind, const char *action, const char *fmt, ...) {
  pthread_mutex_lock(&r->mu);
  int64_t t = r->ex ? ferry_exec_now(r->ex) : 0;
  if (r->n_ev == r->cap_ev) {
    size_t cap = r->cap_ev ? r->cap_ev * 2 : 64;
    /* a storm of retries is summarised by the counters; the rows stop at a bound */
    struct resil_event *grown = cap <= 8192 ? ferry__reallocarray(r->ev, cap, sizeof *grown) : NULL;
    if (!grown) {
      r->dropped++;
      pthread_mutex_unlock(&r->mu);
      return;
    }
    r->ev = grown;
    r->cap_ev = cap;
  }
  struct resil_event *e = &r->ev[r->n_ev++];
  e->t_ns = t;
  snprintf(e->kind, sizeof e->kind, "%s", kind);
  snprintf(e->action, sizeof e->action, "%s", action);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->detail, sizeof e->detail, fmt, ap);
  va_end(ap);
  pthread_mutex_unlock(&r->mu);
}

static void on_io(void *user, const struct ferry_io_event *ev) {
  struct run_resil *r = user;
  add_event(r, "io", ev->permanent ? "read failed" : "read retried", "%s: %llu bytes at offset %llu: %s on attempt %d%s",
            ev->path, (unsigned long long)ev->len, (unsigned long long)ev->offset, ev->what, ev->attempt,
            ev->permanent ? " (no attempt left)" : "");
}

void resil_init(struct run_resil *r, const struct resil_opts *o) {
  memset(r, 0, sizeof *r);
  r->o = o;
  r->listen_fd = -1;
  r->run_id = -1;
  r->stop_pipe[0] = r->stop_pipe[1] = -1;
  pthread_mutex_init(&r->mu, NULL);
  /* from the start: the store's own reads (headers, the NaN scan) retry too; before the
   * executor exists their events are at time 0 */
  ferry_io_set_observer(on_io, r);
  r->observing = 1;
}

void resil_attach(struct run_resil *r, ferry_exec *ex) {
  pthread_mutex_lock(&r->mu);
  r->ex = ex;
  pthread_mutex_unlock(&r->mu);
}

void resil_note_failure(struct run_resil *r, ferry_status st, const char *msg) {
  if (st == FERRY_ERR_DEVICE) add_event(r, "device", "device failed", "%s", msg);
}

/* ---- reloads -------------------------------------------------------------------------------- */

/* Verify a folder (manifest, architecture, strict safetensors) and stage it; the engine checks
 * the rest (shapes, plan, finite values) and swaps it at a step boundary. */
static ferry_status do_reload(struct run_resil *r, const char *dir, const char *via, char *reply, size_t len) {
  size_t files = 0;
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  ferry_status st = ferry_manifest_verify(dir, &files);
  if (st == FERRY_OK && (st = ferry_model_open(&m, dir)) == FERRY_OK) st = ferry_model_same_architecture(r->model, m);
  ferry_model_close(m);
  if (st == FERRY_OK) st = ferry_store_open(&s, dir);
  if (st != FERRY_OK) {
    char why[FERRY_ERRMSG_MAX];
    snprintf(why, sizeof why, "%s", ferry_last_error());
    add_event(r, "reload", "reload refused", "%s (%s): %s; the weights serving keep serving", dir, via, why);
    snprintf(reply, len, "refused: %s", why);
    return st;
  }
  st = ferry_engine_reload(r->eng, s, dir); /* refusals are engine events */
  if (st != FERRY_OK) {
    snprintf(reply, len, "refused: %s", ferry_last_error());
    ferry_store_close(s);
    return st;
  }
  snprintf(reply, len, "ok: %s staged (%zu file(s) verified against %s); swapped in once the running requests finish",
           dir, files, FERRY_MANIFEST_NAME);
  return FERRY_OK;
}

void resil_attach_db(struct run_resil *r, ferry_db *db, int64_t run_id) {
  r->db = db;
  r->run_id = run_id;
  r->flushed_ns = ferry__mono_ns();
}

/* Write the command's events gathered so far and forget them (the array keeps its room). */
static ferry_status flush_events(struct run_resil *r) {
  ferry_status st = FERRY_OK;
  pthread_mutex_lock(&r->mu);
  for (size_t i = 0; i < r->n_ev && st == FERRY_OK; i++) {
    struct ferry_event_row row = {.t_ns = r->ev[i].t_ns, .kind = r->ev[i].kind, .pressure_index = NAN, .level = -1,
                                  .action = r->ev[i].action, .detail = r->ev[i].detail};
    st = ferry_db_add_event(r->db, r->run_id, &row);
  }
  r->n_ev = 0;
  pthread_mutex_unlock(&r->mu);
  return st;
}

void resil_tick(void *user, ferry_engine *eng, int64_t now_ns) {
  struct run_resil *r = user;
  (void)eng;
  if (r->db && r->run_id >= 0 && ferry__mono_ns() - r->flushed_ns > 1000000000LL) {
    if (flush_events(r) != FERRY_OK) fprintf(stderr, "ferry: writing events: %s\n", ferry_last_error());
    r->flushed_ns = ferry__mono_ns();
  }
  struct resil_opts *o = (struct resil_opts *)r->o;
  for (int i = 0; i < o->n_reload_at; i++) {
    if (o->reload_at[i].done || now_ns < o->reload_at[i].at_ns) continue;
    o->reload_at[i].done = 1;
    char reply[FERRY_ERRMSG_MAX + 64];
    do_reload(r, o->reload_at[i].dir, "--reload-at", reply, sizeof reply);
    fprintf(stderr, "ferry: reload at %.3f s: %s\n", (double)now_ns / 1e9, reply);
  }
}

static volatile sig_atomic_t hup_seen;
static void on_hup(int sig) {
  (void)sig;
  hup_seen = 1;
}

/* One command per connection: "reload DIR" or "status"; one line back. */
static void serve_client(struct run_resil *r, int fd) {
  char line[4200];
  size_t n = 0;
  while (n + 1 < sizeof line) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 2000) <= 0) break;
    ssize_t got = read(fd, line + n, sizeof line - 1 - n);
    if (got <= 0) break;
    n += (size_t)got;
    if (memchr(line, '\n', n)) break;
  }
  line[n] = '\0';
  line[strcspn(line, "\r\n")] = '\0';
  char reply[FERRY_ERRMSG_MAX + 128];
  if (!strncmp(line, "reload ", 7) && line[7]) {
    do_reload(r, line + 7, "control socket", reply, sizeof reply);
  } else if (!strcmp(line, "status")) {
    snprintf(reply, sizeof reply, "ok: weights version %d, memory-pressure level %d", ferry_engine_weights_version(r->eng),
             ferry_engine_pressure_level(r->eng));
  } else {
    snprintf(reply, sizeof reply, "error: unknown command '%.200s' (reload DIR, status)", line);
  }
  size_t len = strlen(reply);
  reply[len++] = '\n';
  for (size_t off = 0; off < len;) {
    ssize_t w = write(fd, reply + off, len - off);
    if (w <= 0) break;
    off += (size_t)w;
  }
}

static void *control_main(void *arg) {
  struct run_resil *r = arg;
  for (;;) {
    struct pollfd p[2] = {{r->stop_pipe[0], POLLIN, 0}, {r->listen_fd, POLLIN, 0}};
    int n = poll(p, r->listen_fd >= 0 ? 2 : 1, 100);
    if (n > 0 && p[0].revents) break;
    if (hup_seen && r->o->reload_from) {
      hup_seen = 0;
      char reply[FERRY_ERRMSG_MAX + 64];
      do_reload(r, r->o->reload_from, "SIGHUP", reply, sizeof reply);
      fprintf(stderr, "ferry: SIGHUP: %s\n", reply);
    }
    if (n > 0 && r->listen_fd >= 0 && (p[1].revents & POLLIN)) {
      int fd = accept(r->listen_fd, NULL, NULL);
      if (fd >= 0) {
        serve_client(r, fd);
        close(fd);
      }
    }
  }
  return NULL;
}

static ferry_status open_socket(struct run_resil *r, const char *path) {
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  if (strlen(path) >= sizeof addr.sun_path)
    return ferry__fail(FERRY_ERR_INVALID, "--control-socket %s: longer than the %zu bytes a socket path may have", path,
                       sizeof addr.sun_path - 1);
  snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path);
  struct stat sb;
  if (lstat(path, &sb) == 0) {
    if (!S_ISSOCK(sb.st_mode))
      return ferry__fail(FERRY_ERR_EXISTS, "--control-socket %s: exists and is not a socket", path);
    unlink(path); /* a socket left by a run that died */
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ferry__fail(FERRY_ERR_IO, "--control-socket: socket: %s", strerror(errno));
  mode_t old = umask(077); /* only this user may reload the weights */
  int rc = bind(fd, (struct sockaddr *)&addr, sizeof addr);
  umask(old);
  if (rc != 0 || listen(fd, 4) != 0) {
    int e = errno;
    close(fd);
    return ferry__fail(FERRY_ERR_IO, "--control-socket %s: %s", path, strerror(e));
  }
  r->listen_fd = fd;
  return FERRY_OK;
}

ferry_status resil_start(struct run_resil *r, ferry_engine *eng, const ferry_model *model) {
  r->eng = eng;
  r->model = model;
  if (!r->o->control_socket && !r->o->reload_from) return FERRY_OK;
  ferry_status st;
  if (r->o->control_socket && (st = open_socket(r, r->o->control_socket)) != FERRY_OK) return st;
  if (r->o->reload_from) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_hup;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGHUP, &sa, NULL);
  }
  if (pipe(r->stop_pipe) != 0) return ferry__fail(FERRY_ERR_IO, "control thread: pipe: %s", strerror(errno));
  if (pthread_create(&r->thread, NULL, control_main, r) != 0)
    return ferry__fail(FERRY_ERR_INTERNAL, "cannot start the control thread");
  r->thread_started = 1;
  return FERRY_OK;
}

void resil_stop(struct run_resil *r) {
  if (r->thread_started) {
    ssize_t w = write(r->stop_pipe[1], "x", 1);
    (void)w;
    pthread_join(r->thread, NULL);
    r->thread_started = 0;
  }
  for (int i = 0; i < 2; i++)
    if (r->stop_pipe[i] >= 0) close(r->stop_pipe[i]);
  r->stop_pipe[0] = r->stop_pipe[1] = -1;
  if (r->listen_fd >= 0) {
    close(r->listen_fd);
    r->listen_fd = -1;
    unlink(r->o->control_socket);
  }
  if (r->o->reload_from) signal(SIGHUP, SIG_DFL);
}

/* ---- the database ----------------------------------------------------------------------------- */

static const char *kind_name(const struct ferry_engine_event *ev) {
  switch (ev->kind) {
    case FERRY_ENGINE_EVENT_RELOAD: return "reload";
    case FERRY_ENGINE_EVENT_REFUSED: return "refused";
    default: return "pressure";
  }
}

static const char *tier_name(int32_t t) {
  return t == FERRY_TIER_DEVICE ? "device" : t == FERRY_TIER_HOST ? "host" : t == FERRY_TIER_DISK ? "disk" : NULL;
}

ferry_status resil_write(struct run_resil *r, ferry_db *db, int64_t run_id) {
  if (!db || run_id < 0) return FERRY_OK;
  ferry_status st = FERRY_OK;
  int64_t n = 0;
  const struct ferry_engine_event *ev = r->eng ? ferry_engine_events(r->eng, &n) : NULL;
  for (int64_t i = 0; i < n && st == FERRY_OK; i++) {
    struct ferry_event_row row = {.t_ns = ev[i].t_ns, .kind = kind_name(&ev[i]), .tier = tier_name(ev[i].tier),
                                  .pressure_index = ev[i].pressure_index,
                                  .level = ev[i].kind == FERRY_ENGINE_EVENT_PRESSURE ? ev[i].level : -1,
                                  .action = ev[i].action, .detail = ev[i].detail, .budget_bytes = ev[i].budget_bytes};
    st = ferry_db_add_event(db, run_id, &row);
  }
  r->db = db;
  r->run_id = run_id;
  if (st == FERRY_OK) st = flush_events(r);
  pthread_mutex_lock(&r->mu);
  const size_t dropped = r->dropped;
  pthread_mutex_unlock(&r->mu);
  struct ferry_io_stats io;
  ferry_io_stats_get(&io);
  const struct {
    const char *name;
    uint64_t v;
  } meta[] = {{"IO_READS", io.reads},           {"IO_ATTEMPTS", io.attempts},   {"IO_RETRIES", io.retries},
              {"IO_SHORT_READS", io.short_reads}, {"IO_RECOVERED", io.recovered}, {"IO_FAILED", io.failed},
              {"IO_CHECKSUM_MISMATCHES", io.checksum_mismatches}, {"FAULTS_INJECTED", ferry_fault_injected()},
              {"IO_EVENTS_DROPPED", dropped}};
  for (size_t i = 0; i < sizeof meta / sizeof meta[0] && st == FERRY_OK; i++) {
    char num[32];
    snprintf(num, sizeof num, "%llu", (unsigned long long)meta[i].v);
    st = ferry_db_run_meta(db, run_id, meta[i].name, num);
  }
  const char *spec = r->o->faults ? r->o->faults : getenv("FERRY_FAULT");
  if (st == FERRY_OK && spec && *spec) st = ferry_db_run_meta(db, run_id, "FAULT_SPEC", spec);
  return st;
}

void resil_free(struct run_resil *r) {
  resil_stop(r);
  if (r->observing) ferry_io_set_observer(NULL, NULL);
  ferry_fault_clear();
  ferry_free(r->ev);
  r->ev = NULL;
  pthread_mutex_destroy(&r->mu);
}
