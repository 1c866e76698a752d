/* Pricing GPU-to-GPU traffic from a profile's interconnect section (sim/interconnect.h). A
 * multi-GPU run on a profile without one still runs, its traffic priced through the host link;
 * the executor says so once when it is created. */
#include <math.h>

#include "sim/interconnect.h"

/* NCCL counts 20 GB/s per NVLink (topo.h SM70/SM80/SM90_NVLINK_BW) of the 25 GB/s each way that
 * NVLink 2, 3 and 4 carry per link (the datasheets' per-GPU figures / links / 2) */
#define NCCL_NVLINK_SHARE (20.0 / 25.0)

void ferry__ic_rate(const struct ferry_hw_profile *p, double *bytes_per_s, int64_t *latency_ns, int *via_host) {
  if (p->has_interconnect && p->interconnect.gpu_gbps > 0) {
    /* the engines move GPU-to-GPU bytes with NCCL (a pipeline stage's send/recv, ZeRO-3's
     * all-gather), which gets NCCL's share of each NVLink, as its all-reduces do below */
    *bytes_per_s = p->interconnect.gpu_gbps * 1e9 * (p->interconnect.nvlink ? NCCL_NVLINK_SHARE : 1.0);
    *latency_ns = p->interconnect.latency_ns;
    *via_host = 0;
    return;
  }
  const double d2h = p->link.d2h_gbps > 0 ? p->link.d2h_gbps : 1, h2d = p->link.h2d_gbps > 0 ? p->link.h2d_gbps : 1;
  *bytes_per_s = 1e9 / (1.0 / d2h + 1.0 / h2d); /* staged through host memory: down, then up */
  *latency_ns = 2 * p->link.latency_ns;
  *via_host = 1;
}

/* NCCL's own model of an all-reduce within one machine (NCCL 2.18, src/graph/tuning.cc:
 * ncclTopoTuneModel's latencies and bandwidths, ncclTopoGetAlgoTime's time = latency + bytes /
 * bandwidth, the fastest algorithm and protocol taken as NCCL takes it). Latencies in us, per
 * algorithm (tree, ring) and protocol (LL, LL128, Simple). */
enum { ALGO_TREE, ALGO_RING, N_ALGOS };
enum { PROTO_LL, PROTO_LL128, PROTO_SIMPLE, N_PROTOS };
static const double base_lat_us[N_ALGOS][N_PROTOS] = {{6.8, 14.0, 0}, {6.6, 14.0, 8.4}};
static const double hw_lat_us[2][N_ALGOS][N_PROTOS] = {
    {{1.0, 1.9, 28}, {1.0, 2.5, 5.7}},  /* PCI */
    {{.6, 1.25, 28}, {.6, 1.9, 3.4}}}; /* NVLink */
/* llMaxBws, one node of Ampere or Hopper GPUs: what the LL protocol reaches, GB/s */
#define NCCL_LL_MAX_BW_GBPS 87.7
/* treeCorrectionFactor: trees fall short of the model at medium sizes; powers of two, 64 B up */
static const double tree_correction[N_PROTOS][23] = {
    {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0},
    {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0},
    {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9}};

/* The bus bandwidth (GB/s) NCCL expects of algorithm a and protocol p from one GPU's bus_gbps
 * (0: the protocol does not run there). */
static double nccl_busbw(int a, int p, double bus_gbps, int nvlink) {
  double bw = bus_gbps;
  if (a == ALGO_RING && p == PROTO_LL) bw = fmin(NCCL_LL_MAX_BW_GBPS, bw / 4);
  if (a == ALGO_RING && p == PROTO_LL128) bw *= 0.92; /* 120 of every 128 bytes are data */
  if (a == ALGO_TREE) bw *= 0.92;
  if (a == ALGO_TREE && p == PROTO_LL) bw = fmin(bw / 3.8, NCCL_LL_MAX_BW_GBPS);
  if (a == ALGO_TREE && p == PROTO_LL128) bw *= 7.0 / 9.0;
  /* LL128 runs only over NVLink (enabled by default on Volta, Ampere and Hopper with NVLink) */
  return p == PROTO_LL128 && !nvlink ? 0 : bw;
}

static int log2_floor(uint64_t v) {
  int l = 0;
  while (v >>= 1) l++;
  return l;
}

/* The all-reduce's time in us as NCCL's tuner predicts it on one node of n GPUs. */
static double nccl_allreduce_us(int64_t n, uint64_t bytes, double bus_gbps, int nvlink) {
  const double steps = 2.0 * (double)(n - 1);
  const int log_size = log2_floor(bytes >> 6);
  double best = -1;
  for (int a = 0; a < N_ALGOS; a++) {
    for (int p = 0; p < N_PROTOS; p++) {
      double bw = nccl_busbw(a, p, bus_gbps, nvlink) * (a == ALGO_RING ? (double)n / steps : 0.5);
      if (!(bw > 0)) continue;
      if (a == ALGO_TREE && log_size < 23) bw *= tree_correction[p][log_size];
      /* a ring pays the per-hop latency at each of its 2 (n - 1) steps; a tree within one node
       * twice its chain of n - 1 GPUs */
      const double lat = base_lat_us[a][p] + steps * hw_lat_us[nvlink ? 1 : 0][a][p];
      const double t = lat + (double)bytes / (1000.0 * bw);
      if (best < 0 || t < best) best = t;
    }
  }
  return best;
}

int64_t ferry__ic_allreduce_ns(const struct ferry_hw_profile *p, int64_t devices, uint64_t bytes) {
  if (devices < 2) return 0;
  double rate;
  int64_t lat;
  int via_host;
  ferry__ic_rate(p, &rate, &lat, &via_host);
  const double steps = 2.0 * (double)(devices - 1);
  if (via_host) {
    /* no peer path: every step's bytes go down one GPU's link and up another's, the GPUs' sends
     * sharing the host's fabric */
    const double moved = steps * (double)bytes / (double)devices;
    return (int64_t)(moved * (double)devices / rate * 1e9 + 0.5) + (int64_t)steps * lat;
  }
  const struct ferry_hw_interconnect *ic = &p->interconnect;
  /* GPUs without a switch share one fabric: their concurrent sends split it */
  double bus_gbps = ic->gpu_gbps / (ic->switched ? 1.0 : (double)devices);
  if (ic->nvlink) bus_gbps *= NCCL_NVLINK_SHARE;
  return (int64_t)(nccl_allreduce_us(devices, bytes, bus_gbps, ic->nvlink) * 1e3 + 0.5);
}
