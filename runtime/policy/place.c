/* Hybrid placement (Fiddler, Kamahori et al., arXiv 2402.07033): a unit whose weights are in
 * host memory runs on the CPU when that is faster than copying the weights to the device and
 * running there. For one token the CPU wins (it reads the weight once, as the copy would); for a
 * prefill of hundreds of tokens the device's math wins despite the copy. Pure arithmetic. */
#include <math.h>

#include "policy.h"

static double seconds(double amount, double rate) { return amount > 0 ? (rate > 0 ? amount / rate : INFINITY) : 0; }

int ferry__place_on_cpu(const struct ferry_place_rates *r, double weight_bytes, double flops) {
  const double cpu = fmax(seconds(flops, r->cpu_flops), seconds(weight_bytes, r->cpu_bytes));
  const double dev = seconds(weight_bytes, r->link_bytes) +
                     fmax(seconds(flops, r->dev_flops), seconds(weight_bytes, r->dev_bytes));
  return isfinite(cpu) && cpu < dev;
}
