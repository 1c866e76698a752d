/* What joins a profile's GPUs, as the sim executor prices it: peer-to-peer copies and ring
 * all-reduces over the interconnect section (NVLink/NVSwitch, PCIe P2P), or through the host
 * link when the profile has none. Internal to sim/. */
#ifndef FERRY_SIM_INTERCONNECT_H
#define FERRY_SIM_INTERCONNECT_H

#include <stdint.h>

#include "ferry/hw.h"

/* One GPU's rate to a peer (bytes/s) and the fixed cost of one transfer or collective step (ns):
 * over NVLink NCCL's share of the links (20 of every 25 GB/s), over PCIe P2P the interconnect's
 * rate. Without an interconnect section the bytes go down one GPU's link and up the other's: the
 * rate of the two in series, twice the link's latency. *via_host says which. */
void ferry__ic_rate(const struct ferry_hw_profile *p, double *bytes_per_s, int64_t *latency_ns, int *via_host);

/* An all-reduce of `bytes` per device over `devices` GPUs. Over an interconnect section: as
 * NCCL's tuner prices it (NCCL 2.18 src/graph/tuning.cc: latency + bytes / bandwidth of the
 * fastest of ring and tree with the LL, LL128 and Simple protocols, NVLink or PCI latencies by
 * interconnect.nvlink); without one: a ring of 2 (N - 1) steps staged through host memory, each
 * paying the links' latency. */
int64_t ferry__ic_allreduce_ns(const struct ferry_hw_profile *p, int64_t devices, uint64_t bytes);

#endif
