/* Discrete-event kernel of the simulator: a virtual clock and a binary min-heap of events
 * ordered by (time_ns, seq), so events at the same time run in the order they were scheduled
 * (libuv's timer heap). Events live in a pool with a free list: no allocation per event once
 * the pool has grown to the simulation's high-water mark. Internal to ferry (sim/). */
#ifndef FERRY_SIM_DES_H
#define FERRY_SIM_DES_H

#include <stddef.h>
#include <stdint.h>

#include "ferry/status.h"

struct ferry__des;

/* An event callback; runs with ferry__des_now() equal to the event's time. It may schedule
 * and cancel events (including in the past of nothing: at_ns >= now). */
typedef void (*ferry__des_fn)(struct ferry__des *des, void *ctx);

/* A predicate checked by ferry__des_run_while() before each event. */
typedef int (*ferry__des_pred)(void *arg);

/* Identifier of a scheduled event; 0 is never a valid id ("no event"). Ids stay unique for
 * the life of the kernel (slot index + per-slot generation), so cancelling a stale id is a
 * harmless no-op. */
typedef uint64_t ferry__des_id;

/* Create a kernel with its clock at 0 and room for initial_events pending events (0 = a
 * small default; the pool grows by doubling when needed). Owned; free with destroy. */
ferry_status ferry__des_create(struct ferry__des **out, size_t initial_events);
void ferry__des_destroy(struct ferry__des *des); /* accepts NULL */

/* Current virtual time in ns. */
int64_t ferry__des_now(const struct ferry__des *des);

/* Schedule fn(des, ctx) at absolute time at_ns (>= now; FERRY_ERR_INVALID otherwise). The
 * id (optional) can be passed to ferry__des_cancel(). FERRY_ERR_NOMEM if the pool cannot grow. */
ferry_status ferry__des_schedule(struct ferry__des *des, int64_t at_ns, ferry__des_fn fn, void *ctx,
                                 ferry__des_id *id);
/* Same, delay_ns (>= 0) after now. */
ferry_status ferry__des_schedule_in(struct ferry__des *des, int64_t delay_ns, ferry__des_fn fn, void *ctx,
                                    ferry__des_id *id);

/* Cancel a pending event. Returns 1 if it was pending (it will not run), 0 if the id is 0,
 * unknown, already ran or was already cancelled. Cancellation is lazy: the heap entry is
 * dropped when it reaches the top, or when cancelled entries outnumber live ones. */
int ferry__des_cancel(struct ferry__des *des, ferry__des_id id);

/* Run the next live event (advancing the clock to its time). Returns 1 if one ran, 0 if none
 * is pending. */
int ferry__des_run_one(struct ferry__des *des);

/* Run every event with time <= t_ns in order, then advance the clock to t_ns (if later than
 * now): the simulator's sleep_until. Returns the number of events run. Stops early (without
 * advancing the clock past the last event) if ferry__des_stop() is called. */
uint64_t ferry__des_run_until(struct ferry__des *des, int64_t t_ns);

/* Run events while pred(arg) is false (checked before each event). Returns 1 once pred is
 * true, 0 if the heap empties first (nothing can ever make it true: a deadlock for a waiting
 * host) or ferry__des_stop() was called. */
int ferry__des_run_while_not(struct ferry__des *des, ferry__des_pred pred, void *arg);

/* Run until no event is pending (or stop). Returns the number of events run. */
uint64_t ferry__des_run_all(struct ferry__des *des);

/* Ask the running loop (run_until / run_while_not / run_all) to return after the current
 * event; the request is cleared when the loop returns. */
void ferry__des_stop(struct ferry__des *des);

/* Number of live (scheduled, not cancelled, not yet run) events. */
size_t ferry__des_pending(const struct ferry__des *des);
/* Time of the next live event in *t_ns; returns 0 (leaving *t_ns alone) if none. */
int ferry__des_next_time(struct ferry__des *des, int64_t *t_ns);
/* Events run since creation. */
uint64_t ferry__des_events_run(const struct ferry__des *des);

#endif /* FERRY_SIM_DES_H */
