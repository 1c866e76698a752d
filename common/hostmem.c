/* /proc/meminfo and /proc/pressure/memory, parsed for the memory-pressure controller. */
#include <stdio.h>
#include <string.h>

#include "common/hostmem.h"

int ferry__host_mem_read(struct ferry__host_mem *out, const char *meminfo_path, const char *psi_path) {
  memset(out, 0, sizeof *out);
  FILE *f = fopen(meminfo_path ? meminfo_path : "/proc/meminfo", "r");
  char line[256];
  int got = 0;
  if (f) {
    unsigned long long kib;
    while (got != 3 && fgets(line, sizeof line, f)) {
      if (sscanf(line, "MemTotal: %llu kB", &kib) == 1) {
        out->total_bytes = (uint64_t)kib * 1024u;
        got |= 1;
      } else if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
        out->available_bytes = (uint64_t)kib * 1024u;
        got |= 2;
      }
    }
    fclose(f);
  }
  /* "some avg10=0.00 avg60=0.00 avg300=0.00 total=0" then the same for "full" */
  f = fopen(psi_path ? psi_path : "/proc/pressure/memory", "r");
  if (f) {
    int lines = 0;
    while (fgets(line, sizeof line, f)) {
      double v;
      if (sscanf(line, "some avg10=%lf", &v) == 1) {
        out->psi_some_avg10 = v;
        lines |= 1;
      } else if (sscanf(line, "full avg10=%lf", &v) == 1) {
        out->psi_full_avg10 = v;
        lines |= 2;
      }
    }
    fclose(f);
    out->has_psi = (lines & 1) != 0;
  }
  return got == 3 && out->total_bytes > 0;
}
