/* Throughput of the discrete-event kernel (sim/des.c) on a mixed "hold" workload: a fixed
 * population of pending events; each event that runs schedules a successor at a random
 * future time, and one event in eight also schedules a spare and cancels an older spare.
 * Prints events per second; the goal is >= 5 million/s in the release build. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/rng.h"
#include "common/units.h"
#include "sim/des.h"

#define SPARES 256

struct bench {
  struct ferry_rng rng;
  ferry__des_id spares[SPARES];
  uint64_t scheduled, cancelled;
  int failed;
};

static void on_event(struct ferry__des *des, void *ctx);

static void spare_event(struct ferry__des *des, void *ctx) {
  (void)des;
  (void)ctx;
}

static void on_event(struct ferry__des *des, void *ctx) {
  struct bench *b = ctx;
  /* Mostly short delays with ties (coarse 1 us grid), sometimes long ones. */
  uint64_t r = ferry__rng_u64(&b->rng);
  int64_t delay = (int64_t)((r & 1023) * 1000);
  if ((r >> 10 & 15) == 0) delay *= 64;
  if (ferry__des_schedule_in(des, delay, on_event, b, NULL) != FERRY_OK) b->failed = 1;
  b->scheduled++;
  if ((r >> 14 & 7) == 0) {
    size_t k = (size_t)(r >> 17) % SPARES;
    if (ferry__des_cancel(des, b->spares[k])) b->cancelled++;
    if (ferry__des_schedule_in(des, delay + 500, spare_event, NULL, &b->spares[k]) != FERRY_OK) b->failed = 1;
    b->scheduled++;
  }
}

static double run(size_t population, uint64_t events, uint64_t *cancelled) {
  struct ferry__des *des;
  if (ferry__des_create(&des, 0) != FERRY_OK) {
    fprintf(stderr, "des: %s\n", ferry_last_error());
    exit(1);
  }
  struct bench b = {0};
  ferry__rng_seed(&b.rng, 42);
  for (size_t i = 0; i < population; i++)
    ferry__des_schedule(des, (int64_t)(ferry__rng_u64(&b.rng) % 1000000), on_event, &b, NULL);
  /* warm the pool up to its high-water mark before timing */
  for (uint64_t i = 0; i < population * 4; i++) ferry__des_run_one(des);
  uint64_t before = ferry__des_events_run(des);
  int64_t t0 = ferry__mono_ns();
  for (uint64_t i = 0; i < events; i++) ferry__des_run_one(des);
  int64_t t1 = ferry__mono_ns();
  uint64_t ran = ferry__des_events_run(des) - before;
  if (b.failed) {
    fprintf(stderr, "des: scheduling failed: %s\n", ferry_last_error());
    exit(1);
  }
  *cancelled = b.cancelled;
  ferry__des_destroy(des);
  return (double)ran / ((double)(t1 - t0) / 1e9);
}

int main(int argc, char **argv) {
  uint64_t events = argc > 1 ? strtoull(argv[1], NULL, 10) : 5000000;
  static const size_t pops[] = {100, 10000, 1000000};
  printf("# ferry DES kernel: mixed schedule/pop/cancel workload, %" PRIu64 " events per row\n", events);
  printf("%-12s %16s %12s\n", "pending", "events/s", "cancelled");
  for (size_t i = 0; i < sizeof pops / sizeof pops[0]; i++) {
    uint64_t cancelled = 0;
    double eps = run(pops[i], events, &cancelled);
    printf("%-12zu %16.0f %12" PRIu64 "\n", pops[i], eps, cancelled);
  }
  return 0;
}
