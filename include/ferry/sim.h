/**
 * @file sim.h
 * @brief The `sim` executor: the executor interface (exec.h) carried out in virtual time by a
 *        discrete-event simulation of a hardware profile (hw.h).
 *
 * Nothing is computed and buffers hold no bytes (ferry_exec_buf_host_ptr() is NULL); tier
 * budgets are enforced exactly as on the real executors. Each op becomes events: a kernel runs
 * on its queue's compute unit for its roofline duration on the profile's GPU (FLOPs and bytes
 * from ferry_kernel_cost(), plus the launch overhead; matrix products with one row use the
 * GEMV efficiency, others GEMM; norms, RoPE, activations, the router's top-k, combine, gather
 * and embedding are element-wise, norms, RoPE and activations timed by their launch geometry
 * where the profile gives gpu.sm_count, gpu.clock_mhz and gpu.compute_capability), or for the
 * profile's fitted cost of its kind when the
 * profile has a `cost` section for it (ferry_hw_cost_of()); a host-to-device copy flows over the
 * link's h2d direction and a device-to-host copy over its d2h direction (fluid sharing between
 * concurrent transfers, at most `link.copy_engines` at once, latency paid first; the pinned
 * rate, or the pageable rate when the configuration does not lock host memory); a disk read
 * flows through the disk (bandwidth shared by up to `disk.queue_depth` requests); copies
 * inside host memory or inside device memory read and write their bytes at the DRAM or the
 * device-memory bandwidth. Ops on one queue run in order; events order queues by generation
 * as on every executor. Buffered disk reads go through a model of the OS page cache: a range
 * read before, and still among the most recently used ranges that fit in the host memory the
 * host budget leaves (profile host.memory_bytes less the budget), is copied within host memory
 * instead; FERRY_READ_DROP_CACHE reads are never kept (and drop a cached range), O_DIRECT reads
 * bypass the cache. The host waiting for an event (ferry_exec_sync()) runs the event heap
 * until the event has happened, so ferry_exec_now() is the virtual clock.
 *
 * The same inputs give byte-identical results: ties between events resolve in submission
 * order, and nothing depends on the wall clock.
 */
#ifndef FERRY_SIM_H
#define FERRY_SIM_H

#include "ferry/api.h"

#include <stdint.h>

#include "ferry/exec.h"
#include "ferry/hw.h"
#include "ferry/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Counters of a `sim` executor since creation. */
struct ferry_sim_stats {
  uint64_t events_run;    /**< discrete events processed */
  uint64_t ops_done;      /**< ops completed, every kind (kernels, copies, reads, records, waits) */
  uint64_t kernels;       /**< kernels completed */
  uint64_t copies;        /**< copies completed (one that failed, an injected device failure, is
                               not: it copied nothing, and bytes_h2d holds no bytes of it) */
  uint64_t reads;         /**< disk reads completed */
  uint64_t bytes_h2d;     /**< bytes copied host to device, each copy at its size (one from host
                               memory of the other kind than the run's, ferry_exec_alloc_host(), holds
                               the link as long as its size scaled by the ratio of the two rates: that
                               time is in h2d_busy_ns, not in these bytes) */
  uint64_t bytes_d2h;     /**< bytes moved device to host */
  uint64_t bytes_disk;    /**< bytes read from disk (a store's files, and disk-tier buffers copied into
                               host ones) */
  int64_t h2d_busy_ns;    /**< time the link's h2d direction had bytes flowing */
  int64_t d2h_busy_ns;    /**< time the link's d2h direction had bytes flowing */
  int64_t disk_busy_ns;   /**< time the disk had bytes flowing */
  int64_t compute_busy_ns; /**< sum over queues of the time their kernels ran */
  int64_t now_ns;         /**< the virtual clock */
  uint64_t cache_hits;    /**< buffered disk reads served by the page cache */
  uint64_t cache_misses;  /**< buffered disk reads that went to the disk */
  uint64_t bytes_cache;   /**< bytes of reads served by the page cache */
  uint64_t graph_ops;     /**< ops submitted by launching op graphs (the engine's repeated sequences,
                               FERRY_SIM_FAST), counted in ops_done too */
  int mode;               /**< the ::ferry_sim_mode that times the ops: FERRY_SIM_EXACT when asked,
                               or when injected faults or two queues moving bytes the same way
                               (hybrid runs) need the discrete-event path */
  uint64_t allreduces;    /**< all-reduce kernels (FERRY_K_ALLREDUCE) of a multi-device run */
  int64_t allreduce_ns;   /**< their time, priced from the profile's interconnect */
  uint64_t bytes_peer;    /**< bytes copied GPU to GPU (pipeline hand-offs) */
  int64_t peer_busy_ns;   /**< time the GPU-to-GPU channel had bytes flowing */
  uint64_t bytes_gather;  /**< bytes the data-parallel peers sent of gathered weights
                               (ferry_exec_copy_peers(): ZeRO-3's all-gather) */
  int64_t gather_busy_ns; /**< time the all-gather channel (the interconnect) had bytes flowing */
  uint64_t bytes_disk_write; /**< bytes written to disk (copies into disk-tier buffers) */
  int64_t disk_write_busy_ns; /**< time the disk's write channel had bytes flowing */
};

/**
 * @brief Create the `sim` executor on a hardware profile.
 *
 * The profile needs a `gpu` section (kernels) and a `link` section (copies); `disk` and the
 * host's `dram_gbps` are needed only by the ops that use them (an op needing a missing figure
 * is refused when enqueued, with a message naming the profile and the figure).
 * @param out receives the executor, owned by the caller (ferry_exec_destroy()).
 * @param hw the profile (borrowed: its figures are copied, so it may be closed afterwards).
 * @param config budgets (copied; NULL = unlimited). `lock_host_memory` = 0 (pageable host memory)
 *        makes host-to-device copies use the link's pageable rate when the profile gives one,
 *        and the host wait for each (the driver stages pageable bytes before the call returns).
 * @return FERRY_OK; FERRY_ERR_INVALID for a NULL argument; FERRY_ERR_NOT_FOUND when the
 *         profile lacks the gpu or link figures; FERRY_ERR_NOMEM. Details in ferry_last_error().
 */
FERRY_API ferry_status ferry_exec_create_sim(ferry_exec **out, const ferry_hw *hw, const struct ferry_exec_config *config);

/**
 * @brief Counters of a `sim` executor.
 * @param ex the executor.
 * @param out receives the counters.
 * @return FERRY_OK, or FERRY_ERR_INVALID when @p ex is not a `sim` executor.
 */
FERRY_API ferry_status ferry_exec_sim_stats(const ferry_exec *ex, struct ferry_sim_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_SIM_H */
