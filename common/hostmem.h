/* This machine's memory as the kernel reports it: /proc/meminfo's total and available bytes and
 * the pressure-stall information of /proc/pressure/memory (PSI, Linux 4.20+), which the engine
 * reads for the memory-pressure controller's host index (the policy never reads them itself). */
#ifndef FERRY_COMMON_HOSTMEM_H
#define FERRY_COMMON_HOSTMEM_H

#include <stdint.h>

struct ferry__host_mem {
  uint64_t total_bytes, available_bytes; /* 0 when /proc/meminfo cannot be read */
  int has_psi;                           /* /proc/pressure/memory was read */
  double psi_some_avg10, psi_full_avg10; /* % of the last 10 s some / all tasks stalled on memory */
};

/* Fill out; returns 1 when /proc/meminfo was read (PSI is optional). Paths are parameters so a
 * test can hand in files of its own (NULL: the /proc ones). */
int ferry__host_mem_read(struct ferry__host_mem *out, const char *meminfo_path, const char *psi_path);

#endif
