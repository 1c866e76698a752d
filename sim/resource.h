/* Resource models the sim executor sits on: fluid-shared channels (a PCIe link direction with
 * its copy engines, a disk with its queue depth) and FIFO compute units, all driven by the
 * discrete-event kernel. The cost model that prices kernels is sim/gpu_cost.h. Internal to
 * ferry (sim/). */
#ifndef FERRY_SIM_RESOURCE_H
#define FERRY_SIM_RESOURCE_H

#include <stdint.h>

#include "ferry/dtype.h"
#include "ferry/hw.h"
#include "ferry/status.h"
#include "sim/des.h"

struct ferry__res_job;

/* Called once when a job ends, at its end time (ferry__des_now() == job->end_ns). The job may
 * be resubmitted (to any resource) from inside the callback. */
typedef void (*ferry__res_done_fn)(struct ferry__res_job *job, void *ctx);

/* A unit of work, owned by the caller (typically embedded in an executor op) and left alone
 * by the caller while in flight: resources never allocate per job. Zero-initialise it, set
 * the inputs, submit; a finished job may be submitted again. */
struct ferry__res_job {
  /* inputs */
  uint64_t bytes;          /* fluid resources: bytes to move */
  int64_t duration_ns;     /* compute units: how long the op runs (from the cost model) */
  int64_t extra_latency_ns; /* fluid resources: added to the latency phase (an injected delay, a
                               latency spike: the job holds its slot meanwhile) */
  ferry__res_done_fn done; /* optional completion callback */
  void *ctx;               /* passed to done (and to the two below) */
  /* compute units, optional: the op's end given its start_ns and duration_ns, when something
   * beside it slows it (link.contention). Asked at submit and again when that end comes: a later
   * answer defers the end (what slows it may be learnt only while it runs) */
  int64_t (*stretch)(struct ferry__res_job *job, void *ctx);
  /* fluid resources, optional: called when the job's bytes start to flow (its latency paid) */
  void (*flowing)(struct ferry__res_job *job, void *ctx);
  /* outputs, set by the resource */
  int64_t submit_ns; /* when submitted */
  int64_t start_ns;  /* when it got a copy engine / queue slot / the compute unit */
  int64_t end_ns;    /* when it ended */
  /* private to the resource */
  struct ferry__res_job *next;
  void *owner;
  double finish_tag; /* virtual time at which its bytes are all served */
  uint64_t seq;
  int state;
};

/* ---- fluid-shared channels ----------------------------------------------------------------
 * Processor sharing: the jobs past their latency share the bandwidth equally, so when one
 * ends the others speed up. A job first waits (FIFO) for one of max_active slots (copy
 * engines, queue depth; 0 = unlimited), then pays latency_ns without using bandwidth, then
 * its bytes flow at bandwidth / (jobs flowing), or at a disk's per-read limit (its reader's
 * rate, the same for every job) where that is smaller. Implemented with a virtual clock V (bytes
 * served to each flowing job so far): a job joining at V0 ends when V = V0 + bytes, so only
 * the earliest finish tag needs an event. Completion times are rounded up to whole ns (an
 * exact integer stays exact), computed in IEEE double without fast-math: bit-reproducible. */
struct ferry__fluid;

struct ferry__fluid_stats {
  uint64_t jobs_done;  /* completed jobs */
  uint64_t bytes_done; /* bytes of completed jobs */
  int64_t busy_ns;     /* time with at least one job's bytes flowing */
  uint32_t active;     /* jobs holding a slot now (latency or flowing) */
  uint32_t flowing;    /* jobs whose bytes are flowing now */
  uint64_t waiting;    /* jobs waiting for a slot now */
};

/* bandwidth_bytes_per_s > 0, latency_ns >= 0; name (copied, truncated to 31 chars) appears
 * in messages. Owned; destroy accepts NULL and must not be called with jobs in flight that
 * will still be run (it does not cancel their events: destroy the kernel's users first). */
ferry_status ferry__fluid_create(struct ferry__fluid **out, struct ferry__des *des, const char *name,
                                 double bandwidth_bytes_per_s, int64_t latency_ns, uint32_t max_active);
/* A PCIe link direction: max_active = copy engines (0 = unlimited). */
ferry_status ferry__link_create(struct ferry__fluid **out, struct ferry__des *des, const char *name,
                                double bandwidth_bytes_per_s, int64_t latency_ns, uint32_t copy_engines);
/* A disk: queue_depth >= 1 requests in flight, more wait FIFO. read_bytes_per_s: the most one
 * read's bytes flow at, what the runtime's reader reaches (ferry_hw_disk_read_gbps()); reads
 * sharing the disk each get the smaller of that and an equal share; 0 or at least the bandwidth =
 * no limit beyond the disk's. */
ferry_status ferry__disk_create(struct ferry__fluid **out, struct ferry__des *des, const char *name,
                                double bandwidth_bytes_per_s, int64_t latency_ns, uint32_t queue_depth,
                                double read_bytes_per_s);
void ferry__fluid_destroy(struct ferry__fluid *f);

/* Submit a job (job->bytes may be 0: it then ends after the latency). FERRY_ERR_BUSY if the
 * job is already in flight; FERRY_ERR_NOMEM if the resource cannot grow; a scheduling failure
 * inside an earlier event is sticky and returned here. */
ferry_status ferry__fluid_submit(struct ferry__fluid *f, struct ferry__res_job *job);
void ferry__fluid_get_stats(const struct ferry__fluid *f, struct ferry__fluid_stats *out);
const char *ferry__fluid_name(const struct ferry__fluid *f);

/* A job alone on the channel, timed without events (the sim executor's fast path): its latency
 * then its bytes at the whole bandwidth, exactly the times the event-driven model gives a job
 * that never shares; *flow_ns receives the part with bytes flowing. account() adds such a job,
 * once done, to the channel's statistics. */
int64_t ferry__fluid_alone_ns(const struct ferry__fluid *f, uint64_t bytes, int64_t *flow_ns);
void ferry__fluid_account(struct ferry__fluid *f, uint64_t bytes, int64_t flow_ns);

/* ---- compute units -------------------------------------------------------------------------
 * One queue of a GPU (or CPU): ops run one at a time in submission order, each for the
 * duration the caller gives (sim/gpu_cost.h). */
struct ferry__compute;

struct ferry__compute_stats {
  uint64_t jobs_done; /* completed ops */
  int64_t busy_ns;    /* sum of completed ops' durations */
  int64_t free_at_ns; /* when the last submitted op ends */
};

ferry_status ferry__compute_create(struct ferry__compute **out, struct ferry__des *des, const char *name);
void ferry__compute_destroy(struct ferry__compute *c);
/* Queue an op of job->duration_ns (>= 0). FERRY_ERR_BUSY if already in flight. */
ferry_status ferry__compute_submit(struct ferry__compute *c, struct ferry__res_job *job);
void ferry__compute_get_stats(const struct ferry__compute *c, struct ferry__compute_stats *out);
/* An op of duration_ns run outside the event kernel (the sim executor's fast path), added to
 * the unit's statistics once done. */
void ferry__compute_account(struct ferry__compute *c, int64_t duration_ns);
/* Several such ops at once: their number and total duration. */
void ferry__compute_account_many(struct ferry__compute *c, uint64_t jobs, int64_t total_ns);

/* Round a duration in ns up to a whole ns, treating values within 1e-9 (relative) of an
 * integer as that integer so exact results are not pushed up by float noise. Negative and
 * NaN give 0; huge values saturate at INT64_MAX / 4. */
int64_t ferry__ceil_ns(double ns);

#endif /* FERRY_SIM_RESOURCE_H */
