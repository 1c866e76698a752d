/* The CUPTI collector's public functions, in every build: they load ferry's CUDA module on
 * first use (common/cuda_module.c) and call the collector in it, so that CUPTI and the CUDA
 * runtime are loaded only by a run that profiles. Without the module (a build without CUDA, or
 * the module or CUDA's libraries missing) ferry_cupti_start() fails with FERRY_ERR_UNSUPPORTED
 * saying what is missing, and the rest are no-ops on the NULL collector it leaves. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "common/cuda_module.h"
#include "common/error.h"
#include "profiler/cupti_api.h"

/* The table once found: launch_begin/end run around every op of a traced run. */
static _Atomic(const struct ferry__cupti_api *) g_api;

static const struct ferry__cupti_api *api(ferry_status *st) {
  const struct ferry__cupti_api *a = atomic_load(&g_api);
  *st = FERRY_OK;
  if (a) return a;
  a = ferry__cuda_module_sym(FERRY_CUPTI_API_SYMBOL, "cupti", st);
  if (!a) return NULL;
  if (a->version != FERRY_CUPTI_API_VERSION) {
    *st = ferry__fail(FERRY_ERR_UNSUPPORTED, "cupti: ferry's CUDA module %s is version %d, this ferry needs %d",
                      ferry__cuda_module_path(), a->version, FERRY_CUPTI_API_VERSION);
    return NULL;
  }
  atomic_store(&g_api, a);
  return a;
}

ferry_status ferry_cupti_start_config(ferry_cupti **out, ferry_activity_fn sink, void *user, int64_t t0_ns,
                                      const struct ferry_cupti_config *config) {
  if (out) *out = NULL;
  ferry_status st;
  const struct ferry__cupti_api *a = api(&st);
  if (a) return a->start_config(out, sink, user, t0_ns, config);
  char why[FERRY_ERRMSG_MAX];
  snprintf(why, sizeof why, "%s", ferry_last_error());
  return ferry__fail(st, "%s; there is no CUPTI collector, the run continues untraced", why);
}

ferry_status ferry_cupti_start(ferry_cupti **out, ferry_activity_fn sink, void *user, int64_t t0_ns) {
  return ferry_cupti_start_config(out, sink, user, t0_ns, NULL);
}

ferry_status ferry_cupti_flush(ferry_cupti *c) {
  ferry_status st;
  const struct ferry__cupti_api *a = api(&st);
  return a ? a->flush(c) : st;
}

void ferry_cupti_get_stats(const ferry_cupti *c, struct ferry_cupti_stats *stats) {
  ferry_status st;
  const struct ferry__cupti_api *a = c ? api(&st) : NULL; /* a collector exists only if the module does */
  if (a) {
    a->get_stats(c, stats);
  } else if (stats) {
    memset(stats, 0, sizeof *stats);
  }
}

uint64_t ferry_cupti_dropped(const ferry_cupti *c) {
  struct ferry_cupti_stats s;
  ferry_cupti_get_stats(c, &s);
  return s.dropped_records + s.zero_timestamp;
}

void ferry_cupti_launch_begin(void *user, uint64_t tag) {
  const struct ferry__cupti_api *a = atomic_load(&g_api);
  if (user && a) a->launch_begin(user, tag);
}

void ferry_cupti_launch_end(void *user) {
  const struct ferry__cupti_api *a = atomic_load(&g_api);
  if (user && a) a->launch_end(user);
}

ferry_status ferry_cupti_stop(ferry_cupti *c, struct ferry_cupti_stats *stats) {
  if (!c) {
    if (stats) memset(stats, 0, sizeof *stats);
    return FERRY_OK;
  }
  ferry_status st;
  const struct ferry__cupti_api *a = api(&st);
  return a ? a->stop(c, stats) : st;
}
