/* What keeps a `ferry run` / `ferry sim` up, on the command line: fault injection and the I/O
 * retry policy, memory-pressure control with a budget schedule, hot reloads (timed, over a
 * control socket, on SIGHUP), and the events and counters they leave in the result database. */
#ifndef FERRY_CLI_RUN_RESIL_H
#define FERRY_CLI_RUN_RESIL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/db.h"
#include "ferry/engine.h"

#define RESIL_MAX_CHANGES 32
#define RESIL_MAX_RELOADS 8

/* The options as parsed (part of struct run_args). */
struct resil_opts {
  const char *faults;          /* --faults SPEC (else FERRY_FAULT) */
  int64_t io_retries;          /* --io-retries N; -1: the default policy */
  int verify_reads;            /* --verify-reads */
  int pressure;                /* --pressure (implied by a budget schedule) */
  double high_water, low_water; /* --pressure-marks HIGH:LOW; 0: defaults */
  int pressure_os;             /* --pressure-os */
  const char *host_schedule;   /* --host-budget-schedule T:SIZE,... as given */
  struct ferry_budget_change schedule[RESIL_MAX_CHANGES];
  int32_t n_schedule;
  const char *reload_at_text;  /* --reload-at T:DIR,... as given */
  struct {
    int64_t at_ns;
    char dir[1024];
    int done;
  } reload_at[RESIL_MAX_RELOADS];
  int n_reload_at;
  const char *reload_from;     /* --reload-from DIR: what SIGHUP reloads */
  const char *control_socket;  /* --control-socket PATH */
};

/* Option parsers (0 on success, else a CLI exit code after printing why). */
int resil_parse_schedule(const char *cmd, const char *text, struct resil_opts *o);
int resil_parse_reload_at(const char *cmd, const char *text, struct resil_opts *o);
int resil_parse_marks(const char *cmd, const char *text, struct resil_opts *o);

/* One event the command observed itself (I/O retries, reloads it refused, a device failure). */
struct resil_event {
  int64_t t_ns;
  char kind[12];
  char action[64];
  char detail[512];
};

/* State of a run's resilience machinery. */
struct run_resil {
  const struct resil_opts *o;
  ferry_exec *ex;
  ferry_engine *eng;
  const ferry_model *model;
  pthread_mutex_t mu; /* guards the events below */
  struct resil_event *ev;
  size_t n_ev, cap_ev, dropped;
  pthread_t thread;
  int thread_started;
  int stop_pipe[2];
  int listen_fd;
  int observing;
  ferry_db *db;          /* where events go while serving (resil_attach_db), or NULL */
  int64_t run_id;
  int64_t flushed_ns;    /* wall clock of the last flush */
};

/* Before anything is opened: install the fault rules (--faults or FERRY_FAULT) and the retry
 * policy; fill the engine's pressure configuration and schedule. */
ferry_status resil_prepare(struct resil_opts *o, struct ferry_engine_config *ec);
void resil_init(struct run_resil *r, const struct resil_opts *o);
/* Once the executor exists: later events on its clock (I/O retries are observed from resil_init). */
void resil_attach(struct run_resil *r, ferry_exec *ex);
/* Once the engine exists: the control socket and SIGHUP reloads (a thread), when asked. */
ferry_status resil_start(struct run_resil *r, ferry_engine *eng, const ferry_model *model);
/* Once the run row exists: the command's events are written while serving (every second, from
 * the serving thread), so a long run keeps none of them in memory. */
void resil_attach_db(struct run_resil *r, ferry_db *db, int64_t run_id);
/* ferry_run_options.on_tick: timed reloads, events written. */
void resil_tick(void *user, ferry_engine *eng, int64_t now_ns);
/* The run failed: record a device failure as an event. */
void resil_note_failure(struct run_resil *r, ferry_status st, const char *msg);
/* Stop the control thread (before the engine goes). */
void resil_stop(struct run_resil *r);
/* Write the engine's events, the command's own and the I/O counters into the run. */
ferry_status resil_write(struct run_resil *r, ferry_db *db, int64_t run_id);
/* Remove the observer and the fault rules; free. */
void resil_free(struct run_resil *r);

#endif
