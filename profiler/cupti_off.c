/* The CUPTI collector in a build without CUDA: the public functions exist so that callers
 * need no #ifdef, and ferry_cupti_start() says why there is no GPU trace. The clock and the
 * converter are in cupti_convert.c, built in both cases. */
#include <string.h>

#include "common/error.h"
#include "ferry/cupti.h"

ferry_status ferry_cupti_start_config(ferry_cupti **out, ferry_activity_fn sink, void *user, int64_t t0_ns,
                                      const struct ferry_cupti_config *config) {
  (void)sink, (void)user, (void)t0_ns, (void)config;
  if (out) *out = NULL;
  return ferry__fail(FERRY_ERR_UNSUPPORTED, "cupti: this ferry was built without CUDA (FERRY_CUDA=OFF or no "
                     "toolkit found), so there is no CUPTI collector; the run continues untraced");
}

ferry_status ferry_cupti_start(ferry_cupti **out, ferry_activity_fn sink, void *user, int64_t t0_ns) {
  return ferry_cupti_start_config(out, sink, user, t0_ns, NULL);
}

ferry_status ferry_cupti_flush(ferry_cupti *c) {
  (void)c;
  return ferry__fail(FERRY_ERR_UNSUPPORTED, "cupti: built without CUDA");
}

uint64_t ferry_cupti_dropped(const ferry_cupti *c) {
  (void)c;
  return 0;
}

void ferry_cupti_get_stats(const ferry_cupti *c, struct ferry_cupti_stats *stats) {
  (void)c;
  if (stats) memset(stats, 0, sizeof *stats);
}

void ferry_cupti_launch_begin(void *user, uint64_t tag) { (void)user, (void)tag; }

void ferry_cupti_launch_end(void *user) { (void)user; }

ferry_status ferry_cupti_stop(ferry_cupti *c, struct ferry_cupti_stats *stats) {
  (void)c;
  if (stats) memset(stats, 0, sizeof *stats);
  return FERRY_OK;
}
