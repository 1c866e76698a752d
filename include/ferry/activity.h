/**
 * @file activity.h
 * @brief Activity records: what every executor reports about every operation it ran (a
 *        kernel, a copy, a disk read, a range of engine work, a memory sample), and the sink
 *        callback that receives them. The profiler turns them into timeline rows.
 */
#ifndef FERRY_ACTIVITY_H
#define FERRY_ACTIVITY_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** The NVTX domain of ferry's ranges (ferry_exec_range_begin()): filter on it in Nsight Systems
 *  (`nsys stats --report nvtx_sum`, or the NVTX_EVENTS rows whose domain is "ferry"). */
#define FERRY_NVTX_DOMAIN "ferry"

/** Kind of an activity record. */
enum ferry_activity_kind {
  FERRY_ACT_KERNEL,   /**< a compute op (GEMM, attention, norm, ...) */
  FERRY_ACT_MEMCPY,   /**< a copy between tiers, including disk reads */
  FERRY_ACT_MEMSET,   /**< a fill of a buffer */
  FERRY_ACT_RANGE,    /**< an engine phase (NVTX-style range: step, layer, block fetch, ...) */
  FERRY_ACT_MEMORY,   /**< a memory-usage sample of one tier */
  FERRY_ACT_SYNC,     /**< the host waiting for an event */
  FERRY_ACT_RUNTIME   /**< a CUDA runtime API call on a host thread (CUPTI collector); queue = -1,
                           name = the API function */
};

/** Direction of a copy, numbered as Nsight Systems' ENUM_CUDA_MEMCPY_OPER. */
enum ferry_copy_kind {
  FERRY_COPY_UNKNOWN = 0, /**< unknown */
  FERRY_COPY_HTOD = 1,    /**< host to device */
  FERRY_COPY_DTOH = 2,    /**< device to host */
  FERRY_COPY_HTOA = 3,    /**< host to array (unused) */
  FERRY_COPY_ATOH = 4,    /**< array to host (unused) */
  FERRY_COPY_ATOA = 5,    /**< array to array (unused) */
  FERRY_COPY_ATOD = 6,    /**< array to device (unused) */
  FERRY_COPY_DTOA = 7,    /**< device to array (unused) */
  FERRY_COPY_DTOD = 8,    /**< device to device */
  FERRY_COPY_HTOH = 9,    /**< host to host */
  FERRY_COPY_PTOP = 10,   /**< peer to peer */
  FERRY_COPY_DISK_TO_HOST = 100, /**< ferry extension: a disk read into host memory (a store's file, or a
                                      disk-tier buffer copied into a host one) */
  FERRY_COPY_HOST_TO_DISK = 101  /**< ferry extension: a host buffer written into a disk-tier buffer */
};

/** Memory tier. */
enum ferry_tier {
  FERRY_TIER_DEVICE = 0, /**< GPU memory (or the host executor's budgeted stand-in) */
  FERRY_TIER_HOST = 1,   /**< pinned host memory */
  FERRY_TIER_DISK = 2,   /**< files */
  FERRY_TIER_COUNT       /**< number of tiers, not a tier */
};

/**
 * Details of an activity that only a CUDA trace knows (filled by the CUPTI collector,
 * include/ferry/cupti.h). Memory kinds use Nsight Systems' ENUM_CUDA_MEM_KIND numbering
 * (0 pageable, 1 pinned, 2 device, ..., 7 unknown), not CUPTI's.
 */
struct ferry_activity_cuda {
  uint32_t device_id;            /**< CUDA device */
  uint32_t context_id;           /**< CUDA context */
  const char *mangled_name;      /**< kernels: the mangled name (borrowed); NULL = same as name */
  int32_t grid[3];               /**< kernels: grid dimensions x, y, z */
  int32_t block[3];              /**< kernels: block dimensions x, y, z */
  int32_t registers_per_thread;  /**< kernels: registers per thread */
  int32_t static_shared_bytes;   /**< kernels: static shared memory per block */
  int32_t dynamic_shared_bytes;  /**< kernels: dynamic shared memory per block */
  int32_t src_kind;              /**< copies: source memory kind (nsys numbering) */
  int32_t dst_kind;              /**< copies: destination memory kind (nsys numbering) */
  int32_t mem_kind;              /**< memsets: memory kind (nsys numbering) */
  uint32_t value;                /**< memsets: the value written */
  int32_t sync_type;             /**< syncs: nsys ENUM_CUPTI_SYNC_TYPE (1 event, 2 stream wait
                                      event, 3 stream, 4 context) */
  uint32_t event_id;             /**< syncs: the CUDA event id, 0 if none */
  uint32_t thread_id;            /**< runtime calls and ranges: the calling host thread */
  int32_t return_value;          /**< runtime calls: the cudaError_t returned */
};

/** One activity. Times are nanoseconds on the run's clock (0 = run start). */
struct ferry_activity {
  enum ferry_activity_kind kind; /**< what this is */
  const char *name;      /**< op or range name ("matmul", "attention", "step", ...); borrowed for
                              the duration of the callback */
  int32_t queue;         /**< executor queue (stream) id; -1 for ranges and samples */
  int64_t start_ns;      /**< start time */
  int64_t end_ns;        /**< end time (= start for samples) */
  uint64_t bytes;        /**< bytes moved (copies) or touched (kernels) */
  double flops;          /**< floating-point operations (kernels) */
  enum ferry_copy_kind copy_kind; /**< copies: direction */
  enum ferry_tier tier;  /**< memory samples: which tier */
  uint64_t used_bytes;   /**< memory samples: bytes in use */
  uint64_t correlation_id; /**< unique id of the op within the run */
  int32_t step;          /**< engine step the activity belongs to, or -1 */
  int32_t layer;         /**< layer, or -1 */
  int32_t expert;        /**< expert, or -1 */
  const char *kind_name; /**< kernels: the kernel kind ("matmul", "attention", ...), stored as
                              the timeline's shortName; NULL otherwise */
  const struct ferry_activity_cuda *cuda; /**< details from a CUDA trace (borrowed for the
                              duration of the callback); NULL from the host and sim executors */
};

/**
 * @brief Receives activity records. Called from executor threads: it must be thread-safe
 *        and fast (copy what it needs and return).
 * @param user the pointer given when the sink was installed.
 * @param act the record; borrowed for the duration of the call.
 */
typedef void (*ferry_activity_fn)(void *user, const struct ferry_activity *act);

/** @name Op tags
 * A 64-bit tag that names an op to a profiler which sees only the driver's calls (CUPTI's
 * external correlation ids): bits 0-31 the op's correlation id (low 32 bits), 32-43 its
 * layer + 1, 44-55 its expert + 1 (0: none, or beyond 4094), 56-63 its kernel kind + 1 (0: a
 * copy).
 * @{ */
/** @brief Pack an op tag. */
static inline uint64_t ferry_op_tag(uint64_t correlation_id, int32_t layer, int32_t expert, int32_t kernel_kind) {
  const uint64_t l = layer >= 0 && layer < 4095 ? (uint64_t)layer + 1 : 0;
  const uint64_t x = expert >= 0 && expert < 4095 ? (uint64_t)expert + 1 : 0;
  const uint64_t k = kernel_kind >= 0 && kernel_kind < 255 ? (uint64_t)kernel_kind + 1 : 0;
  return (correlation_id & 0xffffffffu) | l << 32 | x << 44 | k << 56;
}
/** @brief Unpack an op tag: layer and expert (-1 when none) and kernel kind (-1 for a copy). */
static inline void ferry_op_tag_split(uint64_t tag, int32_t *layer, int32_t *expert, int32_t *kernel_kind) {
  if (layer) *layer = (int32_t)((tag >> 32) & 0xfff) - 1;
  if (expert) *expert = (int32_t)((tag >> 44) & 0xfff) - 1;
  if (kernel_kind) *kernel_kind = (int32_t)(tag >> 56) - 1;
}
/** @} */

/** The GPU an executor drives (cuda) or simulates (sim), in the units of Nsight Systems'
 *  TARGET_INFO_GPU table. Numbers it does not know are 0, strings it does not know empty. */
struct ferry_device_info {
  char name[256];                       /**< e.g. "NVIDIA H100 PCIe" */
  char bus_location[32];                /**< PCI bus id, e.g. "0000:17:00.0" */
  char uuid[48];                        /**< "GPU-xxxxxxxx-..." */
  char chip_name[32];                   /**< e.g. "GH100" */
  int32_t is_discrete;                  /**< 1 for a discrete GPU */
  int32_t sm_count;                     /**< streaming multiprocessors */
  int32_t compute_major;                /**< compute capability, major */
  int32_t compute_minor;                /**< compute capability, minor */
  uint64_t total_memory_bytes;          /**< device memory */
  uint64_t memory_bandwidth_bytes_per_s; /**< device memory bandwidth */
  uint64_t l2_cache_bytes;              /**< L2 cache */
  uint64_t clock_rate_hz;               /**< SM clock */
};

#ifdef __cplusplus
}
#endif
#endif /* FERRY_ACTIVITY_H */
