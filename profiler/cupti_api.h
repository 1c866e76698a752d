/* What ferry's CUDA module (ferry_cuda.so) offers the profiler: the CUPTI collector's entry
 * points, in a versioned table the module exports under one name. cupti.c fills it;
 * cupti_load.c, built into ferry whether or not it has CUDA, finds it. */
#ifndef FERRY_PROFILER_CUPTI_API_H
#define FERRY_PROFILER_CUPTI_API_H

#include "ferry/cupti.h"

#define FERRY_CUPTI_API_VERSION 1
#define FERRY_CUPTI_API_SYMBOL "ferry__cupti_api"

struct ferry__cupti_api {
  int version; /* FERRY_CUPTI_API_VERSION */
  ferry_status (*start_config)(ferry_cupti **out, ferry_activity_fn sink, void *user, int64_t t0_ns,
                               const struct ferry_cupti_config *config);
  ferry_status (*flush)(ferry_cupti *c);
  void (*get_stats)(const ferry_cupti *c, struct ferry_cupti_stats *stats);
  void (*launch_begin)(void *user, uint64_t tag);
  void (*launch_end)(void *user);
  ferry_status (*stop)(ferry_cupti *c, struct ferry_cupti_stats *stats);
};

extern const struct ferry__cupti_api ferry__cupti_api;

#endif /* FERRY_PROFILER_CUPTI_API_H */
