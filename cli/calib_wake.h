/* `ferry calibrate --db`: how long a host-executor queue that was blocked waiting for an event
 * takes to run on once the event completes (host.event_wake_ns). */
#ifndef FERRY_CLI_CALIB_WAKE_H
#define FERRY_CLI_CALIB_WAKE_H

#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/status.h"

/* The fewest blocked waits a fit of host.event_wake_ns takes. */
#define CALIB_WAKE_MIN_WAITS 30
/* The most ops of the waiting queue's own that a wait's lag looks back past. */
#define CALIB_WAKE_MAX_OWN 16

/* Over the waits of n_runs runs that blocked (a synchronization range of nonzero length), the
 * median time from the end of the last op of another queue that ended inside the wait (the op
 * whose record the wait was for: a copy, a read, a kernel) to the end of the wait. *median_ns is
 * set and *n_waits counts the waits measured; *median_ns is left alone when none was. */
ferry_status calib_event_wake(sqlite3 *db, const int64_t *runs, size_t n_runs, double *median_ns, size_t *n_waits);

#endif
