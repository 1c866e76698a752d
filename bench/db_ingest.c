/* Benchmark: activity rows per second through ferry_db_activity_sink() + ferry_db_flush() into
 * a fresh result database (WAL, synchronous=NORMAL, 4096-row transactions). The mix is what an
 * offloading step produces: mostly kernels and copies, some ranges and memory samples.
 * Usage: db_ingest [ROWS] [THREADS] [DB_PATH]   (defaults: 2000000 rows, 1 thread, a temp file) */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/units.h"
#include "ferry/db.h"

static const char *const op_names[] = {"matmul", "attention", "rmsnorm", "router_topk", "dequantize", "silu"};

struct worker {
  ferry_db *db;
  int64_t rows, first;
};

static void *produce(void *arg) {
  struct worker *w = arg;
  struct ferry_activity a;
  memset(&a, 0, sizeof a);
  for (int64_t i = 0; i < w->rows; i++) {
    int64_t k = w->first + i;
    int sel = (int)(k % 16);
    a.start_ns = k * 1000;
    a.end_ns = a.start_ns + 800;
    a.correlation_id = (uint64_t)k;
    a.step = (int32_t)(k / 4096);
    a.layer = (int32_t)(k % 32);
    a.expert = -1;
    if (sel < 8) {
      a.kind = FERRY_ACT_KERNEL;
      a.name = op_names[k % 6];
      a.queue = 0;
      a.flops = 2.0 * 4096 * 4096;
      a.bytes = 4096 * 4096 * 2;
    } else if (sel < 13) {
      a.kind = FERRY_ACT_MEMCPY;
      a.name = "weights";
      a.queue = sel == 12 ? 3 : 1;
      a.copy_kind = sel == 12 ? FERRY_COPY_DISK_TO_HOST : FERRY_COPY_HTOD;
      a.bytes = 64 << 20;
    } else if (sel < 15) {
      a.kind = FERRY_ACT_RANGE;
      a.name = sel == 13 ? "step" : "layer";
      a.queue = -1;
    } else {
      a.kind = FERRY_ACT_MEMORY;
      a.name = NULL;
      a.queue = -1;
      a.tier = FERRY_TIER_DEVICE;
      a.used_bytes = (uint64_t)(k % 1000) << 20;
    }
    ferry_db_activity_sink(w->db, &a);
  }
  return NULL;
}

int main(int argc, char **argv) {
  int64_t rows = argc > 1 ? atoll(argv[1]) : 2000000;
  int threads = argc > 2 ? atoi(argv[2]) : 1;
  if (rows <= 0 || threads <= 0 || threads > 64) {
    fprintf(stderr, "usage: db_ingest [ROWS] [THREADS 1..64] [DB_PATH]\n");
    return 2;
  }
  char path[256];
  if (argc > 3)
    snprintf(path, sizeof path, "%s", argv[3]);
  else
    snprintf(path, sizeof path, "%s/ferry-db-ingest-%d.db", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
  unlink(path);
  ferry_db *db;
  if (ferry_db_open(&db, path, FERRY_DB_CREATE) != FERRY_OK) {
    fprintf(stderr, "db_ingest: %s\n", ferry_last_error());
    return 1;
  }
  struct ferry_run_info info = {.kind = FERRY_RUN_SIM, .model = "bench", .hardware = "none"};
  int64_t run;
  if (ferry_db_run_begin(db, &info, &run) != FERRY_OK) {
    fprintf(stderr, "db_ingest: %s\n", ferry_db_errmsg(db));
    return 1;
  }
  pthread_t tid[64];
  struct worker w[64];
  int64_t t0 = ferry__mono_ns();
  for (int t = 0; t < threads; t++) {
    w[t] = (struct worker){db, rows / threads, t * (rows / threads)};
    pthread_create(&tid[t], NULL, produce, &w[t]);
  }
  for (int t = 0; t < threads; t++) pthread_join(tid[t], NULL);
  ferry_status st = ferry_db_flush(db);
  int64_t t1 = ferry__mono_ns();
  if (st != FERRY_OK) {
    fprintf(stderr, "db_ingest: %s\n", ferry_db_errmsg(db));
    return 1;
  }
  ferry_db_run_finish(db, run, NULL);
  ferry_db_close(db);
  int64_t total = (rows / threads) * threads;
  double secs = (double)(t1 - t0) / 1e9;
  printf("db_ingest: %lld activity rows, %d thread%s, %.3f s, %.0f rows/s (sink + flush, 4096-row transactions)\n",
         (long long)total, threads, threads == 1 ? "" : "s", secs, (double)total / secs);
  if (argc <= 3) {
    char side[300];
    unlink(path);
    snprintf(side, sizeof side, "%s-wal", path);
    unlink(side);
    snprintf(side, sizeof side, "%s-shm", path);
    unlink(side);
  }
  return 0;
}
