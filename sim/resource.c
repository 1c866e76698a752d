/* Resource models on the event kernel: fluid-shared channels (processor sharing with a
 * latency phase and a FIFO-limited number of slots: PCIe copy engines, disk queue depth),
 * and FIFO compute units. See sim/resource.h for the model. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "sim/resource.h"

enum { JOB_IDLE = 0, JOB_WAITING, JOB_LATENCY, JOB_FLOWING, JOB_RUNNING, JOB_DONE };

/* Rebase the virtual clock (subtracting it from every finish tag) when it grows past this
 * many bytes, so doubles keep sub-byte precision in arbitrarily long runs. */
#define VTIME_REBASE 1e12

int64_t ferry__ceil_ns(double ns) {
  if (!(ns > 0)) return 0;
  if (ns >= 2.3e18) return INT64_MAX / 4;
  double r = nearbyint(ns);
  if (fabs(ns - r) <= 1e-9 * (r > 1 ? r : 1)) return (int64_t)r;
  return (int64_t)ceil(ns);
}

/* ---- fluid channels ------------------------------------------------------------------------ */

struct ferry__fluid {
  struct ferry__des *des;
  char name[32];
  double bytes_per_ns;
  double job_bytes_per_ns; /* the most one job's bytes flow at (a disk's reader); 0 = no limit */
  int64_t latency_ns;
  uint32_t max_active;  /* 0 = unlimited */
  uint32_t active;      /* holding a slot */
  struct ferry__res_job **flows; /* min-heap by (finish_tag, seq) */
  size_t n_flows, cap_flows;
  struct ferry__res_job *wait_head, *wait_tail;
  uint64_t n_waiting;
  double vtime;          /* bytes served to each flowing job, since the last rebase */
  int64_t vtime_at_ns;   /* when vtime was last brought up to date */
  ferry__des_id completion_id;
  uint64_t next_seq;
  ferry_status sticky;   /* a scheduling failure inside an event, reported by the next submit */
  uint64_t jobs_done, bytes_done;
  int64_t busy_ns;
};

static inline int flow_before(const struct ferry__res_job *a, const struct ferry__res_job *b) {
  return a->finish_tag < b->finish_tag || (a->finish_tag == b->finish_tag && a->seq < b->seq);
}

static void flows_push(struct ferry__fluid *f, struct ferry__res_job *j) {
  size_t i = f->n_flows++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!flow_before(j, f->flows[p])) break;
    f->flows[i] = f->flows[p];
    i = p;
  }
  f->flows[i] = j;
}

static struct ferry__res_job *flows_pop(struct ferry__fluid *f) {
  struct ferry__res_job *top = f->flows[0];
  struct ferry__res_job *last = f->flows[--f->n_flows];
  size_t n = f->n_flows, i = 0;
  if (n == 0) return top;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && flow_before(f->flows[c + 1], f->flows[c])) c++;
    if (!flow_before(f->flows[c], last)) break;
    f->flows[i] = f->flows[c];
    i = c;
  }
  f->flows[i] = last;
  return top;
}

/* Whether n flowing jobs each run at the per-job limit rather than at an equal share of the
 * bandwidth. Every job of a channel has the same limit, so all flowing jobs still advance together
 * (one virtual clock); the shared case keeps its own arithmetic, bit for bit. */
static int job_limited(const struct ferry__fluid *f, size_t n_flows) {
  return f->job_bytes_per_ns > 0 && f->job_bytes_per_ns * (double)n_flows < f->bytes_per_ns;
}

/* Bring the virtual clock up to now. */
static void advance(struct ferry__fluid *f) {
  int64_t now = ferry__des_now(f->des);
  if (f->n_flows > 0 && now > f->vtime_at_ns) {
    int64_t dt = now - f->vtime_at_ns;
    f->vtime += job_limited(f, f->n_flows) ? (double)dt * f->job_bytes_per_ns
                                           : (double)dt * f->bytes_per_ns / (double)f->n_flows;
    f->busy_ns += dt;
    if (f->vtime > VTIME_REBASE) {
      /* subtracting the same value from every tag keeps their order */
      for (size_t i = 0; i < f->n_flows; i++) f->flows[i]->finish_tag -= f->vtime;
      f->vtime = 0;
    }
  }
  f->vtime_at_ns = now;
}

static void on_complete(struct ferry__des *des, void *ctx);
static void on_latency_end(struct ferry__des *des, void *ctx);

/* (Re)schedule the single completion event for the earliest finish tag. */
static void reschedule(struct ferry__fluid *f) {
  if (f->completion_id) {
    ferry__des_cancel(f->des, f->completion_id);
    f->completion_id = 0;
  }
  if (f->n_flows == 0) return;
  double left = f->flows[0]->finish_tag - f->vtime;
  int64_t dt = ferry__ceil_ns(job_limited(f, f->n_flows) ? left / f->job_bytes_per_ns
                                                          : left * (double)f->n_flows / f->bytes_per_ns);
  ferry_status st = ferry__des_schedule_in(f->des, dt, on_complete, f, &f->completion_id);
  if (st != FERRY_OK && f->sticky == FERRY_OK) f->sticky = st;
}

static ferry_status admit(struct ferry__fluid *f, struct ferry__res_job *j) {
  ferry_status st = ferry__des_schedule_in(f->des, f->latency_ns + j->extra_latency_ns, on_latency_end, j, NULL);
  if (st != FERRY_OK) return st;
  f->active++;
  j->state = JOB_LATENCY;
  j->start_ns = ferry__des_now(f->des);
  return FERRY_OK;
}

/* Give freed slots to waiting jobs, oldest first. */
static void admit_waiting(struct ferry__fluid *f) {
  while (f->wait_head && (f->max_active == 0 || f->active < f->max_active)) {
    struct ferry__res_job *j = f->wait_head;
    ferry_status st = admit(f, j);
    if (st != FERRY_OK) {
      if (f->sticky == FERRY_OK) f->sticky = st;
      return;
    }
    f->wait_head = j->next;
    if (!f->wait_head) f->wait_tail = NULL;
    f->n_waiting--;
    j->next = NULL;
  }
}

static void finish(struct ferry__fluid *f, struct ferry__res_job *j) {
  j->state = JOB_DONE;
  j->end_ns = ferry__des_now(f->des);
  f->jobs_done++;
  f->bytes_done += j->bytes;
}

/* Call completion callbacks last, after the resource is consistent, because a callback may
 * submit again (to this resource or another). */
static void notify(struct ferry__res_job *list) {
  while (list) {
    struct ferry__res_job *next = list->next;
    list->next = NULL;
    if (list->done) list->done(list, list->ctx);
    list = next;
  }
}

static void on_latency_end(struct ferry__des *des, void *ctx) {
  (void)des;
  struct ferry__res_job *j = ctx;
  struct ferry__fluid *f = j->owner;
  advance(f);
  if (j->bytes == 0) {
    f->active--;
    finish(f, j);
    admit_waiting(f);
    j->next = NULL;
    notify(j);
    return;
  }
  j->state = JOB_FLOWING;
  j->finish_tag = f->vtime + (double)j->bytes;
  flows_push(f, j); /* capacity reserved at submit */
  reschedule(f);
  if (j->flowing) j->flowing(j, j->ctx);
}

static void on_complete(struct ferry__des *des, void *ctx) {
  (void)des;
  struct ferry__fluid *f = ctx;
  f->completion_id = 0;
  advance(f);
  /* The event was scheduled for the top job (rounded up to a whole ns), so it is done even
   * if float noise left vtime a hair short; jobs with the same or an earlier tag finish too,
   * in (tag, submission) order. */
  if (f->n_flows > 0 && f->vtime < f->flows[0]->finish_tag) f->vtime = f->flows[0]->finish_tag;
  struct ferry__res_job *head = NULL, *tail = NULL;
  while (f->n_flows > 0 && f->flows[0]->finish_tag <= f->vtime) {
    struct ferry__res_job *j = flows_pop(f);
    f->active--;
    finish(f, j);
    j->next = NULL;
    if (tail)
      tail->next = j;
    else
      head = j;
    tail = j;
  }
  if (f->n_flows == 0) f->vtime = 0; /* idle: rebase for free */
  admit_waiting(f);
  reschedule(f);
  notify(head);
}

ferry_status ferry__fluid_create(struct ferry__fluid **out, struct ferry__des *des, const char *name,
                                 double bandwidth_bytes_per_s, int64_t latency_ns, uint32_t max_active) {
  *out = NULL;
  if (!name) name = "fluid";
  if (!(bandwidth_bytes_per_s > 0) || !isfinite(bandwidth_bytes_per_s))
    return ferry__fail(FERRY_ERR_INVALID, "%s: bandwidth must be a positive number of bytes/s (got %g)", name,
                       bandwidth_bytes_per_s);
  if (latency_ns < 0)
    return ferry__fail(FERRY_ERR_INVALID, "%s: latency must be >= 0 ns (got %lld)", name, (long long)latency_ns);
  struct ferry__fluid *f = ferry__calloc(1, sizeof *f);
  if (!f) return ferry__fail(FERRY_ERR_NOMEM, "%s: out of memory", name);
  snprintf(f->name, sizeof f->name, "%s", name);
  f->des = des;
  f->bytes_per_ns = bandwidth_bytes_per_s / 1e9;
  f->latency_ns = latency_ns;
  f->max_active = max_active;
  f->cap_flows = max_active ? max_active : 16;
  f->flows = ferry__reallocarray(NULL, f->cap_flows, sizeof *f->flows);
  if (!f->flows) {
    ferry_free(f);
    return ferry__fail(FERRY_ERR_NOMEM, "%s: out of memory", name);
  }
  f->vtime_at_ns = ferry__des_now(des);
  *out = f;
  return FERRY_OK;
}

ferry_status ferry__link_create(struct ferry__fluid **out, struct ferry__des *des, const char *name,
                                double bandwidth_bytes_per_s, int64_t latency_ns, uint32_t copy_engines) {
  return ferry__fluid_create(out, des, name, bandwidth_bytes_per_s, latency_ns, copy_engines);
}

ferry_status ferry__disk_create(struct ferry__fluid **out, struct ferry__des *des, const char *name,
                                double bandwidth_bytes_per_s, int64_t latency_ns, uint32_t queue_depth,
                                double read_bytes_per_s) {
  *out = NULL;
  if (queue_depth == 0)
    return ferry__fail(FERRY_ERR_INVALID, "%s: disk queue depth must be at least 1", name ? name : "disk");
  if (!(read_bytes_per_s >= 0) || !isfinite(read_bytes_per_s))
    return ferry__fail(FERRY_ERR_INVALID, "%s: a read's rate must be >= 0 bytes/s (got %g)", name ? name : "disk",
                       read_bytes_per_s);
  ferry_status st = ferry__fluid_create(out, des, name, bandwidth_bytes_per_s, latency_ns, queue_depth);
  if (st == FERRY_OK && read_bytes_per_s < bandwidth_bytes_per_s) (*out)->job_bytes_per_ns = read_bytes_per_s / 1e9;
  return st;
}

void ferry__fluid_destroy(struct ferry__fluid *f) {
  if (!f) return;
  if (f->completion_id) ferry__des_cancel(f->des, f->completion_id);
  ferry_free(f->flows);
  ferry_free(f);
}

ferry_status ferry__fluid_submit(struct ferry__fluid *f, struct ferry__res_job *job) {
  if (f->sticky != FERRY_OK)
    return ferry__fail(f->sticky, "%s: an earlier event could not be scheduled", f->name);
  if (job->state != JOB_IDLE && job->state != JOB_DONE)
    return ferry__fail(FERRY_ERR_BUSY, "%s: job submitted while still in flight", f->name);
  /* Reserve room for the job among the flows now, where failure can be reported, so that
   * the latency-end event never allocates. */
  if (f->max_active == 0) {
    size_t need = (size_t)f->active + 1;
    if (need > f->cap_flows) {
      size_t cap = f->cap_flows * 2;
      struct ferry__res_job **fl = ferry__reallocarray(f->flows, cap, sizeof *fl);
      if (!fl) return ferry__fail(FERRY_ERR_NOMEM, "%s: out of memory for %zu transfers", f->name, cap);
      f->flows = fl;
      f->cap_flows = cap;
    }
  }
  job->owner = f;
  job->next = NULL;
  job->seq = f->next_seq++;
  job->submit_ns = ferry__des_now(f->des);
  job->start_ns = job->end_ns = -1;
  if (f->max_active == 0 || (f->active < f->max_active && !f->wait_head)) {
    ferry_status st = admit(f, job);
    if (st != FERRY_OK) return st;
    return FERRY_OK;
  }
  job->state = JOB_WAITING;
  if (f->wait_tail)
    f->wait_tail->next = job;
  else
    f->wait_head = job;
  f->wait_tail = job;
  f->n_waiting++;
  return FERRY_OK;
}

void ferry__fluid_get_stats(const struct ferry__fluid *f, struct ferry__fluid_stats *out) {
  int64_t busy = f->busy_ns;
  int64_t now = ferry__des_now(f->des);
  if (f->n_flows > 0 && now > f->vtime_at_ns) busy += now - f->vtime_at_ns;
  out->jobs_done = f->jobs_done;
  out->bytes_done = f->bytes_done;
  out->busy_ns = busy;
  out->active = f->active;
  out->flowing = (uint32_t)f->n_flows;
  out->waiting = f->n_waiting;
}

const char *ferry__fluid_name(const struct ferry__fluid *f) { return f->name; }

/* The same arithmetic as a lone job in the event-driven model: it joins at virtual time 0 (an
 * idle channel has rebased) with finish tag = bytes, and reschedule() waits for
 * ceil(tag * 1 flow / rate), or ceil(tag / per-job limit) where that binds. */
int64_t ferry__fluid_alone_ns(const struct ferry__fluid *f, uint64_t bytes, int64_t *flow_ns) {
  const double left = (double)bytes;
  const double ns = job_limited(f, 1) ? left / f->job_bytes_per_ns : left * 1.0 / f->bytes_per_ns;
  const int64_t flow = bytes ? ferry__ceil_ns(ns) : 0;
  if (flow_ns) *flow_ns = flow;
  return f->latency_ns + flow;
}

void ferry__fluid_account(struct ferry__fluid *f, uint64_t bytes, int64_t flow_ns) {
  f->jobs_done++;
  f->bytes_done += bytes;
  f->busy_ns += flow_ns;
}

/* ---- compute units -------------------------------------------------------------------------
 * Durations are known at submit, so a FIFO unit needs no queue: an op starts when the one
 * before it ends (or now, if idle) and its end event is scheduled at once; events at equal
 * times keep submission order through the kernel's sequence numbers. */

struct ferry__compute {
  struct ferry__des *des;
  char name[32];
  int64_t free_at_ns;
  uint64_t jobs_done;
  int64_t busy_ns;
};

static void on_compute_end(struct ferry__des *des, void *ctx) {
  struct ferry__res_job *j = ctx;
  struct ferry__compute *c = j->owner;
  if (j->stretch) { /* slowed by what started while it ran: it ends later */
    const int64_t end = j->stretch(j, j->ctx);
    if (end > j->end_ns && ferry__des_schedule(des, end, on_compute_end, j, NULL) == FERRY_OK) {
      if (c->free_at_ns == j->end_ns) c->free_at_ns = end;
      j->end_ns = end;
      return;
    }
  }
  j->state = JOB_DONE;
  c->jobs_done++;
  c->busy_ns += j->end_ns - j->start_ns;
  if (j->done) j->done(j, j->ctx);
}

ferry_status ferry__compute_create(struct ferry__compute **out, struct ferry__des *des, const char *name) {
  struct ferry__compute *c = ferry__calloc(1, sizeof *c);
  *out = NULL;
  if (!c) return ferry__fail(FERRY_ERR_NOMEM, "%s: out of memory", name ? name : "compute");
  snprintf(c->name, sizeof c->name, "%s", name ? name : "compute");
  c->des = des;
  c->free_at_ns = ferry__des_now(des);
  *out = c;
  return FERRY_OK;
}

void ferry__compute_destroy(struct ferry__compute *c) { ferry_free(c); }

ferry_status ferry__compute_submit(struct ferry__compute *c, struct ferry__res_job *job) {
  if (job->state != JOB_IDLE && job->state != JOB_DONE)
    return ferry__fail(FERRY_ERR_BUSY, "%s: op submitted while still in flight", c->name);
  if (job->duration_ns < 0)
    return ferry__fail(FERRY_ERR_INVALID, "%s: op duration %lld ns is negative", c->name,
                       (long long)job->duration_ns);
  int64_t now = ferry__des_now(c->des);
  int64_t start = c->free_at_ns > now ? c->free_at_ns : now;
  if (job->duration_ns > INT64_MAX / 2 - start)
    return ferry__fail(FERRY_ERR_RANGE, "%s: op duration %lld ns overflows the clock", c->name,
                       (long long)job->duration_ns);
  job->start_ns = start;
  int64_t end = start + job->duration_ns;
  if (job->stretch) {
    const int64_t e = job->stretch(job, job->ctx);
    if (e > end) end = e;
  }
  ferry_status st = ferry__des_schedule(c->des, end, on_compute_end, job, NULL);
  if (st != FERRY_OK) return st;
  job->owner = c;
  job->next = NULL;
  job->state = JOB_RUNNING;
  job->submit_ns = now;
  job->start_ns = start;
  job->end_ns = end;
  c->free_at_ns = end;
  return FERRY_OK;
}

void ferry__compute_account(struct ferry__compute *c, int64_t duration_ns) { ferry__compute_account_many(c, 1, duration_ns); }

void ferry__compute_account_many(struct ferry__compute *c, uint64_t jobs, int64_t total_ns) {
  c->jobs_done += jobs;
  c->busy_ns += total_ns;
}

void ferry__compute_get_stats(const struct ferry__compute *c, struct ferry__compute_stats *out) {
  out->jobs_done = c->jobs_done;
  out->busy_ns = c->busy_ns;
  out->free_at_ns = c->free_at_ns;
}
