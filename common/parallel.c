/* ferry__parallel_for: fork-join over contiguous chunks with plain pthreads, short-lived
 * because its callers are one-off bulk jobs, not hot loops. */
#include "common/parallel.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#define MAX_THREADS 256

int ferry__parallel_threads(void) {
  const char *env = getenv("FERRY_THREADS");
  if (env && *env) {
    char *end = NULL;
    long v = strtol(env, &end, 10);
    if (end && !*end && v > 0) return v > MAX_THREADS ? MAX_THREADS : (int)v;
  }
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  return cpus < 1 ? 1 : cpus > MAX_THREADS ? MAX_THREADS : (int)cpus;
}

struct chunk {
  void (*fn)(void *ctx, int64_t begin, int64_t end);
  void *ctx;
  int64_t begin, end;
};

static void *run_chunk(void *arg) {
  const struct chunk *c = arg;
  c->fn(c->ctx, c->begin, c->end);
  return NULL;
}

void ferry__parallel_for(int64_t n, int64_t min_chunk, void (*fn)(void *ctx, int64_t begin, int64_t end), void *ctx) {
  if (n <= 0) return;
  if (min_chunk < 1) min_chunk = 1;
  int64_t threads = ferry__parallel_threads();
  if (threads > n / min_chunk) threads = n / min_chunk;
  if (threads <= 1) {
    fn(ctx, 0, n);
    return;
  }
  struct chunk chunks[MAX_THREADS];
  pthread_t tid[MAX_THREADS];
  int started[MAX_THREADS] = {0};
  for (int64_t t = 0; t < threads; t++)
    chunks[t] = (struct chunk){fn, ctx, n * t / threads, n * (t + 1) / threads};
  /* the caller takes chunk 0; a chunk whose thread does not start is run here afterwards */
  for (int64_t t = 1; t < threads; t++) started[t] = pthread_create(&tid[t], NULL, run_chunk, &chunks[t]) == 0;
  run_chunk(&chunks[0]);
  for (int64_t t = 1; t < threads; t++) {
    if (started[t]) pthread_join(tid[t], NULL);
    else run_chunk(&chunks[t]);
  }
}
