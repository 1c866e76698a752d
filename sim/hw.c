/* Hardware profiles: the strict JSON reader (table-driven, so an unknown field, a wrong type
 * or a missing figure is reported with its file and field path), composition of catalogue
 * parts ("link": "pcie4-x16"), the catalogue search path and ferry_hw_require(). */
#include <dirent.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/units.h"
#include "common/names.h"
#include "ferry/hw.h"
#include "sim/hw_internal.h"

#ifndef FERRY_HW_SOURCE_DIR
#define FERRY_HW_SOURCE_DIR ""
#endif
#ifndef FERRY_HW_INSTALL_DIR
#define FERRY_HW_INSTALL_DIR ""
#endif

#define MAX_FILE_BYTES (1u << 20)
#define MAX_DEPTH 4 /* part -> base part -> ...: deep enough for real use, stops cycles */
#define PATH_MAX_LEN 128

/* ---- the field table ------------------------------------------------------------------------ */

enum ftype { T_STR, T_F64, T_I64, T_U64, T_I32 };
enum fcheck { C_NONE, C_POS, C_NONNEG, C_FRACTION, C_BOOL, C_SHARE, C_ELEM /* 2 or 4 bytes */,
              C_CC /* a CUDA compute capability ferry_hw_gpu_residency() knows */ };
enum section { S_GPU, S_LINK, S_HOST, S_DISK, S_COST, S_RUNTIME, S_IC, S_TOP, S_COUNT };

struct field {
  const char *path;
  enum ftype type;
  enum fcheck check;
  enum section sec;
  size_t off;
  size_t size; /* strings: buffer size */
};

#define P(member) offsetof(struct ferry_hw_profile, member)
#define S(member) P(member), sizeof(((struct ferry_hw_profile *)0)->member)
static const struct field fields[] = {
    {"gpu.name", T_STR, C_NONE, S_GPU, S(gpu.name)},
    {"gpu.memory_bytes", T_U64, C_POS, S_GPU, P(gpu.memory_bytes), 0},
    {"gpu.mem_bw_gbps", T_F64, C_POS, S_GPU, P(gpu.mem_bw_gbps), 0},
    {"gpu.peak_tflops.fp32", T_F64, C_POS, S_GPU, P(gpu.peak_tflops.fp32), 0},
    {"gpu.peak_tflops.fp16", T_F64, C_POS, S_GPU, P(gpu.peak_tflops.fp16), 0},
    {"gpu.peak_tflops.bf16", T_F64, C_POS, S_GPU, P(gpu.peak_tflops.bf16), 0},
    {"gpu.peak_tflops.int8", T_F64, C_POS, S_GPU, P(gpu.peak_tflops.int8), 0},
    {"gpu.peak_tflops.fp8", T_F64, C_POS, S_GPU, P(gpu.peak_tflops.fp8), 0},
    {"gpu.launch_overhead_ns", T_I64, C_NONNEG, S_GPU, P(gpu.launch_overhead_ns), 0},
    {"gpu.sm_count", T_I32, C_POS, S_GPU, P(gpu.sm_count), 0},
    {"gpu.clock_mhz", T_F64, C_POS, S_GPU, P(gpu.clock_mhz), 0},
    {"gpu.compute_capability", T_F64, C_CC, S_GPU, P(gpu.compute_capability), 0},
    {"gpu.efficiency.gemm", T_F64, C_FRACTION, S_GPU, P(gpu.efficiency.gemm), 0},
    {"gpu.efficiency.gemv", T_F64, C_FRACTION, S_GPU, P(gpu.efficiency.gemv), 0},
    {"gpu.efficiency.attention", T_F64, C_FRACTION, S_GPU, P(gpu.efficiency.attention), 0},
    {"gpu.efficiency.elementwise", T_F64, C_FRACTION, S_GPU, P(gpu.efficiency.elementwise), 0},
    {"gpu.efficiency.dequantize", T_F64, C_FRACTION, S_GPU, P(gpu.efficiency.dequantize), 0},
    {"link.name", T_STR, C_NONE, S_LINK, S(link.name)},
    {"link.h2d_gbps", T_F64, C_POS, S_LINK, P(link.h2d_gbps), 0},
    {"link.d2h_gbps", T_F64, C_POS, S_LINK, P(link.d2h_gbps), 0},
    {"link.pageable_h2d_gbps", T_F64, C_POS, S_LINK, P(link.pageable_h2d_gbps), 0},
    {"link.latency_ns", T_I64, C_NONNEG, S_LINK, P(link.latency_ns), 0},
    {"link.copy_engines", T_I32, C_NONNEG, S_LINK, P(link.copy_engines), 0},
    {"link.contention", T_F64, C_SHARE, S_LINK, P(link.contention), 0},
    {"host.name", T_STR, C_NONE, S_HOST, S(host.name)},
    {"host.dram_gbps", T_F64, C_POS, S_HOST, P(host.dram_gbps), 0},
    {"host.cpu_gflops", T_F64, C_POS, S_HOST, P(host.cpu_gflops), 0},
    {"host.cores", T_I32, C_POS, S_HOST, P(host.cores), 0},
    {"host.sockets", T_I32, C_POS, S_HOST, P(host.sockets), 0},
    {"host.simd_bits", T_I32, C_POS, S_HOST, P(host.simd_bits), 0},
    {"host.core_gflops.fp32", T_F64, C_POS, S_HOST, P(host.core_gflops.fp32), 0},
    {"host.core_gflops.fp16", T_F64, C_POS, S_HOST, P(host.core_gflops.fp16), 0},
    {"host.core_gflops.bf16", T_F64, C_POS, S_HOST, P(host.core_gflops.bf16), 0},
    {"host.core_gflops.int8", T_F64, C_POS, S_HOST, P(host.core_gflops.int8), 0},
    {"host.core_gflops.amx_bf16", T_F64, C_POS, S_HOST, P(host.core_gflops.amx_bf16), 0},
    {"host.core_gflops.amx_int8", T_F64, C_POS, S_HOST, P(host.core_gflops.amx_int8), 0},
    {"host.cpu_op_ns", T_I64, C_NONNEG, S_HOST, P(host.cpu_op_ns), 0},
    {"host.memory_bytes", T_U64, C_POS, S_HOST, P(host.memory_bytes), 0},
    {"host.submit_ns", T_I64, C_NONNEG, S_HOST, P(host.submit_ns), 0},
    {"host.sync_ns", T_I64, C_NONNEG, S_HOST, P(host.sync_ns), 0},
    {"host.queue_wake_ns", T_I64, C_NONNEG, S_HOST, P(host.queue_wake_ns), 0},
    {"host.event_wake_ns", T_I64, C_NONNEG, S_HOST, P(host.event_wake_ns), 0},
    {"host.staged_h2d_gbps", T_F64, C_POS, S_HOST, P(host.staged_h2d_gbps), 0},
    {"disk.name", T_STR, C_NONE, S_DISK, S(disk.name)},
    {"disk.read_gbps", T_F64, C_POS, S_DISK, P(disk.read_gbps), 0},
    {"disk.latency_ns", T_I64, C_NONNEG, S_DISK, P(disk.latency_ns), 0},
    {"disk.queue_depth", T_I32, C_POS, S_DISK, P(disk.queue_depth), 0},
    {"disk.read_ahead_bytes", T_I64, C_POS, S_DISK, P(disk.read_ahead_bytes), 0},
    {"disk.write_gbps", T_F64, C_POS, S_DISK, P(disk.write_gbps), 0},
    {"runtime.name", T_STR, C_NONE, S_RUNTIME, S(runtime.name)},
    {"runtime.launch_ns", T_I64, C_NONNEG, S_RUNTIME, P(runtime.launch_ns), 0},
    {"runtime.prefill_launch_ns", T_I64, C_NONNEG, S_RUNTIME, P(runtime.prefill_launch_ns), 0},
    {"runtime.copy_ns", T_I64, C_NONNEG, S_RUNTIME, P(runtime.copy_ns), 0},
    {"runtime.layer_ns", T_I64, C_NONNEG, S_RUNTIME, P(runtime.layer_ns), 0},
    {"runtime.prefill_layer_ns", T_I64, C_NONNEG, S_RUNTIME, P(runtime.prefill_layer_ns), 0},
    {"runtime.step_ns", T_I64, C_NONNEG, S_RUNTIME, P(runtime.step_ns), 0},
    {"runtime.row_ns", T_I64, C_NONNEG, S_RUNTIME, P(runtime.row_ns), 0},
    {"runtime.worker_step_ns", T_I64, C_NONNEG, S_RUNTIME, P(runtime.worker_step_ns), 0},
    {"runtime.fused_dequant", T_I32, C_BOOL, S_RUNTIME, P(runtime.fused_dequant), 0},
    {"runtime.fused_max_rows", T_I64, C_NONNEG, S_RUNTIME, P(runtime.fused_max_rows), 0},
    {"runtime.sync_fetch", T_I32, C_BOOL, S_RUNTIME, P(runtime.sync_fetch), 0},
    {"runtime.model_syncs", T_I32, C_BOOL, S_RUNTIME, P(runtime.model_syncs), 0},
    {"runtime.numa_blind", T_I32, C_BOOL, S_RUNTIME, P(runtime.numa_blind), 0},
    {"runtime.numa_first_threads", T_I32, C_NONNEG, S_RUNTIME, P(runtime.numa_first_threads), 0},
    {"runtime.cpu_math_eff", T_F64, C_FRACTION, S_RUNTIME, P(runtime.cpu_math_eff), 0},
    {"runtime.cpu_quant_simd_bits", T_I32, C_NONNEG, S_RUNTIME, P(runtime.cpu_quant_simd_bits), 0},
    {"runtime.cpu_amx", T_I32, C_BOOL, S_RUNTIME, P(runtime.cpu_amx), 0},
    {"runtime.cpu_amx_min_rows", T_I32, C_NONNEG, S_RUNTIME, P(runtime.cpu_amx_min_rows), 0},
    {"runtime.cpu_amx_eff_bf16", T_F64, C_FRACTION, S_RUNTIME, P(runtime.cpu_amx_eff_bf16), 0},
    {"runtime.cpu_amx_eff_int8", T_F64, C_FRACTION, S_RUNTIME, P(runtime.cpu_amx_eff_int8), 0},
    {"runtime.attn_repeat_kv", T_I32, C_BOOL, S_RUNTIME, P(runtime.attn_repeat_kv), 0},
    {"runtime.attn_fa2_kvcache", T_I32, C_BOOL, S_RUNTIME, P(runtime.attn_fa2_kvcache), 0},
    {"runtime.gather_copy", T_I32, C_BOOL, S_RUNTIME, P(runtime.gather_copy), 0},
    {"runtime.split_copy", T_I32, C_BOOL, S_RUNTIME, P(runtime.split_copy), 0},
    {"runtime.read_after_copy", T_I32, C_BOOL, S_RUNTIME, P(runtime.read_after_copy), 0},
    {"runtime.blocking_copy", T_I32, C_BOOL, S_RUNTIME, P(runtime.blocking_copy), 0},
    {"runtime.moe_row_copy", T_I32, C_BOOL, S_RUNTIME, P(runtime.moe_row_copy), 0},
    {"runtime.act_bytes", T_I32, C_ELEM, S_RUNTIME, P(runtime.act_bytes), 0},
    {"runtime.dequant_bytes", T_I32, C_ELEM, S_RUNTIME, P(runtime.dequant_bytes), 0},
    {"runtime.dequant_pass_bytes", T_F64, C_NONNEG, S_RUNTIME, P(runtime.dequant_pass_bytes), 0},
    {"runtime.dequant_kernels", T_I32, C_NONNEG, S_RUNTIME, P(runtime.dequant_kernels), 0},
    {"runtime.kv_expand", T_I32, C_BOOL, S_RUNTIME, P(runtime.kv_expand), 0},
    {"runtime.kv_full_window", T_I32, C_BOOL, S_RUNTIME, P(runtime.kv_full_window), 0},
    {"runtime.kv_quant_bytes", T_F64, C_NONNEG, S_RUNTIME, P(runtime.kv_quant_bytes), 0},
    {"runtime.kv_quant_kernels", T_I32, C_NONNEG, S_RUNTIME, P(runtime.kv_quant_kernels), 0},
    {"runtime.cpu_kv_upcast", T_I32, C_BOOL, S_RUNTIME, P(runtime.cpu_kv_upcast), 0},
    {"runtime.cpu_fresh_alloc", T_I32, C_BOOL, S_RUNTIME, P(runtime.cpu_fresh_alloc), 0},
    {"runtime.read_threads", T_I32, C_NONNEG, S_RUNTIME, P(runtime.read_threads), 0},
    {"runtime.read_depth", T_I32, C_NONNEG, S_RUNTIME, P(runtime.read_depth), 0},
    {"runtime.read_request_bytes", T_I64, C_NONNEG, S_RUNTIME, P(runtime.read_request_bytes), 0},
    {"runtime.offload_min_rows", T_I64, C_NONNEG, S_RUNTIME, P(runtime.offload_min_rows), 0},
    {"interconnect.name", T_STR, C_NONE, S_IC, S(interconnect.name)},
    {"interconnect.gpus", T_I32, C_POS, S_IC, P(interconnect.gpus), 0},
    {"interconnect.gpu_gbps", T_F64, C_POS, S_IC, P(interconnect.gpu_gbps), 0},
    {"interconnect.latency_ns", T_I64, C_NONNEG, S_IC, P(interconnect.latency_ns), 0},
    {"interconnect.switched", T_I32, C_BOOL, S_IC, P(interconnect.switched), 0},
    {"interconnect.nvlink", T_I32, C_BOOL, S_IC, P(interconnect.nvlink), 0},
    {"price_per_hour_usd", T_F64, C_NONNEG, S_TOP, P(price_per_hour_usd), 0},
#define COST(i, kind)                                                                           \
  {"cost." kind ".overhead_ns", T_F64, C_NONNEG, S_COST, P(cost[i].overhead_ns), 0},            \
      {"cost." kind ".ns_per_byte", T_F64, C_NONNEG, S_COST, P(cost[i].ns_per_byte), 0},        \
      {"cost." kind ".ns_per_flop", T_F64, C_NONNEG, S_COST, P(cost[i].ns_per_flop), 0},           \
      {"cost." kind ".roofline", T_I32, C_NONNEG, S_COST, P(cost[i].roofline), 0},                \
      {"cost." kind ".r2", T_F64, C_NONE, S_COST, P(cost[i].r2), 0}
    COST(0, "matmul"), COST(1, "attention"), COST(2, "expert"), COST(3, "norm"), COST(4, "rope"),
    COST(5, "activation"), COST(6, "router"), COST(7, "moe_combine"), COST(8, "gather_rows"), COST(9, "embed"),
    COST(10, "dequantize"), COST(11, "matmul_gemm"), COST(12, "expert_gemm"),
#undef COST
};
#define N_FIELDS (sizeof fields / sizeof fields[0])
#define MASK_WORDS ((N_FIELDS + 63) / 64) /* bit per field: the table may grow */
#define BIT(m, i) ((m)[(i) >> 6] >> ((i)&63) & 1)
#define SETBIT(m, i) ((m)[(i) >> 6] |= 1ull << ((i)&63))
#undef S
#undef P

static const char *const section_names[S_COUNT] = {"gpu", "link", "host", "disk", "cost", "runtime", "interconnect", ""};
static const char *const cost_kinds[FERRY_HW_COST_KINDS] = {"matmul", "attention", "expert", "norm",
                                                           "rope", "activation", "router", "moe_combine",
                                                           "gather_rows", "embed", "dequantize", "matmul_gemm",
                                                           "expert_gemm"};

const char *ferry_hw_cost_kind_name(int i) { return i >= 0 && i < FERRY_HW_COST_KINDS ? cost_kinds[i] : NULL; }

const struct ferry_hw_cost *ferry_hw_cost_of_regime(const struct ferry_hw_profile *p, const char *kind_name, int gemm) {
  if (gemm && kind_name) {
    char name[32];
    snprintf(name, sizeof name, "%s_gemm", kind_name);
    const struct ferry_hw_cost *c = ferry_hw_cost_of(p, name);
    if (c) return c;
  }
  return ferry_hw_cost_of(p, kind_name);
}

const struct ferry_hw_cost *ferry_hw_cost_of(const struct ferry_hw_profile *p, const char *kind_name) {
  if (!p || !kind_name || !p->has_cost) return NULL;
  for (int i = 0; i < FERRY_HW_COST_KINDS; i++)
    if (!strcmp(kind_name, cost_kinds[i])) return (p->cost_set >> i & 1) ? &p->cost[i] : NULL;
  return NULL;
}

/* Defaults (documented in hw/README.md): not measurements, just reasonable starting points
 * for an uncalibrated profile. */
static const struct {
  const char *path;
  double value;
} defaults[] = {
    {"gpu.launch_overhead_ns", 5000},   {"gpu.efficiency.gemm", 0.7},
    {"gpu.efficiency.gemv", 0.8},       {"gpu.efficiency.attention", 0.5},
    {"gpu.efficiency.elementwise", 0.8}, {"gpu.efficiency.dequantize", 0.6},
    {"disk.queue_depth", 1},            {"host.cpu_op_ns", FERRY_HW_CPU_OP_NS},
    {"disk.read_ahead_bytes", FERRY_HW_READ_AHEAD_BYTES},
};

static int field_index(const char *path) {
  for (size_t i = 0; i < N_FIELDS; i++)
    if (!strcmp(fields[i].path, path)) return (int)i;
  return -1;
}

/* Whether path names an object that holds fields (e.g. "gpu.peak_tflops"). */
static int is_object_path(const char *path) {
  size_t n = strlen(path);
  for (size_t i = 0; i < N_FIELDS; i++)
    if (!strncmp(fields[i].path, path, n) && fields[i].path[n] == '.') return 1;
  return 0;
}

static double field_number(const struct ferry_hw_profile *p, const struct field *f) {
  const char *base = (const char *)p + f->off;
  switch (f->type) {
  case T_F64: return *(const double *)(const void *)base;
  case T_I64: return (double)*(const int64_t *)(const void *)base;
  case T_U64: return (double)*(const uint64_t *)(const void *)base;
  case T_I32: return (double)*(const int32_t *)(const void *)base;
  default: return 0;
  }
}

static void field_set_number(struct ferry_hw_profile *p, const struct field *f, double v) {
  char *base = (char *)p + f->off;
  switch (f->type) {
  case T_F64: *(double *)(void *)base = v; break;
  case T_I64: *(int64_t *)(void *)base = (int64_t)v; break;
  case T_U64: *(uint64_t *)(void *)base = (uint64_t)v; break;
  case T_I32: *(int32_t *)(void *)base = (int32_t)v; break;
  default: break;
  }
}

/* ---- growable lists of sources and fitted names ---------------------------------------------- */

struct srclist {
  struct ferry_hw_source *v;
  size_t n, cap;
};

struct strlist {
  char **v;
  size_t n, cap;
};

static int srclist_push(struct srclist *l, const struct ferry_hw_source *s) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 16;
    struct ferry_hw_source *v = ferry__reallocarray(l->v, cap, sizeof *v);
    if (!v) return -1;
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n++] = *s;
  return 0;
}

static int strlist_push(struct strlist *l, const char *s) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 8;
    char **v = ferry__reallocarray(l->v, cap, sizeof *v);
    if (!v) return -1;
    l->v = v;
    l->cap = cap;
  }
  char *d = ferry__strdup(s);
  if (!d) return -1;
  l->v[l->n++] = d;
  return 0;
}

static void strlist_free(struct strlist *l) {
  for (size_t i = 0; i < l->n; i++) ferry_free(l->v[i]);
  ferry_free(l->v);
  memset(l, 0, sizeof *l);
}

/* ---- one file being read ------------------------------------------------------------------- */

struct builder {
  struct ferry_hw_profile p;
  uint64_t set[MASK_WORDS]; /* bit per field: has a value (from this file or a part) */
  uint64_t own[MASK_WORDS]; /* bit per field: given in this file itself */
  struct srclist inherited, mine;
  struct strlist fit_inherited, fit_mine;
  const char *what;    /* the file, for messages */
  char *dir;           /* its folder, searched first for parts */
  int depth;
};

static void builder_free(struct builder *b) {
  ferry_free(b->inherited.v);
  ferry_free(b->mine.v);
  strlist_free(&b->fit_inherited);
  strlist_free(&b->fit_mine);
  ferry_free(b->dir);
}

static ferry_status nomem(const char *what) {
  return ferry__fail(FERRY_ERR_NOMEM, "%s: out of memory reading the hardware profile", what);
}

static ferry_status load_file(struct builder *b, const char *path, int depth);
static ferry_status find_profile(const char *name, const char *first_dir, char **out_path);

static int *section_flag(struct ferry_hw_profile *p, enum section s) {
  switch (s) {
  case S_GPU: return &p->has_gpu;
  case S_LINK: return &p->has_link;
  case S_HOST: return &p->has_host;
  case S_DISK: return &p->has_disk;
  case S_COST: return &p->has_cost;
  case S_RUNTIME: return &p->has_runtime;
  case S_IC: return &p->has_interconnect;
  default: return NULL;
  }
}

static int section_present(const struct ferry_hw_profile *p, enum section s) {
  switch (s) {
  case S_GPU: return p->has_gpu;
  case S_LINK: return p->has_link;
  case S_HOST: return p->has_host;
  case S_DISK: return p->has_disk;
  case S_COST: return p->has_cost;
  case S_RUNTIME: return p->has_runtime;
  case S_IC: return p->has_interconnect;
  default: return 1;
  }
}

static int in_section(const char *path, enum section s) {
  size_t n = strlen(section_names[s]);
  return !strncmp(path, section_names[s], n) && path[n] == '.';
}

static void copy_section(struct ferry_hw_profile *dst, const struct ferry_hw_profile *src, enum section s) {
  switch (s) {
  case S_GPU: dst->gpu = src->gpu; break;
  case S_LINK: dst->link = src->link; break;
  case S_HOST: dst->host = src->host; break;
  case S_DISK: dst->disk = src->disk; break;
  case S_COST:
    memcpy(dst->cost, src->cost, sizeof dst->cost);
    dst->cost_set = src->cost_set;
    break;
  case S_RUNTIME: dst->runtime = src->runtime; break;
  case S_IC: dst->interconnect = src->interconnect; break;
  default: break;
  }
}

/* Take section s (values, presence, sources and fitted names) from catalogue part `name`. */
static ferry_status inherit_part(struct builder *b, enum section s, const char *name) {
  const char *sec = section_names[s];
  if (b->depth >= MAX_DEPTH)
    return ferry__fail(FERRY_ERR_FORMAT, "%s: %s: part \"%s\" nests more than %d levels deep (a cycle?)", b->what,
                       sec, name, MAX_DEPTH);
  char *path = NULL;
  ferry_status st = find_profile(name, b->dir, &path);
  if (st != FERRY_OK) {
    if (st == FERRY_ERR_NOT_FOUND) {
      char why[FERRY_ERRMSG_MAX];
      snprintf(why, sizeof why, "%s", ferry_last_error());
      ferry__fail(st, "%s: %s refers to part \"%s\": %s", b->what, sec, name, why);
    }
    return st;
  }
  struct builder part;
  memset(&part, 0, sizeof part);
  st = load_file(&part, path, b->depth + 1);
  if (st != FERRY_OK) goto out_free_part;
  if (!*section_flag(&part.p, s)) {
    st = ferry__fail(FERRY_ERR_FORMAT, "%s: %s refers to \"%s\" (%s), which has no %s section", b->what, sec, name,
                     path, sec);
    goto out_free_part;
  }
  copy_section(&b->p, &part.p, s);
  *section_flag(&b->p, s) = 1;
  for (size_t i = 0; i < N_FIELDS; i++)
    if (fields[i].sec == s && BIT(part.set, i)) SETBIT(b->set, i);
  const struct srclist *lists[2] = {&part.inherited, &part.mine};
  for (int k = 0; k < 2; k++)
    for (size_t i = 0; i < lists[k]->n; i++)
      if (in_section(lists[k]->v[i].figure, s) && srclist_push(&b->inherited, &lists[k]->v[i])) goto out_nomem;
  const struct strlist *fl[2] = {&part.fit_inherited, &part.fit_mine};
  for (int k = 0; k < 2; k++)
    for (size_t i = 0; i < fl[k]->n; i++)
      if (in_section(fl[k]->v[i], s) && strlist_push(&b->fit_inherited, fl[k]->v[i])) goto out_nomem;
  st = FERRY_OK;
  goto out_free_part;
out_nomem:
  st = nomem(b->what);
out_free_part:
  builder_free(&part);
  ferry_free(path);
  return st;
}

static ferry_status set_string(char *dst, size_t size, const cJSON *item, const char *what, const char *path) {
  if (!cJSON_IsString(item)) return ferry__fail(FERRY_ERR_FORMAT, "%s: %s must be a string", what, path);
  size_t n = strlen(item->valuestring);
  if (n >= size)
    return ferry__fail(FERRY_ERR_FORMAT, "%s: %s must be at most %zu characters (has %zu)", what, path, size - 1, n);
  memcpy(dst, item->valuestring, n + 1);
  return FERRY_OK;
}

/* The range an integer field holds: below 2^31 (int32), 2^53 (the rest: exact in a double);
 * unsigned ones from 0. */
static void int_bounds(const struct field *f, double *min, double *max) {
  *max = f->type == T_I32 ? 2147483647.0 : 9007199254740992.0;
  *min = f->type == T_U64 ? 0 : -*max;
}

static void known_capabilities(char *buf, size_t size);

/* Whether v is a value field f may hold (its check); the message names `what` and the field. */
static ferry_status check_number(const struct field *f, double v, const char *what) {
  if (f->check == C_POS && !(v > 0))
    return ferry__fail(FERRY_ERR_FORMAT, "%s: %s must be positive (got %g)", what, f->path, v);
  if (f->check == C_NONNEG && !(v >= 0))
    return ferry__fail(FERRY_ERR_FORMAT, "%s: %s must be >= 0 (got %g)", what, f->path, v);
  if (f->check == C_BOOL && v != 0 && v != 1)
    return ferry__fail(FERRY_ERR_FORMAT, "%s: %s must be 0 or 1 (got %g)", what, f->path, v);
  if (f->check == C_FRACTION && !(v > 0 && v <= 1))
    return ferry__fail(FERRY_ERR_FORMAT, "%s: %s must be in (0, 1] (got %g)", what, f->path, v);
  if (f->check == C_SHARE && !(v >= 0 && v < 1))
    return ferry__fail(FERRY_ERR_FORMAT, "%s: %s must be in [0, 1) (got %g)", what, f->path, v);
  if (f->check == C_ELEM && v != 2 && v != 4)
    return ferry__fail(FERRY_ERR_FORMAT, "%s: %s must be 2 (fp16/bf16) or 4 (fp32) (got %g)", what, f->path, v);
  if (f->check == C_CC && ferry_hw_gpu_residency(v, NULL, NULL) != 0) {
    char known[96];
    known_capabilities(known, sizeof known);
    return ferry__fail(FERRY_ERR_FORMAT, "%s: %s must be a CUDA compute capability ferry knows: %s (got %g)", what,
                       f->path, known, v);
  }
  return FERRY_OK;
}

/* One leaf field. */
static ferry_status parse_field(struct builder *b, int idx, const cJSON *item) {
  const struct field *f = &fields[idx];
  const char *what = b->what;
  if (BIT(b->own, idx)) return ferry__fail(FERRY_ERR_FORMAT, "%s: %s is given twice", what, f->path);
  if (f->type == T_STR) {
    ferry_status st = set_string((char *)&b->p + f->off, f->size, item, what, f->path);
    if (st != FERRY_OK) return st;
  } else {
    double v;
    if (f->type == T_F64) {
      if (!cJSON_IsNumber(item) || !isfinite(item->valuedouble))
        return ferry__fail(FERRY_ERR_FORMAT, "%s: %s must be a number", what, f->path);
    } else {
      double min, max;
      int_bounds(f, &min, &max);
      if (!ferry__json_is_int(item, min, max))
        return ferry__fail(FERRY_ERR_FORMAT, "%s: %s must be an integer%s", what, f->path,
                           f->type == T_I32 ? " below 2^31" : "");
    }
    v = item->valuedouble;
    ferry_status st = check_number(f, v, what);
    if (st != FERRY_OK) return st;
    field_set_number(&b->p, f, v);
  }
  SETBIT(b->own, idx);
  SETBIT(b->set, idx);
  return FERRY_OK;
}

/* The members of an object at `prefix` ("gpu", "gpu.peak_tflops"). */
static ferry_status parse_object(struct builder *b, const char *prefix, const cJSON *obj) {
  const cJSON *item;
  cJSON_ArrayForEach(item, obj) {
    if (!strchr(prefix, '.') && !strcmp(item->string, "base")) continue; /* see parse_section */
    char path[PATH_MAX_LEN];
    int n = snprintf(path, sizeof path, "%s.%s", prefix, item->string);
    int idx = n > 0 && (size_t)n < sizeof path ? field_index(path) : -1;
    if (idx >= 0) {
      ferry_status st = parse_field(b, idx, item);
      if (st != FERRY_OK) return st;
    } else if (n > 0 && (size_t)n < sizeof path && is_object_path(path)) {
      if (!cJSON_IsObject(item)) return ferry__fail(FERRY_ERR_FORMAT, "%s: %s must be an object", b->what, path);
      ferry_status st = parse_object(b, path, item);
      if (st != FERRY_OK) return st;
    } else {
      return ferry__fail(FERRY_ERR_FORMAT, "%s: unknown field %s.%s", b->what, prefix, item->string);
    }
  }
  return FERRY_OK;
}

static ferry_status parse_section(struct builder *b, enum section s, const cJSON *item) {
  const char *sec = section_names[s];
  if (*section_flag(&b->p, s)) return ferry__fail(FERRY_ERR_FORMAT, "%s: %s is given twice", b->what, sec);
  if (cJSON_IsString(item)) return inherit_part(b, s, item->valuestring);
  if (!cJSON_IsObject(item))
    return ferry__fail(FERRY_ERR_FORMAT, "%s: %s must be an object or the name of a catalogue part", b->what, sec);
  const cJSON *base = cJSON_GetObjectItemCaseSensitive(item, "base");
  if (base) {
    if (!cJSON_IsString(base))
      return ferry__fail(FERRY_ERR_FORMAT, "%s: %s.base must be a string (a catalogue part name)", b->what, sec);
    ferry_status st = inherit_part(b, s, base->valuestring);
    if (st != FERRY_OK) return st;
  }
  *section_flag(&b->p, s) = 1;
  return parse_object(b, sec, item);
}

static int known_figure(const char *figure) { return field_index(figure) >= 0; }

static ferry_status parse_sources(struct builder *b, const cJSON *arr) {
  if (!cJSON_IsArray(arr)) return ferry__fail(FERRY_ERR_FORMAT, "%s: sources must be an array", b->what);
  int i = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, arr) {
    if (!cJSON_IsObject(e)) return ferry__fail(FERRY_ERR_FORMAT, "%s: sources[%d] must be an object", b->what, i);
    struct ferry_hw_source src;
    memset(&src, 0, sizeof src);
    static const char *const keys[4] = {"figure", "value", "source", "date"};
    const cJSON *m;
    cJSON_ArrayForEach(m, e) {
      int k = 0;
      while (k < 4 && strcmp(m->string, keys[k])) k++;
      if (k == 4) return ferry__fail(FERRY_ERR_FORMAT, "%s: unknown field sources[%d].%s", b->what, i, m->string);
    }
    for (int k = 0; k < 4; k++) {
      char path[64];
      snprintf(path, sizeof path, "sources[%d].%s", i, keys[k]);
      m = cJSON_GetObjectItemCaseSensitive(e, keys[k]);
      if (!m) return ferry__fail(FERRY_ERR_FORMAT, "%s: missing required field %s", b->what, path);
      char *dst = k == 0 ? src.figure : k == 1 ? src.value : k == 2 ? src.source : src.date;
      size_t size = k == 0 ? sizeof src.figure : k == 1 ? sizeof src.value : k == 2 ? sizeof src.source : sizeof src.date;
      if (k == 1 && cJSON_IsNumber(m)) {
        if (!isfinite(m->valuedouble))
          return ferry__fail(FERRY_ERR_FORMAT, "%s: %s must be a string or a number", b->what, path);
        snprintf(dst, size, "%.15g", m->valuedouble);
        continue;
      }
      if (k == 1 && !cJSON_IsString(m))
        return ferry__fail(FERRY_ERR_FORMAT, "%s: %s must be a string or a number", b->what, path);
      ferry_status st = set_string(dst, size, m, b->what, path);
      if (st != FERRY_OK) return st;
    }
    if (!known_figure(src.figure))
      return ferry__fail(FERRY_ERR_FORMAT, "%s: sources[%d].figure \"%s\" is not a field of the profile", b->what, i,
                         src.figure);
    if (srclist_push(&b->mine, &src)) return nomem(b->what);
    i++;
  }
  return FERRY_OK;
}

static ferry_status parse_fitted(struct builder *b, const cJSON *arr) {
  if (!cJSON_IsArray(arr)) return ferry__fail(FERRY_ERR_FORMAT, "%s: fitted must be an array of field paths", b->what);
  int i = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, arr) {
    if (!cJSON_IsString(e)) return ferry__fail(FERRY_ERR_FORMAT, "%s: fitted[%d] must be a string", b->what, i);
    if (!known_figure(e->valuestring))
      return ferry__fail(FERRY_ERR_FORMAT, "%s: fitted[%d] \"%s\" is not a field of the profile", b->what, i,
                         e->valuestring);
    if (strlist_push(&b->fit_mine, e->valuestring)) return nomem(b->what);
    i++;
  }
  return FERRY_OK;
}

/* After the whole file: kind/section agreement, numeric sources agree with the values, and
 * inherited sources of overridden fields are dropped. */
static ferry_status finish_file(struct builder *b) {
  static const enum section kind_section[] = {S_GPU, S_HOST, S_LINK, S_DISK, S_RUNTIME};
  enum section need = kind_section[b->p.kind];
  if (!*section_flag(&b->p, need))
    return ferry__fail(FERRY_ERR_FORMAT, "%s: kind \"%s\" needs a \"%s\" section", b->what,
                       ferry_hw_kind_name(b->p.kind), section_names[need]);
  /* a multi-GPU machine says how many GPUs it has: everything priced per machine rests on it */
  if (b->p.has_interconnect && b->p.interconnect.gpus < 1)
    return ferry__fail(FERRY_ERR_FORMAT, "%s: interconnect.gpus is required (the GPUs the machine holds)", b->what);
  if (b->p.has_interconnect && !b->p.has_gpu)
    return ferry__fail(FERRY_ERR_FORMAT, "%s: an interconnect section needs a gpu section (the GPUs it joins)", b->what);
  /* a fitted mark, as a source, belongs to a figure the profile has: the file written back with
   * a source for each fitted figure must read back */
  for (size_t i = 0; i < b->fit_mine.n; i++) {
    const struct field *f = &fields[field_index(b->fit_mine.v[i])];
    if (f->sec != S_TOP && !*section_flag(&b->p, f->sec))
      return ferry__fail(FERRY_ERR_FORMAT, "%s: fitted[%zu] names %s but the profile has no %s section", b->what, i,
                         b->fit_mine.v[i], section_names[f->sec]);
  }
  for (size_t i = 0; i < b->mine.n; i++) {
    const struct ferry_hw_source *s = &b->mine.v[i];
    int idx = field_index(s->figure);
    const struct field *f = &fields[idx];
    if (f->sec != S_TOP && !*section_flag(&b->p, f->sec))
      return ferry__fail(FERRY_ERR_FORMAT, "%s: sources[%zu] documents %s but the profile has no %s section", b->what,
                         i, s->figure, section_names[f->sec]);
    char *end;
    double v = strtod(s->value, &end);
    if (f->type != T_STR && end != s->value && *end == '\0') {
      double actual = field_number(&b->p, f);
      if (fabs(v - actual) > 1e-9 * fabs(actual))
        return ferry__fail(FERRY_ERR_FORMAT, "%s: sources[%zu].value %s does not match %s = %.15g", b->what, i,
                           s->value, s->figure, actual);
    }
  }
  /* a field this file sets itself is documented by this file, not by the part it came from */
  size_t k = 0;
  for (size_t i = 0; i < b->inherited.n; i++) {
    int idx = field_index(b->inherited.v[i].figure);
    if (idx >= 0 && BIT(b->own, idx)) continue;
    b->inherited.v[k++] = b->inherited.v[i];
  }
  b->inherited.n = k;
  k = 0;
  for (size_t i = 0; i < b->fit_inherited.n; i++) {
    int idx = field_index(b->fit_inherited.v[i]);
    if (idx >= 0 && BIT(b->own, idx)) {
      ferry_free(b->fit_inherited.v[i]);
      continue;
    }
    b->fit_inherited.v[k++] = b->fit_inherited.v[i];
  }
  b->fit_inherited.n = k;
  for (int i = 0; i < FERRY_HW_COST_KINDS; i++) {
    char path[PATH_MAX_LEN];
    static const char *const parts[] = {"overhead_ns", "ns_per_byte", "ns_per_flop"};
    for (int j = 0; j < 3; j++) {
      snprintf(path, sizeof path, "cost.%s.%s", cost_kinds[i], parts[j]);
      int idx = field_index(path);
      if (idx >= 0 && BIT(b->set, idx)) b->p.cost_set |= 1u << i;
    }
  }
  return FERRY_OK;
}

static ferry_status load_file(struct builder *b, const char *path, int depth) {
  b->what = path;
  b->depth = depth;
  const char *slash = strrchr(path, '/');
  b->dir = slash ? ferry__strndup(path, (size_t)(slash - path) + (slash == path)) : ferry__strdup(".");
  if (!b->dir) return nomem(path);
  cJSON *root = NULL;
  struct ferry_err err;
  ferry_status st = ferry__json_load(path, MAX_FILE_BYTES, &root, &err);
  if (st != FERRY_OK) return st;
  if (!cJSON_IsObject(root)) {
    st = ferry__fail(FERRY_ERR_FORMAT, "%s: a hardware profile must be a JSON object", path);
    goto out_delete;
  }
  int have_name = 0, have_kind = 0, have_sources = 0, have_fitted = 0;
  const cJSON *item;
  cJSON_ArrayForEach(item, root) {
    const char *key = item->string;
    st = FERRY_OK;
    if (!strcmp(key, "name")) {
      if (have_name++) st = ferry__fail(FERRY_ERR_FORMAT, "%s: name is given twice", path);
      else st = set_string(b->p.name, sizeof b->p.name, item, path, "name");
    } else if (!strcmp(key, "kind")) {
      if (have_kind++) {
        st = ferry__fail(FERRY_ERR_FORMAT, "%s: kind is given twice", path);
      } else if (!cJSON_IsString(item)) {
        st = ferry__fail(FERRY_ERR_FORMAT, "%s: kind must be a string", path);
      } else {
        int k = 0;
        while (k < 5 && strcmp(item->valuestring, ferry_hw_kind_name((enum ferry_hw_kind)k))) k++;
        if (k == 5)
          st = ferry__fail(FERRY_ERR_FORMAT,
                           "%s: kind must be \"gpu\", \"host\", \"link\", \"disk\" or \"runtime\" (got \"%s\")", path,
                           item->valuestring);
        b->p.kind = (enum ferry_hw_kind)k;
      }
    } else if (!strcmp(key, "gpu")) {
      st = parse_section(b, S_GPU, item);
    } else if (!strcmp(key, "link")) {
      st = parse_section(b, S_LINK, item);
    } else if (!strcmp(key, "host")) {
      st = parse_section(b, S_HOST, item);
    } else if (!strcmp(key, "disk")) {
      st = parse_section(b, S_DISK, item);
    } else if (!strcmp(key, "cost")) {
      st = parse_section(b, S_COST, item);
    } else if (!strcmp(key, "runtime")) {
      st = parse_section(b, S_RUNTIME, item);
    } else if (!strcmp(key, "interconnect")) {
      st = parse_section(b, S_IC, item);
    } else if (!strcmp(key, "price_per_hour_usd")) {
      st = parse_field(b, field_index("price_per_hour_usd"), item);
    } else if (!strcmp(key, "sources")) {
      st = have_sources++ ? ferry__fail(FERRY_ERR_FORMAT, "%s: sources is given twice", path) : parse_sources(b, item);
    } else if (!strcmp(key, "fitted")) {
      st = have_fitted++ ? ferry__fail(FERRY_ERR_FORMAT, "%s: fitted is given twice", path) : parse_fitted(b, item);
    } else {
      st = ferry__fail(FERRY_ERR_FORMAT, "%s: unknown field %s", path, key);
    }
    if (st != FERRY_OK) goto out_delete;
  }
  if (!have_name) {
    st = ferry__fail(FERRY_ERR_FORMAT, "%s: missing required field name", path);
    goto out_delete;
  }
  if (!have_kind) {
    st = ferry__fail(FERRY_ERR_FORMAT, "%s: missing required field kind (\"gpu\", \"host\", \"link\", \"disk\" or \"runtime\")",
                     path);
    goto out_delete;
  }
  st = finish_file(b);
out_delete:
  cJSON_Delete(root);
  return st;
}

/* ---- writing and comparing figures (sim/hw_internal.h) ----------------------------------------- */

/* The cost kind (index into cost[]) a cost field belongs to. */
static int cost_kind_of(const struct field *f) {
  return (int)((f->off - offsetof(struct ferry_hw_profile, cost)) / sizeof(struct ferry_hw_cost));
}

/* Whether field f is part of what profile p says: its section is there and, for a cost figure, its
 * kind was fitted. */
static int field_in_profile(const struct ferry_hw_profile *p, const struct field *f) {
  if (!section_present(p, f->sec)) return 0;
  return f->sec != S_COST || (p->cost_set >> cost_kind_of(f) & 1);
}

/* Whether a 0 in field f must be written: absent, the reader would read another value (its
 * default) or drop the cost kind (a kind is fitted when one of its parts is given). A 0 the
 * reader refuses (a rate that must be positive) is never written. */
static int zero_is_given(const struct field *f) {
  if (f->check == C_POS || f->check == C_FRACTION || f->check == C_ELEM || f->check == C_CC) return 0;
  if (f->sec == S_COST) return 1;
  for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
    if (!strcmp(defaults[i].path, f->path)) return 1;
  return 0;
}

/* The object that holds path's last name ("gpu.peak_tflops" of "gpu.peak_tflops.fp32"), made on the
 * way down where missing; *leaf is that last name. NULL when out of memory. */
static cJSON *parent_object(cJSON *root, const char *path, const char **leaf) {
  cJSON *o = root;
  const char *name = path, *dot;
  while ((dot = strchr(name, '.')) != NULL) {
    char part[PATH_MAX_LEN];
    const size_t n = (size_t)(dot - name) < sizeof part ? (size_t)(dot - name) : sizeof part - 1;
    memcpy(part, name, n);
    part[n] = '\0';
    cJSON *child = cJSON_GetObjectItemCaseSensitive(o, part);
    if (!child && !(child = cJSON_AddObjectToObject(o, part))) return NULL;
    o = child;
    name = dot + 1;
  }
  *leaf = name;
  return o;
}

ferry_status ferry__hw_figures_to_json(cJSON *root, const struct ferry_hw_profile *p) {
  /* every section the profile has, even one without figures ("cost": {}) */
  for (int s = 0; s < S_TOP; s++)
    if (section_present(p, (enum section)s) && !cJSON_GetObjectItemCaseSensitive(root, section_names[s]) &&
        !cJSON_AddObjectToObject(root, section_names[s]))
      return ferry__fail(FERRY_ERR_NOMEM, "out of memory writing a hardware profile");
  for (size_t i = 0; i < N_FIELDS; i++) {
    const struct field *f = &fields[i];
    if (!field_in_profile(p, f)) continue;
    const double v = f->type == T_STR ? 0 : field_number(p, f);
    if (f->type != T_STR && v == 0 && !zero_is_given(f)) continue; /* not given */
    /* a derived figure stays derived: the reader derives it again, and it follows its source */
    if (f->off == offsetof(struct ferry_hw_profile, link.pageable_h2d_gbps) && p->link.pageable_derived) continue;
    const char *leaf = NULL;
    cJSON *o = parent_object(root, f->path, &leaf);
    const int ok = o && (f->type == T_STR ? cJSON_AddStringToObject(o, leaf, (const char *)p + f->off) != NULL
                                          : ferry__json_add_number(o, leaf, v) != NULL);
    if (!ok) return ferry__fail(FERRY_ERR_NOMEM, "out of memory writing a hardware profile");
  }
  return FERRY_OK;
}

/* ---- the figures a sensitivity study scales (ferry_hw_figures()) ------------------------------- */

const char *ferry_hw_basis_name(enum ferry_hw_basis basis) {
  switch (basis) {
  case FERRY_HW_BASIS_SOURCED: return "sourced";
  case FERRY_HW_BASIS_FITTED: return "fitted";
  case FERRY_HW_BASIS_DERIVED: return "derived";
  case FERRY_HW_BASIS_ESTIMATE: return "estimate";
  case FERRY_HW_BASIS_DEFAULT: return "default";
  case FERRY_HW_BASIS_NONE: return "none";
  }
  return "?";
}

/* A rate, a time or an efficiency: what scales the cost of work. Capacities (*_bytes), counts,
 * flags, element sizes and thresholds decide what fits or what runs instead; a price is no cost
 * of work; a fit's R^2 is no figure of the machine. */
static int scales_cost(const struct field *f) {
  const size_t n = strlen(f->path);
  if (f->sec == S_TOP || f->check == C_CC) return 0; /* a capability is a kind, not a rate */
  if (f->type == T_F64) return !(n > 3 && !strcmp(f->path + n - 3, ".r2"));
  return f->type == T_I64 && n > 3 && !strcmp(f->path + n - 3, "_ns");
}

/* What the figure at `path` rests on, its source's text written to src: its source entry's
 * words, else whether it is a default the reader filled in. */
static enum ferry_hw_basis figure_basis(const struct ferry_hw_profile *p, const char *path, char *src, size_t len) {
  src[0] = '\0';
  for (size_t i = 0; i < p->n_fitted; i++)
    if (!strcmp(p->fitted[i], path)) return FERRY_HW_BASIS_FITTED;
  if (!strncmp(path, "cost.", 5)) { /* the cost section holds fitted kernel costs only */
    snprintf(src, len, "fitted kernel cost (ferry calibrate --db)");
    return FERRY_HW_BASIS_FITTED;
  }
  if (!strcmp(path, "link.pageable_h2d_gbps") && p->link.pageable_derived) {
    snprintf(src, len, "not given: %g of link.h2d_gbps (hw/README.md, Defaults)", FERRY_HW_PAGEABLE_H2D_SHARE);
    return FERRY_HW_BASIS_DERIVED;
  }
  for (size_t i = 0; i < p->n_sources; i++) {
    const char *t = p->sources[i].source;
    if (strcmp(p->sources[i].figure, path)) continue;
    snprintf(src, len, "%s", t);
    if (!strncmp(t, "ferry default", 13)) return FERRY_HW_BASIS_DEFAULT;
    if (strstr(t, "estimate:")) return FERRY_HW_BASIS_ESTIMATE;
    return FERRY_HW_BASIS_SOURCED;
  }
  for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
    if (!strcmp(defaults[i].path, path)) {
      snprintf(src, len, "ferry default, not a measurement (hw/README.md, Defaults)");
      return FERRY_HW_BASIS_DEFAULT;
    }
  return FERRY_HW_BASIS_NONE;
}

ferry_status ferry_hw_figures(const struct ferry_hw_profile *p, struct ferry_hw_figure **out, size_t *n) {
  if (!p || !out || !n) return ferry__fail(FERRY_ERR_INVALID, "hw_figures: NULL argument");
  *out = NULL;
  *n = 0;
  struct ferry_hw_figure *v = ferry__calloc(N_FIELDS, sizeof *v);
  if (!v) return ferry__fail(FERRY_ERR_NOMEM, "hw_figures: out of memory");
  size_t k = 0;
  for (size_t i = 0; i < N_FIELDS; i++) {
    const struct field *f = &fields[i];
    if (!field_in_profile(p, f) || !scales_cost(f)) continue;
    const double value = field_number(p, f);
    if (value == 0) continue; /* not given, or nothing to scale */
    struct ferry_hw_figure *g = &v[k++];
    snprintf(g->path, sizeof g->path, "%s", f->path);
    g->value = value;
    g->integer = f->type != T_F64;
    g->basis = figure_basis(p, f->path, g->source, sizeof g->source);
  }
  if (!k) {
    ferry_free(v);
    return FERRY_OK;
  }
  *out = v;
  *n = k;
  return FERRY_OK;
}

void ferry_hw_figures_free(struct ferry_hw_figure *figures) { ferry_free(figures); }

/* Field f holds the same value in both profiles: integers exactly, doubles by value (-0 is 0). */
static int field_equal(const struct ferry_hw_profile *a, const struct ferry_hw_profile *b, const struct field *f) {
  const void *x = (const char *)a + f->off, *y = (const char *)b + f->off;
  switch (f->type) {
  case T_STR: return !strcmp(x, y);
  case T_F64: return *(const double *)x == *(const double *)y;
  case T_I64: return *(const int64_t *)x == *(const int64_t *)y;
  case T_U64: return *(const uint64_t *)x == *(const uint64_t *)y;
  case T_I32: return *(const int32_t *)x == *(const int32_t *)y;
  }
  return 0;
}

const char *ferry__hw_first_difference(const struct ferry_hw_profile *a, const struct ferry_hw_profile *b) {
  if (a->kind != b->kind) return "kind";
  for (int s = 0; s < S_TOP; s++)
    if (section_present(a, (enum section)s) != section_present(b, (enum section)s)) return section_names[s];
  for (size_t i = 0; i < N_FIELDS; i++) {
    const struct field *f = &fields[i];
    if (field_in_profile(a, f) != field_in_profile(b, f)) return f->path; /* a cost kind fitted in one only */
    if (field_in_profile(a, f) && !field_equal(a, b, f)) return f->path;
  }
  return NULL;
}

/* ---- catalogue search ------------------------------------------------------------------------ */

static int valid_name(const char *name) {
  if (!*name || name[0] == '.') return 0;
  for (const char *c = name; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '-' ||
          *c == '_' || *c == '.'))
      return 0;
  return 1;
}

/* The search folders in order: FERRY_HW_PATH entries, then the source tree, then the install
 * datadir. Calls fn for each; stops when fn returns non-zero. */
static int for_each_dir(int (*fn)(const char *dir, void *arg), void *arg) {
  const char *env = getenv("FERRY_HW_PATH");
  if (env && *env) {
    const char *p = env;
    while (*p) {
      const char *colon = strchr(p, ':');
      size_t n = colon ? (size_t)(colon - p) : strlen(p);
      if (n > 0) {
        char *dir = ferry__strndup(p, n);
        if (!dir) return -1;
        int r = fn(dir, arg);
        ferry_free(dir);
        if (r) return r;
      }
      if (!colon) break;
      p = colon + 1;
    }
  }
  /* the source tree; the share folder beside the running binary (an installation under any
   * prefix); the datadir configured at build time */
  char *beside = ferry__installed_hw_dir();
  const char *const builtin[] = {FERRY_HW_SOURCE_DIR, beside ? beside : "", FERRY_HW_INSTALL_DIR};
  int r = 0;
  for (size_t i = 0; i < 3 && !r; i++) {
    if (!*builtin[i] || (i == 2 && beside && ferry__same_file(beside, builtin[i]) == 1)) continue;
    r = fn(builtin[i], arg);
  }
  ferry_free(beside);
  return r;
}

struct find_ctx {
  const char *name;
  char *found;
  char tried[768];
  size_t tried_len;
};

static int try_dir(const char *dir, void *arg) {
  struct find_ctx *c = arg;
  int n = snprintf(c->tried + c->tried_len, sizeof c->tried - c->tried_len, "%s%s", c->tried_len ? ", " : "", dir);
  if (n > 0) c->tried_len += (size_t)n < sizeof c->tried - c->tried_len ? (size_t)n : sizeof c->tried - c->tried_len - 1;
  char *file = ferry__asprintf("%s/%s.json", dir, c->name);
  if (!file) return -1;
  if (ferry__is_file(file)) {
    c->found = file;
    return 1;
  }
  ferry_free(file);
  return 0;
}

static ferry_status find_profile(const char *name, const char *first_dir, char **out_path) {
  *out_path = NULL;
  if (!valid_name(name))
    return ferry__fail(FERRY_ERR_NOT_FOUND, "\"%s\" is not a catalogue name (letters, digits, '.', '_', '-')", name);
  struct find_ctx c;
  memset(&c, 0, sizeof c);
  c.name = name;
  int r = 0;
  if (first_dir) r = try_dir(first_dir, &c);
  if (r == 0) r = for_each_dir(try_dir, &c);
  if (r < 0) return nomem(name);
  if (!c.found) {
    /* name the profiles it resembles ("h100": h100-pcie, h100-sxm) */
    char **names = NULL, near_text[256] = "";
    size_t n = 0;
    if (ferry_hw_list(&names, &n) == FERRY_OK && n) {
      const char *near[4];
      const size_t k = ferry__nearest_names(name, (const char *const *)names, n, 1, near, 4);
      char list[200];
      if (k) snprintf(near_text, sizeof near_text, "; nearest: %s", ferry__join_names(near, k, "", list, sizeof list));
    }
    ferry_hw_list_free(names, n);
    return ferry__fail(FERRY_ERR_NOT_FOUND,
                       "hardware profile \"%s\" not found in %s (set FERRY_HW_PATH to add folders; ferry hw list)%s", name,
                       c.tried_len ? c.tried : "no folder", near_text);
  }
  *out_path = c.found;
  return FERRY_OK;
}

/* ---- public API ------------------------------------------------------------------------------ */

struct ferry_hw {
  struct ferry_hw_profile profile;
  struct ferry_hw_source *sources;
  char **fitted;
  char *path;
};

const char *ferry_hw_kind_name(enum ferry_hw_kind kind) {
  switch (kind) {
  case FERRY_HW_KIND_GPU: return "gpu";
  case FERRY_HW_KIND_HOST: return "host";
  case FERRY_HW_KIND_LINK: return "link";
  case FERRY_HW_KIND_DISK: return "disk";
  case FERRY_HW_KIND_RUNTIME: return "runtime";
  }
  return "?";
}

const char *ferry_hw_op_name(enum ferry_hw_op op) {
  static const char *const names[FERRY_HW_OP_COUNT] = {"gemm", "gemv", "attention", "elementwise", "dequantize"};
  return (unsigned)op < FERRY_HW_OP_COUNT ? names[op] : "?";
}

static ferry_status open_one(ferry_hw **out, const char *name_or_path) {
  *out = NULL;
  ferry__json_init();
  char *path = NULL;
  size_t len = strlen(name_or_path);
  ferry_status st;
  if (strchr(name_or_path, '/') || (len > 5 && !strcmp(name_or_path + len - 5, ".json"))) {
    path = ferry__strdup(name_or_path);
    if (!path) return nomem(name_or_path);
  } else {
    st = find_profile(name_or_path, NULL, &path);
    if (st != FERRY_OK) return st;
  }
  struct builder b;
  memset(&b, 0, sizeof b);
  struct ferry_hw *hw = NULL;
  st = load_file(&b, path, 0);
  if (st != FERRY_OK) goto out_free_builder;
  /* defaults for figures a profile may leave out */
  for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++) {
    int idx = field_index(defaults[i].path);
    if (!BIT(b.set, idx) && *section_flag(&b.p, fields[idx].sec)) field_set_number(&b.p, &fields[idx], defaults[i].value);
  }
  /* and figures derived from others, from the whole profile's values (a link that overrides its
   * part's h2d_gbps derives its pageable rate from its own) */
  if (b.p.has_link && !BIT(b.set, field_index("link.pageable_h2d_gbps"))) {
    b.p.link.pageable_derived = 1;
    ferry_hw_link_set_h2d(&b.p.link, b.p.link.h2d_gbps);
  }
  hw = ferry__calloc(1, sizeof *hw);
  if (!hw) goto out_nomem;
  size_t n_src = b.inherited.n + b.mine.n;
  if (n_src) {
    hw->sources = ferry__reallocarray(NULL, n_src, sizeof *hw->sources);
    if (!hw->sources) goto out_nomem;
    for (size_t i = 0; i < b.inherited.n; i++) hw->sources[i] = b.inherited.v[i];
    for (size_t i = 0; i < b.mine.n; i++) hw->sources[b.inherited.n + i] = b.mine.v[i];
  }
  size_t n_fit = b.fit_inherited.n + b.fit_mine.n;
  if (n_fit) {
    hw->fitted = ferry__calloc(n_fit, sizeof *hw->fitted);
    if (!hw->fitted) goto out_nomem;
    /* move the strings over */
    for (size_t i = 0; i < b.fit_inherited.n; i++) hw->fitted[i] = b.fit_inherited.v[i];
    for (size_t i = 0; i < b.fit_mine.n; i++) hw->fitted[b.fit_inherited.n + i] = b.fit_mine.v[i];
    b.fit_inherited.n = b.fit_mine.n = 0;
  }
  hw->profile = b.p;
  hw->profile.sources = hw->sources;
  hw->profile.n_sources = n_src;
  hw->profile.fitted = (const char *const *)hw->fitted;
  hw->profile.n_fitted = n_fit;
  hw->path = path;
  hw->profile.path = path;
  path = NULL;
  *out = hw;
  hw = NULL;
  st = FERRY_OK;
  goto out_free_builder;
out_nomem:
  st = nomem(path);
out_free_builder:
  if (hw) {
    ferry_free(hw->sources);
    ferry_free(hw->fitted);
    ferry_free(hw);
  }
  builder_free(&b);
  ferry_free(path);
  return st;
}

/* Drop the fitted marks of section s (path NULL) or of the one figure at path: what they marked is
 * being replaced. */
static void drop_fitted(ferry_hw *hw, enum section s, const char *path) {
  size_t k = 0;
  for (size_t i = 0; i < hw->profile.n_fitted; i++) {
    if (path ? !strcmp(hw->fitted[i], path) : in_section(hw->fitted[i], s))
      ferry_free(hw->fitted[i]);
    else
      hw->fitted[k++] = hw->fitted[i];
  }
  hw->profile.n_fitted = k;
}

/* Replace section s of hw's profile by part's: its values and its sources instead of the old
 * section's; the old section's figures fitted to measurements go with it. */
static ferry_status replace_section(ferry_hw *hw, enum section s, const ferry_hw *part, const char *what) {
  const struct ferry_hw_profile *r = &part->profile;
  size_t n = 0;
  struct ferry_hw_source *v = ferry__reallocarray(NULL, hw->profile.n_sources + r->n_sources + 1, sizeof *v);
  if (!v) return nomem(what);
  for (size_t i = 0; i < hw->profile.n_sources; i++)
    if (!in_section(hw->sources[i].figure, s)) v[n++] = hw->sources[i];
  for (size_t i = 0; i < r->n_sources; i++)
    if (in_section(r->sources[i].figure, s)) v[n++] = r->sources[i];
  ferry_free(hw->sources);
  hw->sources = v;
  hw->profile.sources = v;
  hw->profile.n_sources = n;
  drop_fitted(hw, s, NULL);
  copy_section(&hw->profile, r, s);
  *section_flag(&hw->profile, s) = 1;
  return FERRY_OK;
}

ferry_status ferry_hw_set_runtime(ferry_hw *hw, const char *name_or_path) {
  if (!hw || !name_or_path) return ferry__fail(FERRY_ERR_INVALID, "hw_set_runtime: NULL argument");
  ferry_hw *rt = NULL;
  ferry_status st = ferry_hw_open(&rt, name_or_path);
  if (st != FERRY_OK) return st;
  if (rt->profile.kind != FERRY_HW_KIND_RUNTIME)
    st = ferry__fail(FERRY_ERR_INVALID, "%s is a %s profile, not a runtime (eager, graph, native, ktransformers, deepspeed-0.7, llama.cpp-2024q1: ferry hw list)",
                     name_or_path, ferry_hw_kind_name(rt->profile.kind));
  else
    st = replace_section(hw, S_RUNTIME, rt, name_or_path);
  ferry_hw_close(rt);
  return st;
}

/* The parts a composed name may swap: what a buyer chooses beside the GPU. */
static const enum section swappable[] = {S_HOST, S_LINK, S_DISK, S_RUNTIME};

/* Section named by the text before '=' in token `t` (length n), or S_COUNT. */
static enum section swappable_section(const char *t, size_t n) {
  for (size_t i = 0; i < sizeof swappable / sizeof swappable[0]; i++) {
    const char *name = section_names[swappable[i]];
    if (strlen(name) == n && !strncmp(t, name, n)) return swappable[i];
  }
  return S_COUNT;
}

/* The numeric field named by the text before '=' in token `t` (length n), or -1. */
static int override_field(const char *t, size_t n) {
  char path[64];
  if (n >= sizeof path || !memchr(t, '.', n)) return -1;
  memcpy(path, t, n);
  path[n] = '\0';
  const int idx = field_index(path);
  return idx >= 0 && fields[idx].type != T_STR ? idx : -1;
}

/* Whether `name` is BASE+SECTION=PART or BASE+FIELD=VALUE[+...]: a '+' followed by a swappable
 * section's name or a numeric field's path and '=' (a catalogue name never holds '+'; a path
 * holding "+host=" is read as a composition). */
static int is_composed(const char *name) {
  const char *plus = strchr(name, '+');
  if (!plus) return 0;
  const char *eq = strchr(plus + 1, '=');
  if (!eq) return 0;
  const size_t n = (size_t)(eq - plus - 1);
  return swappable_section(plus + 1, n) != S_COUNT || override_field(plus + 1, n) >= 0;
}

/* FIELD=VALUE in a composed name: the figure set, its source the name itself, a fitted mark on
 * it dropped. An integer *_bytes figure (a byte count) takes a size ("256GiB"), the others a
 * number, bytes per element included (runtime.dequant_pass_bytes=12.5); the reader's checks
 * apply (a rate must be positive, a flag 0 or 1, ...). */
static ferry_status override_figure(ferry_hw *hw, int idx, const char *text, const char *name) {
  const struct field *f = &fields[idx];
  struct ferry_hw_profile *p = &hw->profile;
  if (!section_present(p, f->sec))
    return ferry__fail(FERRY_ERR_INVALID, "hw: %s in \"%s\": the profile has no %s section", f->path, name,
                       section_names[f->sec]);
  double v;
  const size_t plen = strlen(f->path);
  if (f->type != T_F64 && plen > 6 && !strcmp(f->path + plen - 6, "_bytes")) {
    uint64_t bytes;
    if (ferry__parse_size(text, &bytes) != FERRY_OK)
      return ferry__fail(FERRY_ERR_INVALID, "hw: %s=%s in \"%s\": not a size (e.g. 256GiB)", f->path, text, name);
    /* a bare number is a byte count, kept as the figure's source: a fraction of a byte would be
     * cut off here and the source would no longer match the figure */
    char *end;
    const double plain = strtod(text, &end);
    if (end != text && *end == '\0' && plain != floor(plain))
      return ferry__fail(FERRY_ERR_INVALID, "hw: %s=%s in \"%s\": a byte count must be whole (or give a unit: 4GiB)",
                         f->path, text, name);
    v = (double)bytes;
  } else if (ferry__parse_double(text, &v) != FERRY_OK || !isfinite(v)) {
    return ferry__fail(FERRY_ERR_INVALID, "hw: %s=%s in \"%s\": not a number", f->path, text, name);
  }
  double min, max;
  int_bounds(f, &min, &max);
  if (f->type != T_F64 && (v != floor(v) || v > max || v < min))
    return ferry__fail(FERRY_ERR_INVALID, "hw: %s=%s in \"%s\": must be an integer%s", f->path, text, name,
                       f->type == T_I32 ? " below 2^31" : "");
  ferry_status st = check_number(f, v, name);
  if (st != FERRY_OK) return st;
  struct ferry_hw_source *src = ferry__reallocarray(hw->sources, p->n_sources + 1, sizeof *src);
  if (!src) return nomem(name);
  hw->sources = src;
  size_t n = 0;
  for (size_t i = 0; i < p->n_sources; i++)
    if (strcmp(src[i].figure, f->path)) src[n++] = src[i];
  struct ferry_hw_source *mine = &src[n++];
  memset(mine, 0, sizeof *mine);
  snprintf(mine->figure, sizeof mine->figure, "%s", f->path);
  snprintf(mine->value, sizeof mine->value, "%s", text);
  snprintf(mine->source, sizeof mine->source, "given in the profile's name, %s", name);
  p->sources = src;
  p->n_sources = n;
  drop_fitted(hw, f->sec, f->path);
  if (f->off == offsetof(struct ferry_hw_profile, link.h2d_gbps))
    ferry_hw_link_set_h2d(&p->link, v);
  else
    field_set_number(p, f, v);
  if (f->off == offsetof(struct ferry_hw_profile, link.pageable_h2d_gbps)) p->link.pageable_derived = 0;
  return FERRY_OK;
}

ferry_status ferry_hw_set_figure(ferry_hw *hw, const char *path, const char *value_text) {
  if (!hw || !path || !value_text) return ferry__fail(FERRY_ERR_INVALID, "hw_set_figure: NULL argument");
  const int idx = override_field(path, strlen(path));
  if (idx < 0) return ferry__fail(FERRY_ERR_INVALID, "hw: %s is not a numeric figure of a profile (ferry hw show)", path);
  char what[160];
  snprintf(what, sizeof what, "%s=%s", path, value_text);
  return override_figure(hw, idx, value_text, what);
}

/* Open BASE+SECTION=PART+...: the base profile with each named section taken from a part. */
static ferry_status open_composed(ferry_hw **out, const char *name) {
  *out = NULL;
  char text[sizeof((struct ferry_hw_profile *)0)->name]; /* the name the profile will carry */
  if (strlen(name) >= sizeof text)
    return ferry__fail(FERRY_ERR_INVALID, "hw: composed profile name \"%s\" is longer than %zu characters", name,
                       sizeof text - 1);
  snprintf(text, sizeof text, "%s", name);
  char *t = strchr(text, '+');
  *t++ = '\0'; /* the base's name ends at the first '+' (open_composed is only called with one) */
  ferry_hw *hw = NULL, *part = NULL;
  ferry_status st = open_one(&hw, text);
  if (st != FERRY_OK) return st;
  for (char *next; t; t = next) {
    next = strchr(t, '+');
    if (next) *next++ = '\0';
    const char *eq = strchr(t, '=');
    const enum section s = eq ? swappable_section(t, (size_t)(eq - t)) : S_COUNT;
    const int field = eq && s == S_COUNT ? override_field(t, (size_t)(eq - t)) : -1;
    if ((s == S_COUNT && field < 0) || !eq[1]) {
      st = ferry__fail(FERRY_ERR_INVALID,
                       "hw: \"%s\" in \"%s\" is not SECTION=PART (sections: host, link, disk, runtime) nor "
                       "FIELD=VALUE (a numeric field of the profile, e.g. host.memory_bytes=256GiB)",
                       t, name);
      goto fail;
    }
    if (field >= 0) {
      if ((st = override_figure(hw, field, eq + 1, name)) != FERRY_OK) goto fail;
      continue;
    }
    st = open_one(&part, eq + 1);
    if (st != FERRY_OK) goto fail;
    if (!section_present(&part->profile, s)) {
      st = ferry__fail(FERRY_ERR_INVALID, "hw: %s in \"%s\": %s is a %s profile with no %s section", t, name, eq + 1,
                       ferry_hw_kind_name(part->profile.kind), section_names[s]);
      goto fail;
    }
    st = replace_section(hw, s, part, name);
    if (st != FERRY_OK) goto fail;
    ferry_hw_close(part);
    part = NULL;
  }
  snprintf(hw->profile.name, sizeof hw->profile.name, "%s", name);
  *out = hw;
  return FERRY_OK;
fail:
  ferry_hw_close(part);
  ferry_hw_close(hw);
  return st;
}

ferry_status ferry_hw_open(ferry_hw **out, const char *name_or_path) {
  if (!out) return ferry__fail(FERRY_ERR_INVALID, "hw_open: NULL argument");
  *out = NULL;
  if (!name_or_path || !*name_or_path) return ferry__fail(FERRY_ERR_INVALID, "hw: no profile name given");
  /* a '+' outside a path can only mean a composition: its parser names what is wrong */
  const int composed = is_composed(name_or_path) || (strchr(name_or_path, '+') && !strchr(name_or_path, '/'));
  return composed ? open_composed(out, name_or_path) : open_one(out, name_or_path);
}

void ferry_hw_close(ferry_hw *hw) {
  if (!hw) return;
  for (size_t i = 0; i < hw->profile.n_fitted; i++) ferry_free(hw->fitted[i]);
  ferry_free(hw->fitted);
  ferry_free(hw->sources);
  ferry_free(hw->path);
  ferry_free(hw);
}

const struct ferry_hw_profile *ferry_hw_get(const ferry_hw *hw) { return &hw->profile; }

void ferry_hw_link_set_h2d(struct ferry_hw_link *link, double h2d_gbps) {
  if (!link || !(h2d_gbps > 0) || !isfinite(h2d_gbps)) return;
  link->h2d_gbps = h2d_gbps;
  if (link->pageable_derived) link->pageable_h2d_gbps = h2d_gbps * FERRY_HW_PAGEABLE_H2D_SHARE;
}

/* Per SM of each compute capability (x 10): maximum resident threads and maximum shared memory
 * (the CUDA C++ Programming Guide's "Technical Specifications per Compute Capability"), resident
 * blocks (CUDA 13.0 cuda_occupancy.h, cudaOccMaxBlocksPerMultiprocessor), and the shared memory
 * the driver reserves per block (1 KiB from 8.0: cudaDevAttrReservedSharedMemoryPerBlock). */
static const struct {
  int cc10;
  int32_t threads, blocks;
  int32_t smem_kib, reserved_per_block;
} sm_table[] = {
    {70, 2048, 32, 96, 0},    {72, 2048, 32, 96, 0},    {75, 1024, 16, 64, 0},     {80, 2048, 32, 164, 1024},
    {86, 1536, 16, 100, 1024}, {87, 2048, 16, 164, 1024}, {89, 1536, 24, 100, 1024}, {90, 2048, 32, 228, 1024},
    {100, 2048, 32, 228, 1024}, {120, 1536, 24, 100, 1024},
};

/* The table's capabilities as "7.0, 7.2, ... or 12.0", for messages. */
static void known_capabilities(char *buf, size_t size) {
  const size_t n = sizeof sm_table / sizeof sm_table[0];
  size_t used = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < n && used < size; i++) {
    const int w = snprintf(buf + used, size - used, "%s%d.%d", i == 0 ? "" : i + 1 == n ? " or " : ", ",
                           sm_table[i].cc10 / 10, sm_table[i].cc10 % 10);
    if (w < 0) break;
    used += (size_t)w;
  }
}

/* The table's row for a capability, or -1: exact to the tenth (8.64 is no capability). */
static int sm_row(double compute_capability) {
  if (!(compute_capability > 0 && compute_capability < 100)) return -1;
  const int cc10 = (int)lround(compute_capability * 10);
  if (fabs(compute_capability * 10 - cc10) > 1e-6) return -1;
  for (size_t i = 0; i < sizeof sm_table / sizeof sm_table[0]; i++)
    if (sm_table[i].cc10 == cc10) return (int)i;
  return -1;
}

int ferry_hw_gpu_residency(double compute_capability, int32_t *threads_per_sm, int32_t *blocks_per_sm) {
  const int i = sm_row(compute_capability);
  if (i < 0) return -1;
  if (threads_per_sm) *threads_per_sm = sm_table[i].threads;
  if (blocks_per_sm) *blocks_per_sm = sm_table[i].blocks;
  return 0;
}

int ferry__hw_gpu_shared_memory(double compute_capability, int64_t *per_sm_bytes, int64_t *reserved_per_block_bytes) {
  const int i = sm_row(compute_capability);
  if (i < 0) return -1;
  if (per_sm_bytes) *per_sm_bytes = (int64_t)sm_table[i].smem_kib * 1024;
  if (reserved_per_block_bytes) *reserved_per_block_bytes = sm_table[i].reserved_per_block;
  return 0;
}

/* The element sizes of the workspace a GPU runtime holds. Every preset but llama.cpp's computes in
 * fp16/bf16, hence the default of 2; a product that cannot read its low-bit weight packed reads a
 * copy a dequantize kernel wrote (fp16 unless the runtime says otherwise). */
void ferry_hw_profile_elem_bytes(const struct ferry_hw_profile *p, uint32_t *act_bytes, uint32_t *dequant_bytes) {
  const struct ferry_hw_runtime *r = p && p->has_runtime ? &p->runtime : NULL;
  const int packed = !r || (r->fused_dequant && r->fused_max_rows <= 0);
  if (act_bytes) *act_bytes = r && r->act_bytes > 0 ? (uint32_t)r->act_bytes : 2;
  if (dequant_bytes) *dequant_bytes = packed ? 0 : r->dequant_bytes > 0 ? (uint32_t)r->dequant_bytes : 2;
}

/* Little's law for the runtime's reader: Q requests of R bytes in flight, each served in the disk's
 * latency plus its bytes at the disk's rate, deliver Q R per (latency + R / rate), and never more
 * than the disk. Requests a read issues beyond the disk's queue depth wait, so Q is bounded by it. */
double ferry_hw_disk_read_gbps(const struct ferry_hw_profile *p) {
  if (!p || !p->has_disk || !(p->disk.read_gbps > 0)) return 0;
  const double disk_gbps = p->disk.read_gbps;
  const struct ferry_hw_runtime *r = p->has_runtime ? &p->runtime : NULL;
  if (!r || r->read_depth <= 0) return disk_gbps;
  const int64_t threads = r->read_threads > 0 ? r->read_threads : p->has_host ? p->host.cores : 0;
  if (threads <= 0) return disk_gbps;
  int64_t q = threads * r->read_depth;
  if (p->disk.queue_depth > 0 && q > p->disk.queue_depth) q = p->disk.queue_depth;
  const double req = (double)(r->read_request_bytes > 0   ? r->read_request_bytes
                              : p->disk.read_ahead_bytes > 0 ? p->disk.read_ahead_bytes
                                                             : FERRY_HW_READ_AHEAD_BYTES);
  const double reader_gbps = (double)q * req / ((double)p->disk.latency_ns + req / disk_gbps); /* B/ns = GB/s */
  return reader_gbps < disk_gbps ? reader_gbps : disk_gbps;
}

int32_t ferry_hw_gpu_count(const struct ferry_hw_profile *p) {
  if (!p || !p->has_gpu) return 0;
  return p->has_interconnect && p->interconnect.gpus > 0 ? p->interconnect.gpus : 1;
}

static ferry_status require_field(const struct ferry_hw_profile *p, int idx) {
  const struct field *f = &fields[idx];
  const char *name = p->name[0] ? p->name : (p->path ? p->path : "profile");
  if (!section_present(p, f->sec))
    return ferry__fail(FERRY_ERR_NOT_FOUND,
                       "hardware profile %s: %s is needed but the profile has no %s section (add one or name a "
                       "catalogue part, see hw/README.md)",
                       name, f->path, section_names[f->sec]);
  int missing;
  if (f->type == T_STR)
    missing = ((const char *)p + f->off)[0] == '\0';
  else
    missing = f->check == C_NONNEG || f->check == C_SHARE ? 0 : !(field_number(p, f) > 0);
  if (missing)
    return ferry__fail(FERRY_ERR_NOT_FOUND, "hardware profile %s: %s is needed for this run but is not given", name,
                       f->path);
  return FERRY_OK;
}

ferry_status ferry_hw_require(const struct ferry_hw_profile *profile, const char *what) {
  static const struct {
    const char *section;
    const char *needs[4];
  } section_needs[] = {
      {"gpu", {"gpu.memory_bytes", "gpu.mem_bw_gbps", "gpu.peak_tflops.fp32", "gpu.peak_tflops.fp16"}},
      {"link", {"link.h2d_gbps", "link.d2h_gbps", NULL, NULL}},
      {"host", {"host.dram_gbps", "host.memory_bytes", NULL, NULL}},
      {"disk", {"disk.read_gbps", NULL, NULL, NULL}},
      {"interconnect", {"interconnect.gpus", "interconnect.gpu_gbps", NULL, NULL}},
  };
  const int n_sections = (int)(sizeof section_needs / sizeof section_needs[0]);
  if (!profile || !what) return ferry__fail(FERRY_ERR_INVALID, "ferry_hw_require: NULL argument");
  const char *p = what;
  while (*p) {
    const char *comma = strchr(p, ',');
    size_t n = comma ? (size_t)(comma - p) : strlen(p);
    char tok[PATH_MAX_LEN];
    while (n > 0 && *p == ' ') p++, n--;
    while (n > 0 && p[n - 1] == ' ') n--;
    if (n >= sizeof tok) return ferry__fail(FERRY_ERR_INVALID, "ferry_hw_require: \"%.*s\" is not a field", (int)n, p);
    memcpy(tok, p, n);
    tok[n] = '\0';
    if (n > 0) {
      int sec = -1;
      for (int s = 0; s < n_sections; s++)
        if (!strcmp(tok, section_needs[s].section)) sec = s;
      if (sec >= 0) {
        for (int k = 0; k < 4 && section_needs[sec].needs[k]; k++) {
          ferry_status st = require_field(profile, field_index(section_needs[sec].needs[k]));
          if (st != FERRY_OK) return st;
        }
      } else {
        int idx = field_index(tok);
        if (idx < 0) return ferry__fail(FERRY_ERR_INVALID, "ferry_hw_require: \"%s\" is not a field of a profile", tok);
        ferry_status st = require_field(profile, idx);
        if (st != FERRY_OK) return st;
      }
    }
    if (!comma) break;
    p = comma + 1;
  }
  return FERRY_OK;
}

struct list_ctx {
  struct strlist names;
  int failed;
};

static int list_dir(const char *dir, void *arg) {
  struct list_ctx *c = arg;
  DIR *d = opendir(dir);
  if (!d) return 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t n = strlen(e->d_name);
    if (n <= 5 || strcmp(e->d_name + n - 5, ".json")) continue;
    char name[256];
    if (n - 5 >= sizeof name) continue;
    memcpy(name, e->d_name, n - 5);
    name[n - 5] = '\0';
    if (!valid_name(name)) continue;
    int dup = 0;
    for (size_t i = 0; i < c->names.n && !dup; i++) dup = !strcmp(c->names.v[i], name);
    if (!dup && strlist_push(&c->names, name)) {
      c->failed = 1;
      break;
    }
  }
  closedir(d);
  return c->failed ? -1 : 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

ferry_status ferry_hw_list(char ***out_names, size_t *out_count) {
  *out_names = NULL;
  *out_count = 0;
  struct list_ctx c;
  memset(&c, 0, sizeof c);
  if (for_each_dir(list_dir, &c) < 0 || c.failed) {
    strlist_free(&c.names);
    return ferry__fail(FERRY_ERR_NOMEM, "hw: out of memory listing the catalogue");
  }
  if (c.names.n) qsort(c.names.v, c.names.n, sizeof *c.names.v, cmp_str);
  *out_names = c.names.v;
  *out_count = c.names.n;
  return FERRY_OK;
}

void ferry_hw_list_free(char **names, size_t count) {
  if (!names) return;
  for (size_t i = 0; i < count; i++) ferry_free(names[i]);
  ferry_free(names);
}
