/* The host executor's copy between tiers: what stands in for a GPU's copy engine. */
#ifndef FERRY_RUNTIME_EXEC_HOST_COPY_H
#define FERRY_RUNTIME_EXEC_HOST_COPY_H

#include <stddef.h>

/* Copies of at least this many bytes bypass the CPU's caches (ferry__host_copy()). */
#define FERRY_HOST_STREAM_COPY_BYTES ((size_t)1 << 20)

/* memcpy(dst, src, n) for regions that do not overlap. From FERRY_HOST_STREAM_COPY_BYTES on (on
 * x86-64) the destination is written with non-temporal stores, as a copy engine's DMA writes
 * memory without pulling it into a cache. A plain memcpy into a buffer another core has just read
 * (an expert slot the compute queue has just freed) must first take every line from that core's
 * cache: on this project's 2-core VM such copies once ran at 5-6 GB/s against 13-17 for a buffer
 * last read 44 MB of reads earlier, while streaming stores ran at 14-20 GB/s either way, and they
 * stayed the faster copy when the VM later ran memcpy at 18-31 GB/s (bench/hot_copy,
 * docs/validation.md section 4). */
void ferry__host_copy(void *dst, const void *src, size_t n);

#endif
