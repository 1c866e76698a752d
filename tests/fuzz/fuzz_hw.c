/* Fuzz targets: a hardware profile (JSON; sections may name catalogue parts, which come from the
 * source tree's hw/), and with FUZZ_HW_NAME a profile's name as `--hw` takes it, composed
 * (`BASE+SECTION=PART`, `BASE+FIELD=VALUE`) from the catalogue. Invariants of an accepted profile:
 * every rate of a section it has is 0 (not given) or positive and finite, efficiencies in (0, 1],
 * the kind's own section present, names terminated, a derived pageable rate the share of the
 * pinned one, and the profile written back as JSON reads back to the same figures. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/calibrate.h"
#include "ferry/hw.h"
#include "sim/hw_internal.h"
#include "tests/fuzz/fuzz.h"

/* a rate is 0 (not given; ferry_hw_require() asks for it where a run needs it) or positive */
#define RATE(x) ((x) == 0 || (isfinite(x) && (x) > 0))

static void check_profile(const struct ferry_hw_profile *p) {
  FUZZ_CHECK(memchr(p->name, '\0', sizeof p->name) != NULL);
  FUZZ_CHECK(p->kind != FERRY_HW_KIND_GPU || p->has_gpu);
  FUZZ_CHECK(p->kind != FERRY_HW_KIND_LINK || p->has_link);
  FUZZ_CHECK(p->kind != FERRY_HW_KIND_DISK || p->has_disk);
  if (p->has_gpu) {
    const struct ferry_hw_gpu *g = &p->gpu;
    FUZZ_CHECK(memchr(g->name, '\0', sizeof g->name) != NULL);
    FUZZ_CHECK(RATE(g->mem_bw_gbps) && g->launch_overhead_ns >= 0);
    const double eff[] = {g->efficiency.gemm, g->efficiency.gemv, g->efficiency.attention, g->efficiency.elementwise,
                          g->efficiency.dequantize};
    for (size_t i = 0; i < sizeof eff / sizeof eff[0]; i++) FUZZ_CHECK(eff[i] > 0 && eff[i] <= 1);
    const double peaks[] = {g->peak_tflops.fp32, g->peak_tflops.fp16, g->peak_tflops.bf16, g->peak_tflops.int8};
    for (size_t i = 0; i < sizeof peaks / sizeof peaks[0]; i++) FUZZ_CHECK(RATE(peaks[i]));
    /* the launch geometry: absent, or a count, a clock and a capability the residency table knows */
    FUZZ_CHECK(g->sm_count >= 0 && RATE(g->clock_mhz));
    FUZZ_CHECK(g->compute_capability == 0 || ferry_hw_gpu_residency(g->compute_capability, NULL, NULL) == 0);
  }
  if (p->has_link) {
    FUZZ_CHECK(RATE(p->link.h2d_gbps) && RATE(p->link.d2h_gbps) && RATE(p->link.pageable_h2d_gbps));
    FUZZ_CHECK(p->link.latency_ns >= 0 && p->link.copy_engines >= 0);
    FUZZ_CHECK(!p->link.pageable_derived ||
               fabs(p->link.pageable_h2d_gbps - p->link.h2d_gbps * FERRY_HW_PAGEABLE_H2D_SHARE) <=
                   1e-12 * p->link.h2d_gbps);
  }
  if (p->has_host) {
    FUZZ_CHECK(RATE(p->host.dram_gbps) && RATE(p->host.cpu_gflops));
    FUZZ_CHECK(p->host.submit_ns >= 0 && p->host.sync_ns >= 0 && p->host.queue_wake_ns >= 0 && p->host.event_wake_ns >= 0);
    const struct ferry_hw_core_gflops *c = &p->host.core_gflops;
    FUZZ_CHECK(RATE(c->fp32) && RATE(c->fp16) && RATE(c->bf16) && RATE(c->int8) && RATE(c->amx_bf16) &&
               RATE(c->amx_int8));
    FUZZ_CHECK(p->host.cores >= 0 && p->host.sockets >= 0 && p->host.simd_bits >= 0 && p->host.cpu_op_ns >= 0);
  }
  if (p->has_runtime) {
    const struct ferry_hw_runtime *r = &p->runtime;
    FUZZ_CHECK(memchr(r->name, '\0', sizeof r->name) != NULL);
    FUZZ_CHECK((r->cpu_amx == 0 || r->cpu_amx == 1) && r->cpu_amx_min_rows >= 0);
    FUZZ_CHECK(r->cpu_fresh_alloc == 0 || r->cpu_fresh_alloc == 1);
    FUZZ_CHECK(r->kv_full_window == 0 || r->kv_full_window == 1);
    FUZZ_CHECK(r->cpu_math_eff == 0 || (r->cpu_math_eff > 0 && r->cpu_math_eff <= 1));
    FUZZ_CHECK(r->cpu_amx_eff_bf16 == 0 || (r->cpu_amx_eff_bf16 > 0 && r->cpu_amx_eff_bf16 <= 1));
    FUZZ_CHECK(r->cpu_amx_eff_int8 == 0 || (r->cpu_amx_eff_int8 > 0 && r->cpu_amx_eff_int8 <= 1));
  }
  if (p->has_interconnect) {
    const struct ferry_hw_interconnect *ic = &p->interconnect;
    FUZZ_CHECK(ic->gpus >= 1 && RATE(ic->gpu_gbps) && ic->latency_ns >= 0);
    FUZZ_CHECK((ic->switched == 0 || ic->switched == 1) && (ic->nvlink == 0 || ic->nvlink == 1));
  }
  if (p->has_disk) FUZZ_CHECK(RATE(p->disk.read_gbps) && p->disk.latency_ns >= 0 && p->disk.queue_depth >= 0);
  FUZZ_CHECK(isfinite(p->price_per_hour_usd) && p->price_per_hour_usd >= 0);
  for (int i = 0; i < FERRY_HW_COST_KINDS; i++) {
    if (!(p->cost_set & (1u << i))) continue;
    const struct ferry_hw_cost *c = &p->cost[i];
    FUZZ_CHECK(isfinite(c->overhead_ns) && isfinite(c->ns_per_byte) && isfinite(c->ns_per_flop));
    FUZZ_CHECK(ferry_hw_cost_of(p, ferry_hw_cost_kind_name(i)) == c);
  }
  for (size_t i = 0; i < p->n_sources; i++) FUZZ_CHECK(memchr(p->sources[i].figure, '\0', sizeof p->sources[i].figure));
}

/* every figure agrees between a profile and its written copy: every section, every field of the
 * reader's table (sim/hw.c), so a field added there is checked without a list here to grow */
static void check_same(const struct ferry_hw_profile *a, const struct ferry_hw_profile *b) {
  const char *differs = ferry__hw_first_difference(a, b);
  if (differs) {
    char what[160];
    snprintf(what, sizeof what, "the written profile reads back with another %s", differs);
    fuzz_fail(__FILE__, __LINE__, what);
  }
}

/* The profile a name (FUZZ_HW_NAME) or a file's contents open to; NULL when refused. A name
 * with a '/' is a file path, whose reader the file target fuzzes: skipped (it could name a
 * device that blocks). */
static ferry_hw *open_input(const uint8_t *data, size_t size) {
  ferry_hw *hw = NULL;
#ifdef FUZZ_HW_NAME
  char *name = fuzz_cstr(data, size);
  if (!name) return NULL;
  if (!strchr(name, '/') && ferry_hw_open(&hw, name) == FERRY_OK) {
    /* the profile is named by the whole text, which a name no longer than that holds */
    FUZZ_CHECK(strlen(name) < sizeof ferry_hw_get(hw)->name && !strcmp(ferry_hw_get(hw)->name, name));
  }
  free(name);
#else
  const char *written = fuzz_write("profile.json", data, size);
  if (!written) return NULL;
  char path[256];
  snprintf(path, sizeof path, "%s", written);
  if (ferry_hw_open(&hw, path) != FERRY_OK) hw = NULL;
#endif
  return hw;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ferry_hw *hw = open_input(data, size);
  if (!hw) return 0;
  const struct ferry_hw_profile *p = ferry_hw_get(hw);
  check_profile(p);
  char out[256];
  snprintf(out, sizeof out, "%s/round-trip.json", fuzz_dir());
  if (ferry_hw_write_json(p, p->fitted, p->n_fitted, "fuzz", out) == FERRY_OK) {
    ferry_hw *back = NULL;
    FUZZ_CHECK(ferry_hw_open(&back, out) == FERRY_OK);
    check_same(p, ferry_hw_get(back));
    ferry_hw_close(back);
  }
  ferry_hw_close(hw);
  return 0;
}
