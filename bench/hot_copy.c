/* A host memcpy into a buffer another thread read recently, against one it read long ago: the
 * host executor's copy into a device-tier slot whose last expert the compute thread has just
 * multiplied. One reader thread reads the destination and then `lag` other buffers of the same
 * size (as the compute thread reads the experts after it); the main thread then copies a source
 * buffer over the destination, as the copy queue does. Prints the median copy rate per lag,
 * with the bytes the reader read in between, for memcpy and for the host executor's copy
 * (ferry__host_copy: streaming stores from 1 MiB on).
 *
 * On this project's 2-core VM (2026-12-04) memcpy into a buffer read 0-11 MB of other reads ago
 * ran at 5-6 GB/s and from 44 MB on at 13-17 GB/s (the fidelity study's 48 MiB configurations,
 * 3 expert slots with the victim read about two experts ago, copied at 8-10 GB/s, the 64-80 MiB
 * ones at 13-15); streaming stores ran at 14-20 GB/s at every lag, and the host executor now
 * copies that way. An hour later the same VM gave memcpy 30 GB/s at lag 0 and 18-19 at 66 MB,
 * streaming stores 37-39 and 19-20: what a recently read line costs depends on where the VM's
 * two vCPUs run; streaming stores were the faster copy either way (docs/validation.md section 4).
 * Usage: hot_copy [copy_bytes [reps]]   (default 5505024, the study's expert, and 41 reps) */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/units.h"
#include "runtime/exec/host_copy.h"

enum { BUFFERS = 16, LAGS = 9 };

static char *bufs[BUFFERS];
static size_t copy_bytes;
static atomic_int request = -1; /* buffer to read next; -1: none; -2: stop */
static volatile float sink;

static void *reader(void *arg) {
  (void)arg;
  for (;;) {
    int b;
    while ((b = atomic_load(&request)) == -1) {
    }
    if (b == -2) return NULL;
    const float *p = (const float *)(const void *)bufs[b];
    float s = 0.0f;
    for (size_t i = 0; i < copy_bytes / sizeof *p; i++) s += p[i];
    sink = s;
    atomic_store(&request, -1);
  }
}

static void read_on_reader(int b) {
  atomic_store(&request, b);
  while (atomic_load(&request) != -1) {
  }
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  copy_bytes = argc > 1 ? (size_t)atoll(argv[1]) : 5505024;
  const int reps = argc > 2 ? atoi(argv[2]) : 41;
  if (copy_bytes < 4096 || copy_bytes > ((size_t)1 << 30) || reps < 1 || reps > 10000) {
    fprintf(stderr, "usage: hot_copy [copy_bytes [reps]]   (4 KiB to 1 GiB; 1-10000 reps)\n");
    return 2;
  }
  char *src = ferry__aligned_alloc(4096, copy_bytes);
  double *rate = ferry__calloc((size_t)reps, sizeof *rate);
  for (int b = 0; b < BUFFERS; b++) bufs[b] = ferry__aligned_alloc(4096, copy_bytes);
  for (int b = 0; b < BUFFERS; b++)
    if (!bufs[b] || !src || !rate) {
      fprintf(stderr, "hot_copy: out of memory\n");
      return 1;
    }
  for (int b = 0; b < BUFFERS; b++) memset(bufs[b], 1, copy_bytes);
  memset(src, 2, copy_bytes);
  pthread_t th;
  if (pthread_create(&th, NULL, reader, NULL)) {
    fprintf(stderr, "hot_copy: cannot start the reader thread\n");
    return 1;
  }
  static const int lags[LAGS] = {0, 1, 2, 3, 4, 5, 6, 8, 12};
  printf("%6s %12s %12s %12s\n", "lag", "read since", "memcpy GB/s", "host GB/s");
  for (int li = 0; li < LAGS; li++) {
    double median[2];
    for (int how = 0; how < 2; how++) {
      for (int r = 0; r < reps; r++) {
        const int target = r % BUFFERS;
        for (int k = 0; k <= lags[li]; k++) read_on_reader((target + k) % BUFFERS);
        const int64_t t0 = ferry__mono_ns();
        if (how) ferry__host_copy(bufs[target], src, copy_bytes);
        else memcpy(bufs[target], src, copy_bytes);
        rate[r] = (double)copy_bytes / (double)(ferry__mono_ns() - t0);
      }
      qsort(rate, (size_t)reps, sizeof *rate, cmp_double);
      median[how] = rate[reps / 2];
    }
    printf("%6d %9.1f MB %12.2f %12.2f\n", lags[li], (double)lags[li] * (double)copy_bytes / 1e6, median[0],
           median[1]);
  }
  atomic_store(&request, -2);
  pthread_join(th, NULL);
  for (int b = 0; b < BUFFERS; b++) ferry_free(bufs[b]);
  ferry_free(src);
  ferry_free(rate);
  return 0;
}
