/* `ferry hw`: the hardware-profile catalogue (list, show), so a user can see which GPUs,
 * links, disks and host memories the simulator knows and where every figure comes from. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/units.h"
#include "ferry/hw.h"

static void usage(FILE *f) {
  fprintf(f,
          "Usage: ferry hw list\n"
          "       ferry hw show NAME|FILE.json\n"
          "       ferry hw kernel PROFILE [--runtime NAME] SPEC...\n"
          "Hardware profiles for the simulator.\n\n"
          "  list         one line per catalogue entry: kind, GPUs, memory per GPU, bandwidths (GB/s =\n"
          "               1e9 bytes/s), dense fp16 TFLOP/s per GPU and the machine's price per hour\n"
          "  show NAME    every field of a profile, composed parts included, with the source of\n"
          "               each figure and which figures were fitted from measurements\n"
          "  kernel       the simulated time of kernels on a profile's GPU (ferry hw kernel --help)\n\n"
          "A profile with other parts: BASE+SECTION=PART[+...], SECTION one of host, link, disk,\n"
          "runtime (e.g. h100-pcie+host=xeon-6454s-2s+link=pcie4-x16): the base with each named\n"
          "section, and its sources, taken from a catalogue part or file; BASE+FIELD=VALUE sets one\n"
          "figure (h100-pcie+host.memory_bytes=256GiB+disk.read_gbps=14). Every command that takes\n"
          "a profile reads the name ('ferry plan --hw' compares such variants).\n\n"
          "Catalogue folders, searched in order: $FERRY_HW_PATH (':'-separated), the source tree's\n"
          "hw/, share/ferry/hw beside the running ferry (BIN/../share/ferry/hw: an installation under\n"
          "any prefix), the datadir configured at build time. Rates are GB/s (10^9 bytes/s) throughout;\n"
          "a source published in GiB/s shows its converted figure with the published one beside it.\n"
          "The file format is described in hw/README.md.\n");
}

static const char *num(double v, const char *fmt, char *buf, size_t len) {
  if (v > 0)
    snprintf(buf, len, fmt, v);
  else
    snprintf(buf, len, "-");
  return buf;
}

static int hw_list(void) {
  char **names;
  size_t n;
  if (ferry_hw_list(&names, &n) != FERRY_OK) return cli_fail(FERRY_ERR_NOMEM, NULL);
  if (n == 0) {
    ferry_hw_list_free(names, n);
    return cli_fail(FERRY_ERR_NOT_FOUND, "hw: the catalogue is empty (set FERRY_HW_PATH to a folder of profiles)");
  }
  printf("%-16s %-7s %4s %11s %9s %8s %8s %9s %8s %7s\n", "NAME", "KIND", "GPUS", "GPU_MEM", "MEM_GB/S", "H2D_GB/S",
         "D2H_GB/S", "DISK_GB/S", "FP16_TF", "USD/H");
  int failed = 0;
  for (size_t i = 0; i < n; i++) {
    ferry_hw *hw;
    if (ferry_hw_open(&hw, names[i]) != FERRY_OK) {
      fprintf(stderr, "ferry: %s\n", ferry_last_error());
      failed = 1;
      continue;
    }
    const struct ferry_hw_profile *p = ferry_hw_get(hw);
    char mem[32], bw[32], h2d[32], d2h[32], disk[32], tf[32], usd[32], gpus[16];
    if (p->has_gpu)
      ferry__format_bytes(p->gpu.memory_bytes, mem, sizeof mem);
    else
      snprintf(mem, sizeof mem, "-");
    num(ferry_hw_gpu_count(p), "%.0f", gpus, sizeof gpus);
    printf("%-16s %-7s %4s %11s %9s %8s %8s %9s %8s %7s\n", p->name, ferry_hw_kind_name(p->kind), gpus, mem,
           num(p->has_gpu ? p->gpu.mem_bw_gbps : p->has_host ? p->host.dram_gbps : 0, "%.0f", bw, sizeof bw),
           num(p->has_link ? p->link.h2d_gbps : 0, "%.2f", h2d, sizeof h2d),
           num(p->has_link ? p->link.d2h_gbps : 0, "%.2f", d2h, sizeof d2h),
           num(p->has_disk ? p->disk.read_gbps : 0, "%.3f", disk, sizeof disk),
           num(p->has_gpu ? p->gpu.peak_tflops.fp16 : 0, "%.1f", tf, sizeof tf),
           num(p->price_per_hour_usd, "%.2f", usd, sizeof usd));
    ferry_hw_close(hw);
  }
  ferry_hw_list_free(names, n);
  return failed ? CLI_FAIL : CLI_OK;
}

static void show_f(const char *path, double v, const char *unit) {
  if (v > 0)
    printf("  %-28s %g %s\n", path, v, unit);
  else
    printf("  %-28s (not given)\n", path);
}

static void show_bytes(const char *path, uint64_t v) {
  char buf[32];
  printf("  %-28s %llu (%s)\n", path, (unsigned long long)v, ferry__format_bytes(v, buf, sizeof buf));
}

/* A source's figure in the unit the fields use: a rate published in GiB/s (2^30 bytes/s, as
 * FlexGen's "GB") shows as GB/s (10^9 bytes/s) with the published figure beside it, so one link
 * is not "13.8405 GB/s" above and "12.89 GiB/s" below. */
static void source_value(const char *v, char *out, size_t len) {
  char *end = NULL;
  const double x = strtod(v, &end);
  if (end && end != v && !strcmp(end, " GiB/s"))
    snprintf(out, len, "%.6g GB/s (published as %s)", x * 1073741824.0 / 1e9, v);
  else
    snprintf(out, len, "%s", v);
}

static void show_gpu(const struct ferry_hw_gpu *g) {
  printf("gpu: %s\n", g->name);
  show_bytes("gpu.memory_bytes", g->memory_bytes);
  show_f("gpu.mem_bw_gbps", g->mem_bw_gbps, "GB/s");
  show_f("gpu.peak_tflops.fp32", g->peak_tflops.fp32, "TFLOP/s");
  show_f("gpu.peak_tflops.fp16", g->peak_tflops.fp16, "TFLOP/s");
  show_f("gpu.peak_tflops.bf16", g->peak_tflops.bf16, "TFLOP/s");
  show_f("gpu.peak_tflops.int8", g->peak_tflops.int8, "TOP/s");
  show_f("gpu.peak_tflops.fp8", g->peak_tflops.fp8, "TFLOP/s");
  printf("  %-28s %lld ns\n", "gpu.launch_overhead_ns", (long long)g->launch_overhead_ns);
  show_f("gpu.efficiency.gemm", g->efficiency.gemm, "");
  show_f("gpu.efficiency.gemv", g->efficiency.gemv, "");
  show_f("gpu.efficiency.attention", g->efficiency.attention, "");
  show_f("gpu.efficiency.elementwise", g->efficiency.elementwise, "");
  show_f("gpu.efficiency.dequantize", g->efficiency.dequantize, "");
  show_f("gpu.sm_count", g->sm_count, "SMs");
  show_f("gpu.clock_mhz", g->clock_mhz, "MHz");
  int32_t threads = 0, blocks = 0;
  if (ferry_hw_gpu_residency(g->compute_capability, &threads, &blocks) == 0)
    printf("  %-28s %.1f (%d threads, %d blocks per SM)\n", "gpu.compute_capability", g->compute_capability, threads,
           blocks);
  else
    show_f("gpu.compute_capability", 0, "");
}

static void show_host(const struct ferry_hw_host *h) {
  printf("host: %s\n", h->name);
  show_f("host.dram_gbps", h->dram_gbps, "GB/s");
  show_f("host.cpu_gflops", h->cpu_gflops, "GFLOP/s");
  if (h->cores) {
    printf("  %-28s %d\n", "host.cores", h->cores);
    if (h->sockets) printf("  %-28s %d\n", "host.sockets", h->sockets);
    if (h->simd_bits) printf("  %-28s %d bits\n", "host.simd_bits", h->simd_bits);
    show_f("host.core_gflops.fp32", h->core_gflops.fp32, "GFLOP/s");
    show_f("host.core_gflops.fp16", h->core_gflops.fp16, "GFLOP/s");
    show_f("host.core_gflops.bf16", h->core_gflops.bf16, "GFLOP/s");
    show_f("host.core_gflops.int8", h->core_gflops.int8, "GOP/s");
    /* AMX tiles: printed where the core has them */
    if (h->core_gflops.amx_bf16 > 0) show_f("host.core_gflops.amx_bf16", h->core_gflops.amx_bf16, "GFLOP/s");
    if (h->core_gflops.amx_int8 > 0) show_f("host.core_gflops.amx_int8", h->core_gflops.amx_int8, "GOP/s");
  }
  printf("  %-28s %lld ns\n", "host.cpu_op_ns", (long long)h->cpu_op_ns);
  if (h->staged_h2d_gbps > 0)
    printf("  %-28s %g GB/s (%s)\n", "host.staged_h2d_gbps", h->staged_h2d_gbps,
           "pageable copies staged by the CPU before their DMA");
  if (h->memory_bytes)
    show_bytes("host.memory_bytes", h->memory_bytes);
  else
    show_f("host.memory_bytes", 0, "");
}

static void show_runtime(const struct ferry_hw_profile *p) {
  const struct ferry_hw_runtime *r = &p->runtime;
  printf("runtime: %s\n", r->name);
  printf("  %-28s %lld ns\n", "runtime.launch_ns", (long long)r->launch_ns);
  if (r->prefill_launch_ns)
    printf("  %-28s %lld ns (%s)\n", "runtime.prefill_launch_ns", (long long)r->prefill_launch_ns,
           "per kernel of a step that prefills: run eagerly, not from a CUDA graph");
  printf("  %-28s %lld ns\n", "runtime.copy_ns", (long long)r->copy_ns);
  printf("  %-28s %lld ns\n", "runtime.layer_ns", (long long)r->layer_ns);
  if (r->prefill_layer_ns)
    printf("  %-28s %lld ns (%s)\n", "runtime.prefill_layer_ns", (long long)r->prefill_layer_ns,
           "per layer of a step that prefills: run eagerly, module by module");
  printf("  %-28s %lld ns\n", "runtime.step_ns", (long long)r->step_ns);
  printf("  %-28s %lld ns\n", "runtime.row_ns", (long long)r->row_ns);
  if (r->worker_step_ns)
    printf("  %-28s %lld ns (%s)\n", "runtime.worker_step_ns", (long long)r->worker_step_ns,
           "per step on more than one GPU, to drive the workers");
  printf("  %-28s %d (%s)\n", "runtime.fused_dequant", r->fused_dequant,
         r->fused_dequant ? "low-bit weights read packed by fused kernels" : "a dequantize kernel expands them to fp16");
  if (r->fused_max_rows)
    printf("  %-28s %lld (%s)\n", "runtime.fused_max_rows", (long long)r->fused_max_rows,
           "products over more rows dequantize to fp16 first");
  printf("  %-28s %d (%s)\n", "runtime.sync_fetch", r->sync_fetch,
         r->sync_fetch ? "the host waits for fetched weights before issuing compute" : "the GPU waits, the host goes on");
  if (r->model_syncs)
    printf("  %-28s %d (%s)\n", "runtime.model_syncs", r->model_syncs,
           "the model's code waits for the GPU where it copies CPU-made tensors; layer time op by op");
  printf("  %-28s %d (%s)\n", "runtime.numa_blind", r->numa_blind,
         r->numa_blind ? "CPU kernels read one socket's memory" : "each socket reads its own memory");
  if (r->numa_first_threads)
    printf("  %-28s %d (%s)\n", "runtime.numa_first_threads", r->numa_first_threads,
           "threads of the first CPU job, which bind the rest to the last nodes");
  if (r->cpu_math_eff > 0) printf("  %-28s %g of the CPU's peak\n", "runtime.cpu_math_eff", r->cpu_math_eff);
  if (r->cpu_amx_eff_bf16 > 0)
    printf("  %-28s %g of the host's AMX bf16 peak\n", "runtime.cpu_amx_eff_bf16", r->cpu_amx_eff_bf16);
  if (r->cpu_amx_eff_int8 > 0)
    printf("  %-28s %g of the host's AMX int8 peak\n", "runtime.cpu_amx_eff_int8", r->cpu_amx_eff_int8);
  if (r->cpu_quant_simd_bits)
    printf("  %-28s %d bits (%s)\n", "runtime.cpu_quant_simd_bits", r->cpu_quant_simd_bits,
           "vectors of its low-bit dot products");
  /* mechanisms only some runtimes have: printed where set */
  const struct {
    const char *name;
    int32_t value;
    const char *meaning;
  } flags[] = {
      {"runtime.cpu_amx", r->cpu_amx, "CPU products of bf16 or int8 weights on AMX tiles where faster"},
      {"runtime.cpu_amx_min_rows", r->cpu_amx_min_rows, "fewest rows of a product the runtime runs on AMX tiles"},
      {"runtime.attn_repeat_kv", r->attn_repeat_kv, "grouped-query attention copies K and V per query head first"},
      {"runtime.attn_fa2_kvcache", r->attn_fa2_kvcache, "FlashAttention-2 flash_attn_with_kvcache: appends per query tile, runs in waves"},
      {"runtime.gather_copy", r->gather_copy, "each copy to the GPU is copied again within it"},
      {"runtime.split_copy", r->split_copy, "each gathered parameter is copied out of its flat buffer"},
      {"runtime.read_after_copy", r->read_after_copy, "a disk read waits for the copies to the GPU before it"},
      {"runtime.blocking_copy", r->blocking_copy, "the host waits for each copy to the GPU"},
      {"runtime.moe_row_copy", r->moe_row_copy, "each routed row is gathered and scattered by a copy of its own"},
      {"runtime.cpu_kv_upcast", r->cpu_kv_upcast, "CPU attention converts a non-fp32 KV cache to an fp32 copy first"},
      {"runtime.cpu_fresh_alloc", r->cpu_fresh_alloc, "CPU ops' large temporaries are fresh pages the OS zeroes first"},
  };
  for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
    if (flags[i].value) printf("  %-28s %d (%s)\n", flags[i].name, flags[i].value, flags[i].meaning);
  /* a framework's own unfused dequantize and KV-cache handling: printed where set */
  if (r->dequant_pass_bytes > 0)
    printf("  %-28s %g bytes/element (%s)\n", "runtime.dequant_pass_bytes", r->dequant_pass_bytes,
           "a dequantize moves this beyond reading the packed weight once");
  if (r->dequant_kernels)
    printf("  %-28s %d (%s)\n", "runtime.dequant_kernels", r->dequant_kernels, "kernels per dequantize");
  if (r->kv_expand)
    printf("  %-28s %d (%s)\n", "runtime.kv_expand", r->kv_expand,
           "a decode step expands the quantized KV cache to fp16 before attention");
  if (r->kv_full_window)
    printf("  %-28s %d (%s)\n", "runtime.kv_full_window", r->kv_full_window,
           r->kv_expand ? "a decode step expands each sequence's whole cache slot, written or not"
                        : "decode attention works over each sequence's whole cache slot, written or not");
  if (r->kv_quant_bytes > 0)
    printf("  %-28s %g bytes/element, %d kernels (%s)\n", "runtime.kv_quant_bytes", r->kv_quant_bytes,
           r->kv_quant_kernels, "quantizing each new K and V element");
  if (r->read_depth > 0) { /* its disk reader, and what it reaches on this profile's disk */
    printf("  %-28s %d%s\n", "runtime.read_threads", r->read_threads, r->read_threads ? "" : " (one per host core)");
    printf("  %-28s %d requests per thread\n", "runtime.read_depth", r->read_depth);
    if (r->read_request_bytes)
      printf("  %-28s %lld bytes\n", "runtime.read_request_bytes", (long long)r->read_request_bytes);
    else
      printf("  %-28s 0 (the disk's read-ahead window)\n", "runtime.read_request_bytes");
    if (p->has_disk) show_f("a read on this disk", ferry_hw_disk_read_gbps(p), "GB/s");
  }
  if (r->offload_min_rows)
    printf("  %-28s %lld (%s)\n", "runtime.offload_min_rows", (long long)r->offload_min_rows,
           "--offload-compute layers=auto: steps of this many rows copy host layers to the GPU, fewer run on the CPU");
  uint32_t act, dq;
  ferry_hw_profile_elem_bytes(p, &act, &dq);
  printf("  %-28s %u bytes%s\n", "runtime.act_bytes", act, r->act_bytes ? "" : " (not given: fp16/bf16)");
  printf("  %-28s %u bytes (%s)\n", "runtime.dequant_bytes", dq,
         dq ? "each low-bit weight a product reads expanded is an element of this size in the workspace"
            : "no expanded copy: fused kernels read it packed");
}

static int hw_show(const char *name) {
  ferry_hw *hw;
  if (ferry_hw_open(&hw, name) != FERRY_OK) return cli_fail(FERRY_ERR_NOT_FOUND, NULL);
  const struct ferry_hw_profile *p = ferry_hw_get(hw);
  printf("name: %s\nkind: %s\nfile: %s\n", p->name, ferry_hw_kind_name(p->kind), p->path);
  if (p->has_gpu) show_gpu(&p->gpu);
  if (p->has_link) {
    printf("link: %s\n", p->link.name);
    show_f("link.h2d_gbps", p->link.h2d_gbps, "GB/s");
    show_f("link.d2h_gbps", p->link.d2h_gbps, "GB/s");
    if (p->link.pageable_derived)
      printf("  %-28s %g GB/s (not given: %g of link.h2d_gbps)\n", "link.pageable_h2d_gbps", p->link.pageable_h2d_gbps,
             FERRY_HW_PAGEABLE_H2D_SHARE);
    else
      show_f("link.pageable_h2d_gbps", p->link.pageable_h2d_gbps, "GB/s");
    printf("  %-28s %lld ns\n", "link.latency_ns", (long long)p->link.latency_ns);
    printf("  %-28s %d%s\n", "link.copy_engines", p->link.copy_engines, p->link.copy_engines ? "" : " (unlimited)");
    if (p->link.contention > 0) printf("  %-28s %.3f\n", "link.contention", p->link.contention);
  }
  if (p->has_host) show_host(&p->host);
  if (p->has_disk) {
    printf("disk: %s\n", p->disk.name);
    show_f("disk.read_gbps", p->disk.read_gbps, "GB/s");
    printf("  %-28s %lld ns\n", "disk.latency_ns", (long long)p->disk.latency_ns);
    printf("  %-28s %d\n", "disk.queue_depth", p->disk.queue_depth);
    printf("  %-28s %lld bytes\n", "disk.read_ahead_bytes", (long long)p->disk.read_ahead_bytes);
    show_f("disk.write_gbps", p->disk.write_gbps, "GB/s");
  }
  if (p->has_runtime) show_runtime(p);
  if (p->has_interconnect) {
    const struct ferry_hw_interconnect *ic = &p->interconnect;
    printf("interconnect: %s\n", ic->name);
    printf("  %-28s %d\n", "interconnect.gpus", ic->gpus);
    show_f("interconnect.gpu_gbps", ic->gpu_gbps, "GB/s");
    printf("  %-28s %lld ns\n", "interconnect.latency_ns", (long long)ic->latency_ns);
    printf("  %-28s %d (%s)\n", "interconnect.switched", ic->switched,
           ic->switched ? "every GPU at its full rate at once" : "the GPUs share the host's PCIe fabric");
    printf("  %-28s %d (%s)\n", "interconnect.nvlink", ic->nvlink, ic->nvlink ? "NVLink" : "PCIe");
  }
  if (p->price_per_hour_usd > 0)
    printf("price_per_hour_usd: %.2f%s\n", p->price_per_hour_usd, p->has_interconnect ? " (the whole machine)" : "");
  printf("fitted from measurements:");
  if (p->n_fitted == 0) printf(" none");
  for (size_t i = 0; i < p->n_fitted; i++) printf("%s %s", i ? "," : "", p->fitted[i]);
  printf("\n");
  cli_print_bases(stdout, p);
  printf("sources:\n");
  for (size_t i = 0; i < p->n_sources; i++) {
    const struct ferry_hw_source *s = &p->sources[i];
    char value[160];
    source_value(s->value, value, sizeof value);
    printf("  %-28s %s\n    %s (%s)\n", s->figure, value, s->source, s->date);
  }
  ferry_hw_close(hw);
  return CLI_OK;
}

int cmd_hw(int argc, char **argv) {
  /* --help anywhere (ferry hw list --help) is the help; kernel has its own */
  const int kernel = argc >= 2 && !strcmp(argv[1], "kernel");
  for (int i = 1; i < argc && !kernel; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h") || (i == 1 && !strcmp(argv[i], "help"))) {
      usage(stdout);
      return CLI_OK;
    }
  if (argc < 2) return cli_usage_error("hw", "missing subcommand (list, show or kernel)");
  if (!strcmp(argv[1], "list")) {
    if (argc != 2) return cli_usage_error("hw", "list takes no arguments");
    return hw_list();
  }
  if (!strcmp(argv[1], "show")) {
    if (argc != 3) return cli_usage_error("hw", "show takes one profile name or file");
    return hw_show(argv[2]);
  }
  if (!strcmp(argv[1], "kernel")) return hw_kernel(argc - 1, argv + 1);
  return cli_usage_error("hw", "unknown subcommand '%s' (list, show or kernel)", argv[1]);
}
