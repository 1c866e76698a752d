/* Pricing GPU-to-GPU traffic from a profile's interconnect section (sim/interconnect.h). A
 * multi-GPU run on a profile without one still runs, its traffic priced through the host link;
 * the executor says so once when it is created. */
#include "sim/interconnect.h"

void ferry__ic_rate(const struct ferry_hw_profile *p, double *bytes_per_s, int64_t *latency_ns, int *via_host) {
  if (p->has_interconnect && p->interconnect.gpu_gbps > 0) {
    *bytes_per_s = p->interconnect.gpu_gbps * 1e9;
    *latency_ns = p->interconnect.latency_ns;
    *via_host = 0;
    return;
  }
  const double d2h = p->link.d2h_gbps > 0 ? p->link.d2h_gbps : 1, h2d = p->link.h2d_gbps > 0 ? p->link.h2d_gbps : 1;
  *bytes_per_s = 1e9 / (1.0 / d2h + 1.0 / h2d); /* staged through host memory: down, then up */
  *latency_ns = 2 * p->link.latency_ns;
  *via_host = 1;
}

int64_t ferry__ic_allreduce_ns(const struct ferry_hw_profile *p, int64_t devices, uint64_t bytes) {
  if (devices < 2) return 0;
  double rate;
  int64_t lat;
  int via_host;
  ferry__ic_rate(p, &rate, &lat, &via_host);
  const double steps = 2.0 * (double)(devices - 1);
  /* GPUs without a switch share one fabric: their concurrent sends split it */
  const double share = via_host || (p->has_interconnect && !p->interconnect.switched) ? (double)devices : 1.0;
  const double moved = steps * (double)bytes / (double)devices;
  return (int64_t)(moved * share / rate * 1e9 + 0.5) + (int64_t)steps * lat;
}
