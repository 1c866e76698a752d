/* Hardware profiles: every catalogue file loads and composes, the T4 profile carries the
 * FlexGen fit, ferry_hw_require() explains missing figures, malformed profiles are refused
 * with file-and-field messages, allocation failures are clean, and `ferry hw` works. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "ferry/calibrate.h"
#include "ferry/hw.h"
#include "testutil.h"

static char *hw_dir(void) {
  const char *src = getenv("FERRY_SOURCE_DIR");
  char *p = malloc(4096);
  assert_non_null(p);
  snprintf(p, 4096, "%s/hw", src ? src : ".");
  return p;
}

static void use_catalogue_only(void) {
  char *dir = hw_dir();
  setenv("FERRY_HW_PATH", dir, 1);
  free(dir);
}

/* A fresh private folder searched before the catalogue (FERRY_HW_PATH); owned: tu_rmtree + free. */
static char *private_dir_then_catalogue(const char *tag) {
  char *dir = tu_mkdtemp(tag);
  char *cat = hw_dir();
  char env[8192];
  snprintf(env, sizeof env, "%s:%s", dir, cat);
  setenv("FERRY_HW_PATH", env, 1);
  free(cat);
  return dir;
}

static const struct ferry_hw_source *find_source(const struct ferry_hw_profile *p, const char *figure, int nth) {
  for (size_t i = 0; i < p->n_sources; i++)
    if (!strcmp(p->sources[i].figure, figure) && nth-- == 0) return &p->sources[i];
  return NULL;
}

static int is_fitted(const struct ferry_hw_profile *p, const char *figure) {
  for (size_t i = 0; i < p->n_fitted; i++)
    if (!strcmp(p->fitted[i], figure)) return 1;
  return 0;
}

static void test_catalogue_loads(void **state) {
  (void)state;
  use_catalogue_only();
  char **names;
  size_t n;
  assert_int_equal(ferry_hw_list(&names, &n), FERRY_OK);
  static const char *const expect[] = {"t4",          "l4",           "rtx-3060",      "rtx-3090",      "rtx-4090",
                                       "a100-40gb-pcie", "a100-80gb-sxm", "h100-pcie",    "h100-sxm",      "h200",
                                       "v100-32gb-sxm3", "rtx-a6000",   "rtx-3090-ti",   "titan-rtx",     "titan-rtx-x2",
                                       "rtx-4090d",   "pcie3-x16",    "pcie4-x16",     "pcie5-x16",     "nvme-gen3",
                                       "nvme-gen4",   "ddr4",         "ddr5",          "xeon-6454s-1s", "xeon-6454s-2s",
                                       "eager",       "graph",        "native",        "b200",          "gh200",
                                       "h20",         "l40s",         "a10g",          "l40",           "rtx-5090",
                                       "mi300x",      "8xh100-sxm",   "4xl40s",        "ktransformers", "deepspeed-0.7",
                                       "rtx-3090-ti-wsl", "llama.cpp-2024q1", "ktransformers-v0.3", "desktop-ddr4",
                                       "desktop-ddr5",  "a40",          "8xa100-80gb-sxm", "graph-ray"};
  for (size_t e = 0; e < sizeof expect / sizeof expect[0]; e++) {
    int found = 0;
    for (size_t i = 0; i < n; i++) found |= !strcmp(names[i], expect[e]);
    if (!found) fail_msg("catalogue lacks %s", expect[e]);
  }
  for (size_t i = 1; i < n; i++) assert_true(strcmp(names[i - 1], names[i]) < 0); /* sorted, unique */
  int gpus = 0, priced = 0, machines = 0, with_geometry = 0;
  for (size_t i = 0; i < n; i++) {
    ferry_hw *hw = NULL;
    if (ferry_hw_open(&hw, names[i]) != FERRY_OK) fail_msg("%s: %s", names[i], ferry_last_error());
    const struct ferry_hw_profile *p = ferry_hw_get(hw);
    assert_string_equal(p->name, names[i]);
    assert_true(p->n_sources > 0);
    for (size_t s = 0; s < p->n_sources; s++) {
      assert_true(p->sources[s].figure[0] && p->sources[s].source[0] && p->sources[s].date[0]);
    }
    if (p->kind == FERRY_HW_KIND_GPU) {
      gpus++;
      /* a full GPU profile composes all four parts and every figure has a source */
      assert_true(p->has_gpu && p->has_link && p->has_host && p->has_disk);
      if (ferry_hw_require(p, "gpu,link,host,disk,link.pageable_h2d_gbps,host.cpu_gflops") != FERRY_OK)
        fail_msg("%s: %s", names[i], ferry_last_error());
      static const char *const documented[] = {"gpu.memory_bytes", "gpu.mem_bw_gbps", "gpu.peak_tflops.fp32",
                                                "gpu.peak_tflops.fp16", "link.h2d_gbps", "link.d2h_gbps",
                                                "host.dram_gbps", "disk.read_gbps"};
      for (size_t d = 0; d < sizeof documented / sizeof documented[0]; d++)
        if (!find_source(p, documented[d], 0)) fail_msg("%s: no source for %s", names[i], documented[d]);
      /* efficiency defaults applied */
      assert_true(p->gpu.efficiency.gemm > 0 && p->gpu.efficiency.gemm <= 1);
      assert_int_equal(p->gpu.launch_overhead_ns, 5000);
      /* every GPU profile has an on-demand price from a dated list, or a source saying why not */
      const struct ferry_hw_source *price = find_source(p, "price_per_hour_usd", 0);
      if (!price) fail_msg("%s: no source for its price (or for its absence)", names[i]);
      if (p->price_per_hour_usd > 0) {
        assert_true(strtod(price->value, NULL) == p->price_per_hour_usd);
        priced++;
      } else if (strcmp(price->value, "none") || !tu_contains(price->source, "no on-demand price")) {
        fail_msg("%s: no price and no reason (%s: %s)", names[i], price->value, price->source);
      }
      /* the launch geometry's figures come together, each with its source; only the GPUs
       * without sourced figures (and the AMD one) lack them */
      const int geometry = p->gpu.compute_capability > 0;
      assert_int_equal(p->gpu.sm_count > 0, geometry);
      assert_int_equal(p->gpu.clock_mhz > 0, geometry);
      if (geometry) {
        int32_t threads = 0, blocks = 0;
        assert_int_equal(ferry_hw_gpu_residency(p->gpu.compute_capability, &threads, &blocks), 0);
        const char *figures[] = {"gpu.sm_count", "gpu.clock_mhz", "gpu.compute_capability"};
        for (size_t f = 0; f < 3; f++)
          if (!find_source(p, figures[f], 0)) fail_msg("%s: no source for %s", names[i], figures[f]);
        with_geometry++;
      } else if (strcmp(names[i], "a10g") && strcmp(names[i], "b200") && strcmp(names[i], "h20") &&
                 strcmp(names[i], "mi300x")) {
        fail_msg("%s: no gpu.sm_count, gpu.clock_mhz and gpu.compute_capability", names[i]);
      }
      /* a multi-GPU machine documents its interconnect; one GPU has none */
      assert_int_equal(ferry_hw_gpu_count(p), p->has_interconnect ? p->interconnect.gpus : 1);
      if (p->has_interconnect) {
        if (ferry_hw_require(p, "interconnect") != FERRY_OK) fail_msg("%s: %s", names[i], ferry_last_error());
        if (!find_source(p, "interconnect.gpu_gbps", 0)) fail_msg("%s: no source for interconnect.gpu_gbps", names[i]);
        /* NVLink or PCIe picks NCCL's latencies for a collective: every machine says which */
        if (!find_source(p, "interconnect.nvlink", 0)) fail_msg("%s: no source for interconnect.nvlink", names[i]);
        assert_int_equal(p->interconnect.nvlink, strcmp(names[i], "4xl40s") != 0);
        machines++;
      } else {
        assert_int_equal(ferry_hw_require(p, "interconnect"), FERRY_ERR_NOT_FOUND);
      }
    }
    ferry_hw_close(hw);
  }
  assert_int_equal(gpus, 30); /* rtx-4090d-1s: the one-socket view of rtx-4090d; rtx-3090-ti-wsl: rtx-3090-ti
                                 under WSL2 */
  assert_int_equal(machines, 4); /* 8xh100-sxm, 8xa100-80gb-sxm, 4xl40s, v100-32gb-sxm3 (a DGX-2's 16 GPUs) */
  assert_int_equal(with_geometry, 26);
  assert_true(priced >= 20);
  ferry_hw_list_free(names, n);
  ferry_hw_list_free(NULL, 0);
  ferry_hw_close(NULL);
}

/* The residency table of the CUDA C++ Programming Guide and cuda_occupancy.h, capability by
 * capability; a capability it does not hold is refused, outputs untouched. */
static void test_gpu_residency(void **state) {
  (void)state;
  static const struct {
    double cc;
    int32_t threads, blocks;
  } want[] = {{7.0, 2048, 32}, {7.5, 1024, 16}, {8.0, 2048, 32}, {8.6, 1536, 16}, {8.7, 2048, 16},
              {8.9, 1536, 24}, {9.0, 2048, 32}, {10.0, 2048, 32}, {12.0, 1536, 24}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    int32_t threads = 0, blocks = 0;
    assert_int_equal(ferry_hw_gpu_residency(want[i].cc, &threads, &blocks), 0);
    assert_int_equal(threads, want[i].threads);
    assert_int_equal(blocks, want[i].blocks);
  }
  int32_t threads = -7, blocks = -7;
  const double refused[] = {0, -8.0, 6.1, 8.5, 8.64, 11.0, 1e300, NAN};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
    assert_int_equal(ferry_hw_gpu_residency(refused[i], &threads, &blocks), -1);
  assert_int_equal(threads, -7);
  assert_int_equal(blocks, -7);
}

static void test_t4_flexgen_fit(void **state) {
  (void)state;
  use_catalogue_only();
  ferry_hw *hw;
  assert_int_equal(ferry_hw_open(&hw, "t4"), FERRY_OK);
  const struct ferry_hw_profile *p = ferry_hw_get(hw);
  assert_int_equal(p->kind, FERRY_HW_KIND_GPU);
  assert_int_equal(p->gpu.memory_bytes, 16ull << 30);
  assert_true(p->gpu.mem_bw_gbps == 320);
  assert_true(p->gpu.peak_tflops.fp16 == 65);
  assert_true(p->gpu.peak_tflops.bf16 == 0); /* Turing has no bf16 */
  /* FlexGen's 12.89 "GB/s" is GiB/s: stored in 1e9 bytes/s */
  assert_true(fabs(p->link.h2d_gbps - 12.89 * 1.073741824) < 1e-5);
  assert_true(is_fitted(p, "link.h2d_gbps"));
  /* the disk is the device: GCP's documented local NVMe SSD rate, not FlexGen's fit of its own
   * path (0.473 GiB/s, named in the source), read ahead 8 MiB by the striped LVM volume */
  assert_true(p->disk.read_gbps == 2.65);
  assert_false(is_fitted(p, "disk.read_gbps"));
  const struct ferry_hw_source *ds = find_source(p, "disk.read_gbps", 0);
  assert_non_null(ds);
  assert_true(tu_contains(ds->source, "2,650 MB/s") && tu_contains(ds->source, "0.473 GiB/s"));
  assert_null(find_source(p, "disk.read_gbps", 1));
  assert_int_equal(p->disk.read_ahead_bytes, 8 << 20);
  assert_non_null(find_source(p, "disk.read_ahead_bytes", 0));
  assert_int_equal(p->disk.latency_ns, 80000); /* the nvme-gen3 part's */
  assert_false(is_fitted(p, "gpu.mem_bw_gbps"));
  /* the rest of the link comes from the pcie3-x16 part */
  assert_string_equal(p->link.name, "PCIe 3.0 x16");
  assert_int_equal(p->link.latency_ns, 10000);
  assert_true(p->link.pageable_h2d_gbps > 0);
  /* the part's datasheet source for h2d is replaced by the fit's */
  const struct ferry_hw_source *s = find_source(p, "link.h2d_gbps", 0);
  assert_non_null(s);
  assert_true(tu_contains(s->source, "FlexGen"));
  assert_null(find_source(p, "link.h2d_gbps", 1));
  assert_non_null(find_source(p, "link.latency_ns", 0)); /* inherited */
  assert_true(p->price_per_hour_usd > 0);
  /* require: bf16 missing */
  assert_int_equal(ferry_hw_require(p, "gpu.mem_bw_gbps, link.h2d_gbps"), FERRY_OK);
  assert_int_equal(ferry_hw_require(p, "gpu.peak_tflops.bf16"), FERRY_ERR_NOT_FOUND);
  assert_true(tu_contains(ferry_last_error(), "t4: gpu.peak_tflops.bf16 is needed"));
  assert_int_equal(ferry_hw_require(p, "gpu.warp_drive"), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "gpu.warp_drive"));
  /* readers: without a runtime a read gets the disk; FlexGen's 4 copy threads with 2 windows of
   * 8 MiB in flight each would reach 8 x 8 MiB / (80 us + 8 MiB / 2.65 GB/s) = 20.7 GB/s: the disk's
   * 2.65 bounds it; Accelerate's threads are the host's cores, which t4 does not give: the disk */
  assert_true(ferry_hw_disk_read_gbps(p) == 2.65);
  assert_int_equal(ferry_hw_set_runtime(hw, "flexgen"), FERRY_OK);
  assert_true(8.0 * (8 << 20) / (80000 + (8 << 20) / 2.65) > 20.6);
  assert_true(ferry_hw_disk_read_gbps(ferry_hw_get(hw)) == 2.65);
  assert_int_equal(ferry_hw_set_runtime(hw, "eager"), FERRY_OK);
  assert_true(ferry_hw_disk_read_gbps(ferry_hw_get(hw)) == 2.65);
  ferry_hw_close(hw);
  /* a disk given as a part has Linux's default read-ahead */
  assert_int_equal(ferry_hw_open(&hw, "rtx-a6000"), FERRY_OK);
  assert_int_equal(ferry_hw_get(hw)->disk.read_ahead_bytes, FERRY_HW_READ_AHEAD_BYTES);
  ferry_hw_close(hw);

  /* a part alone lacks the other sections */
  assert_int_equal(ferry_hw_open(&hw, "pcie4-x16"), FERRY_OK);
  p = ferry_hw_get(hw);
  assert_int_equal(p->kind, FERRY_HW_KIND_LINK);
  assert_true(fabs(p->link.h2d_gbps - 24.006) < 1e-9); /* 31.508 GB/s raw x 64/84 */
  assert_int_equal(ferry_hw_require(p, "link"), FERRY_OK);
  assert_int_equal(ferry_hw_require(p, "disk"), FERRY_ERR_NOT_FOUND);
  assert_true(tu_contains(ferry_last_error(), "no disk section"));
  ferry_hw_close(hw);

  assert_int_equal(ferry_hw_open(&hw, "h100-pcie"), FERRY_OK);
  p = ferry_hw_get(hw);
  assert_int_equal(p->gpu.memory_bytes, 80ull << 30);
  assert_true(p->gpu.mem_bw_gbps == 2000);
  assert_true(fabs(p->link.h2d_gbps - 57.07) < 1e-9); /* pcie5-x16: measured on an H100 VM (hw/pcie5-x16.json) */
  assert_true(p->host.dram_gbps == 307.2);
  ferry_hw_close(hw);
}

/* ---- malformed profiles -------------------------------------------------------------------- */

#define GPU_OK "\"gpu\": {\"name\": \"G\", \"memory_bytes\": 1024, \"mem_bw_gbps\": 100, \"peak_tflops\": {\"fp32\": 1}}"

static const struct bad_case {
  const char *file;    /* written into a temp folder */
  const char *json;
  ferry_status status;
  const char *message; /* expected substring */
} bad_cases[] = {
    /* unknown top-level field */
    {"unknown.json", "{\"name\": \"x\", \"kind\": \"gpu\", " GPU_OK ", \"colour\": 1}", FERRY_ERR_FORMAT,
     "unknown.json: unknown field colour"},
    /* unknown nested field */
    {"nested.json", "{\"name\": \"x\", \"kind\": \"gpu\", \"gpu\": {\"peak_tflops\": {\"fp64\": 9}}}", FERRY_ERR_FORMAT,
     "nested.json: unknown field gpu.peak_tflops.fp64"},
    /* wrong type for a rate */
    {"h100.json", "{\"name\": \"x\", \"kind\": \"gpu\", \"gpu\": {\"peak_tflops\": {\"fp16\": \"fast\"}}}",
     FERRY_ERR_FORMAT, "h100.json: gpu.peak_tflops.fp16 must be a number"},
    /* a fraction where an integer is required */
    {"frac.json", "{\"name\": \"x\", \"kind\": \"gpu\", \"gpu\": {\"memory_bytes\": 1.5}}", FERRY_ERR_FORMAT,
     "frac.json: gpu.memory_bytes must be an integer"},
    /* negative rate */
    {"neg.json", "{\"name\": \"x\", \"kind\": \"disk\", \"disk\": {\"read_gbps\": -3}}", FERRY_ERR_FORMAT,
     "neg.json: disk.read_gbps must be positive"},
    /* efficiency outside (0, 1] */
    {"eff.json", "{\"name\": \"x\", \"kind\": \"gpu\", \"gpu\": {\"efficiency\": {\"gemm\": 1.5}}}", FERRY_ERR_FORMAT,
     "eff.json: gpu.efficiency.gemm must be in (0, 1]"},
    /* a link whose copies would stop the kernels beside them (contention in [0, 1)) */
    {"contend.json", "{\"name\": \"x\", \"kind\": \"link\", \"link\": {\"contention\": 1}}", FERRY_ERR_FORMAT,
     "contend.json: link.contention must be in [0, 1) (got 1)"},
    /* a nested object given as a number */
    {"obj.json", "{\"name\": \"x\", \"kind\": \"gpu\", \"gpu\": {\"peak_tflops\": 5}}", FERRY_ERR_FORMAT,
     "obj.json: gpu.peak_tflops must be an object"},
    /* a section given as a number */
    {"sec.json", "{\"name\": \"x\", \"kind\": \"gpu\", \"gpu\": 5}", FERRY_ERR_FORMAT,
     "sec.json: gpu must be an object or the name of a catalogue part"},
    /* required name missing */
    {"noname.json", "{\"kind\": \"gpu\", " GPU_OK "}", FERRY_ERR_FORMAT, "noname.json: missing required field name"},
    /* required kind missing */
    {"nokind.json", "{\"name\": \"x\", " GPU_OK "}", FERRY_ERR_FORMAT, "nokind.json: missing required field kind"},
    /* kind not one of the four */
    {"kind.json", "{\"name\": \"x\", \"kind\": \"tpu\"}", FERRY_ERR_FORMAT, "kind.json: kind must be"},
    /* kind gpu without a gpu section */
    {"nogpu.json", "{\"name\": \"x\", \"kind\": \"gpu\", \"link\": \"pcie4-x16\"}", FERRY_ERR_FORMAT,
     "nogpu.json: kind \"gpu\" needs a \"gpu\" section"},
    /* a field given twice */
    {"dup.json", "{\"name\": \"x\", \"name\": \"y\", \"kind\": \"gpu\", " GPU_OK "}", FERRY_ERR_FORMAT,
     "dup.json: name is given twice"},
    /* a name too long for the profile */
    {"long.json",
     "{\"name\": \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
     "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\", \"kind\": \"gpu\"}",
     FERRY_ERR_FORMAT, "long.json: name must be at most 127 characters"},
    /* a part that does not exist */
    {"nopart.json", "{\"name\": \"x\", \"kind\": \"gpu\", " GPU_OK ", \"link\": \"pcie9-x16\"}", FERRY_ERR_NOT_FOUND,
     "nopart.json: link refers to part \"pcie9-x16\""},
    /* a part without the section asked for */
    {"wrongpart.json", "{\"name\": \"x\", \"kind\": \"gpu\", " GPU_OK ", \"link\": \"ddr4\"}", FERRY_ERR_FORMAT,
     "which has no link section"},
    /* a source entry missing its date */
    {"srcdate.json",
     "{\"name\": \"x\", \"kind\": \"gpu\", " GPU_OK
     ", \"sources\": [{\"figure\": \"gpu.mem_bw_gbps\", \"value\": 100, \"source\": \"sheet\"}]}",
     FERRY_ERR_FORMAT, "srcdate.json: missing required field sources[0].date"},
    /* a source for a field that does not exist */
    {"srcfig.json",
     "{\"name\": \"x\", \"kind\": \"gpu\", " GPU_OK
     ", \"sources\": [{\"figure\": \"gpu.speed\", \"value\": 1, \"source\": \"s\", \"date\": \"d\"}]}",
     FERRY_ERR_FORMAT, "srcfig.json: sources[0].figure \"gpu.speed\" is not a field"},
    /* a fitted mark for a figure of a section the profile lacks (fuzzing found its written copy,
     * with a source for the mark, unreadable: tests/fuzz/hw/crash-fitted-absent-section) */
    {"fitsec.json", "{\"name\": \"x\", \"kind\": \"gpu\", " GPU_OK ", \"fitted\": [\"disk.read_gbps\"]}",
     FERRY_ERR_FORMAT, "fitsec.json: fitted[0] names disk.read_gbps but the profile has no disk section"},
    /* a source whose number disagrees with the profile */
    {"srcval.json",
     "{\"name\": \"x\", \"kind\": \"gpu\", " GPU_OK
     ", \"sources\": [{\"figure\": \"gpu.mem_bw_gbps\", \"value\": 101, \"source\": \"s\", \"date\": \"d\"}]}",
     FERRY_ERR_FORMAT, "srcval.json: sources[0].value 101 does not match gpu.mem_bw_gbps = 100"},
    /* fitted naming an unknown field */
    {"fit.json", "{\"name\": \"x\", \"kind\": \"gpu\", " GPU_OK ", \"fitted\": [\"gpu.magic\"]}", FERRY_ERR_FORMAT,
     "fit.json: fitted[0] \"gpu.magic\" is not a field"},
    /* not JSON */
    {"broken.json", "{\"name\": \"x\", ", FERRY_ERR_FORMAT, "broken.json: invalid JSON at byte"},
    /* not an object */
    {"array.json", "[1, 2]", FERRY_ERR_FORMAT, "array.json: a hardware profile must be a JSON object"},
    /* parts that refer to each other */
    {"cycle-a.json", "{\"name\": \"cycle-a\", \"kind\": \"link\", \"link\": {\"base\": \"cycle-b\"}}", FERRY_ERR_FORMAT,
     "levels deep"},
    /* a runtime flag that is not 0 or 1 */
    {"rtflag.json", "{\"name\": \"x\", \"kind\": \"runtime\", \"runtime\": {\"fused_dequant\": 2}}", FERRY_ERR_FORMAT,
     "rtflag.json: runtime.fused_dequant must be 0 or 1 (got 2)"},
    /* an activation element that is neither fp16/bf16 nor fp32 */
    {"rtact.json", "{\"name\": \"x\", \"kind\": \"runtime\", \"runtime\": {\"act_bytes\": 1}}", FERRY_ERR_FORMAT,
     "rtact.json: runtime.act_bytes must be 2 (fp16/bf16) or 4 (fp32) (got 1)"},
    /* a compute capability the residency table does not hold (Pascal), and none at all */
    {"cc.json", "{\"name\": \"x\", \"kind\": \"gpu\", \"gpu\": {\"compute_capability\": 6.1}}", FERRY_ERR_FORMAT,
     "cc.json: gpu.compute_capability must be a CUDA compute capability ferry knows: 7.0, 7.2, 7.5, 8.0, 8.6, 8.7, "
     "8.9, 9.0, 10.0 or 12.0 (got 6.1)"},
    {"cc0.json", "{\"name\": \"x\", \"kind\": \"gpu\", \"gpu\": {\"compute_capability\": 0}}", FERRY_ERR_FORMAT,
     "cc0.json: gpu.compute_capability must be a CUDA compute capability ferry knows"},
    {"sm.json", "{\"name\": \"x\", \"kind\": \"gpu\", \"gpu\": {\"sm_count\": 1.5}}", FERRY_ERR_FORMAT,
     "sm.json: gpu.sm_count must be an integer"},
    /* kind runtime without a runtime section */
    {"nort.json", "{\"name\": \"x\", \"kind\": \"runtime\"}", FERRY_ERR_FORMAT,
     "nort.json: kind \"runtime\" needs a \"runtime\" section"},
    /* queue depth zero */
    {"qd.json", "{\"name\": \"x\", \"kind\": \"disk\", \"disk\": {\"read_gbps\": 1, \"queue_depth\": 0}}",
     FERRY_ERR_FORMAT, "qd.json: disk.queue_depth must be positive"},
    /* no read-ahead window, a negative reader */
    {"ra.json", "{\"name\": \"x\", \"kind\": \"disk\", \"disk\": {\"read_gbps\": 1, \"read_ahead_bytes\": 0}}",
     FERRY_ERR_FORMAT, "ra.json: disk.read_ahead_bytes must be positive"},
    {"rdt.json", "{\"name\": \"x\", \"kind\": \"runtime\", \"runtime\": {\"read_threads\": -1}}", FERRY_ERR_FORMAT,
     "rdt.json: runtime.read_threads must be >= 0"},
    /* a multi-GPU machine must say how many GPUs it has */
    {"nogpus.json", "{\"name\": \"x\", \"kind\": \"gpu\", " GPU_OK ", \"interconnect\": {\"gpu_gbps\": 450}}",
     FERRY_ERR_FORMAT, "nogpus.json: interconnect.gpus is required"},
    {"zerogpus.json", "{\"name\": \"x\", \"kind\": \"gpu\", " GPU_OK ", \"interconnect\": {\"gpus\": 0}}",
     FERRY_ERR_FORMAT, "zerogpus.json: interconnect.gpus must be positive"},
    {"switched.json", "{\"name\": \"x\", \"kind\": \"gpu\", " GPU_OK ", \"interconnect\": {\"gpus\": 2, \"switched\": 2}}",
     FERRY_ERR_FORMAT, "switched.json: interconnect.switched must be 0 or 1"},
};

/* The figures that set one runtime preset apart from the others, each with its source where it
 * is set (name: the preset's catalogue name). */
static void check_preset_figures(const struct ferry_hw_profile *p, const char *name) {
  /* ZeRO-3's 2022 parameter path is the one preset that gathers, splits, reads after its copies and
   * blocks */
  const int zero3 = !strcmp(name, "deepspeed-0.7");
  assert_int_equal(p->runtime.gather_copy, zero3);
  assert_int_equal(p->runtime.split_copy, zero3);
  assert_int_equal(p->runtime.read_after_copy, zero3);
  assert_int_equal(p->runtime.blocking_copy, zero3);
  if (zero3 && (!find_source(p, "runtime.gather_copy", 0) || !find_source(p, "runtime.split_copy", 0) ||
                !find_source(p, "runtime.read_after_copy", 0) ||
                !find_source(p, "runtime.blocking_copy", 0)))
    fail_msg("deepspeed-0.7: its ZeRO-3 figures lack a source");
  /* llama.cpp of early 2024 is the one that gathers routed rows one copy at a time */
  const int rowcopy = !strcmp(name, "llama.cpp-2024q1");
  assert_int_equal(p->runtime.moe_row_copy, rowcopy);
  if (rowcopy && !find_source(p, "runtime.moe_row_copy", 0)) fail_msg("llama.cpp-2024q1: moe_row_copy lacks a source");
  /* llama.cpp of early 2025 multiplies k-quants on the CPU by ggml's vec_dot, slower than the
   * tiled Q4_0 products native's efficiency was derived from: its own figure, with a source */
  if (!strcmp(name, "llama.cpp-2025q1")) {
    assert_true(p->runtime.cpu_math_eff > 0 && p->runtime.cpu_math_eff < 0.26);
    const struct ferry_hw_source *eff = find_source(p, "runtime.cpu_math_eff", 0);
    if (!eff || !strstr(eff->source, "vec_dot")) fail_msg("llama.cpp-2025q1: cpu_math_eff lacks its source");
    assert_null(find_source(p, "runtime.cpu_math_eff", 1)); /* native's goes with the figure it replaces */
  }
  /* FlexGen is the one that dequantizes with separate ops and expands and compresses its int4
   * cache itself: each figure counted from its code, with a source */
  const int flexgen = !strcmp(name, "flexgen");
  assert_int_equal(p->runtime.kv_expand, flexgen);
  assert_int_equal(p->runtime.dequant_pass_bytes > 0, flexgen);
  assert_int_equal(p->runtime.dequant_kernels > 1, flexgen);
  assert_int_equal(p->runtime.kv_quant_bytes > 0 && p->runtime.kv_quant_kernels > 0, flexgen);
  static const char *const fg[] = {"runtime.dequant_pass_bytes", "runtime.dequant_kernels", "runtime.kv_expand",
                                   "runtime.kv_quant_bytes", "runtime.kv_quant_kernels"};
  for (size_t f = 0; flexgen && f < sizeof fg / sizeof fg[0]; f++)
    if (!find_source(p, fg[f], 0)) fail_msg("flexgen: no source for %s", fg[f]);
  /* the PyTorch stacks describe how they read from disk, each figure from their code: DeepSpeed's
   * aio (one thread, 8 requests of 1 MiB), FlexGen's 4 copy threads and Accelerate's intra-op
   * threads faulting memory maps in (2 read-ahead windows each) */
  const int ds = zero3 || !strcmp(name, "zero-inference-kv"), paged = flexgen || !strcmp(name, "eager");
  assert_int_equal(p->runtime.read_depth, ds ? 8 : paged ? 2 : 0);
  assert_int_equal(p->runtime.read_threads, ds ? 1 : flexgen ? 4 : 0);
  assert_int_equal(p->runtime.read_request_bytes, ds ? 1 << 20 : 0);
  static const char *const rd[] = {"runtime.read_threads", "runtime.read_depth", "runtime.read_request_bytes"};
  for (size_t f = 0; (ds || paged) && f < sizeof rd / sizeof rd[0]; f++)
    if (!find_source(p, rd[f], 0)) fail_msg("%s: no source for %s", name, rd[f]);
  /* ktransformers' v0.3 preview is the one whose CPU experts run on AMX tiles */
  const int amx = !strcmp(name, "ktransformers-v0.3");
  assert_int_equal(p->runtime.cpu_amx, amx);
  if (amx && !find_source(p, "runtime.cpu_amx", 0)) fail_msg("ktransformers-v0.3: cpu_amx lacks a source");
  assert_int_equal(p->runtime.cpu_amx_min_rows, amx ? 5 : 0); /* AMX.md: more than 4 tokens per expert */
  if (amx && !find_source(p, "runtime.cpu_amx_min_rows", 0)) fail_msg("ktransformers-v0.3: cpu_amx_min_rows lacks a source");
  /* the KV-offload fork and FlexGen (--cpu: its fp32 workspace) are the ones whose CPU attention
   * converts an fp16 cache to fp32 first */
  const int upcast = !strcmp(name, "zero-inference-kv") || flexgen;
  assert_int_equal(p->runtime.cpu_kv_upcast, upcast);
  if (upcast && !find_source(p, "runtime.cpu_kv_upcast", 0)) fail_msg("%s: cpu_kv_upcast lacks a source", name);
  /* both preallocate each sequence's cache for its longest length; FlexGen expands all of it in
   * decode, the fork hands each layer the slice written so far: each says which with a source */
  assert_int_equal(p->runtime.kv_full_window, flexgen);
  if (upcast && !find_source(p, "runtime.kv_full_window", 0)) fail_msg("%s: kv_full_window lacks a source", name);
  /* the PyTorch stacks allocate their CPU ops' temporaries fresh (c10 alloc_cpu, glibc's mmap
   * threshold, pages the kernel zeroes); llama.cpp's and ktransformers' CPU buffers are planned
   * once and reused, and so is FlexGen's CPU attention workspace: each says so with a source,
   * vLLM's graph replays compute nothing on the CPU */
  const int torch = (paged || ds) && !flexgen;
  assert_int_equal(p->runtime.cpu_fresh_alloc, torch);
  if (strcmp(name, "graph") && strcmp(name, "graph-ray") && !find_source(p, "runtime.cpu_fresh_alloc", 0))
    fail_msg("%s: cpu_fresh_alloc lacks a source", name);
  /* the graph-replaying engines run a prefilling step eagerly (vLLM before V1, ktransformers):
   * a per-kernel host time for those steps, with its source; the others launch alike in every step */
  const int eager_prefill = !strcmp(name, "graph") || !strcmp(name, "graph-ray") || !strncmp(name, "ktransformers", 13);
  assert_int_equal(p->runtime.prefill_launch_ns > 0, eager_prefill);
  if (eager_prefill && !find_source(p, "runtime.prefill_launch_ns", 0)) fail_msg("%s: prefill_launch_ns lacks a source", name);
  /* the engine whose other GPUs are Ray workers is the one a step on several GPUs costs more:
   * graph's figures and that one, with its source */
  const int ray = !strcmp(name, "graph-ray");
  assert_int_equal(p->runtime.worker_step_ns > 0, ray);
  if (ray && !find_source(p, "runtime.worker_step_ns", 0)) fail_msg("graph-ray: worker_step_ns lacks a source");
  if (ray) {
    ferry_hw *graph = NULL;
    assert_int_equal(ferry_hw_open(&graph, "graph"), FERRY_OK);
    const struct ferry_hw_runtime *g = &ferry_hw_get(graph)->runtime;
    assert_true(g->step_ns == p->runtime.step_ns && g->row_ns == p->runtime.row_ns && g->launch_ns == p->runtime.launch_ns);
    assert_non_null(find_source(p, "runtime.step_ns", 0)); /* graph's sources come with its figures */
    ferry_hw_close(graph);
  }
}

/* Runtime presets: the catalogue's eleven, applied to a GPU profile with their sources (and
 * replacing a runtime the profile had); a profile that is not a runtime is refused. */
static void test_runtime_presets(void **state) {
  (void)state;
  use_catalogue_only();
  static const char *const presets[] = {"eager",         "graph",        "native",
                                        "ktransformers", "deepspeed-0.7", "llama.cpp-2024q1", "flexgen",
                                        "zero-inference-kv", "ktransformers-v0.3", "llama.cpp-2025q1", "graph-ray"};
  for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
    ferry_hw *rt = NULL;
    if (ferry_hw_open(&rt, presets[i]) != FERRY_OK) fail_msg("%s: %s", presets[i], ferry_last_error());
    const struct ferry_hw_profile *p = ferry_hw_get(rt);
    assert_int_equal(p->kind, FERRY_HW_KIND_RUNTIME);
    assert_true(p->has_runtime && !p->has_gpu);
    static const char *const figures[] = {"runtime.launch_ns", "runtime.copy_ns", "runtime.layer_ns",
                                          "runtime.step_ns", "runtime.row_ns", "runtime.fused_dequant",
                                          "runtime.sync_fetch", "runtime.numa_blind"};
    for (size_t f = 0; f < 8; f++)
      if (!find_source(p, figures[f], 0)) fail_msg("%s: no source for %s", presets[i], figures[f]);
    check_preset_figures(p, presets[i]);
    ferry_hw_close(rt);
  }
  ferry_hw *hw = NULL;
  assert_int_equal(ferry_hw_open(&hw, "h100-pcie"), FERRY_OK);
  assert_false(ferry_hw_get(hw)->has_runtime);
  size_t before = ferry_hw_get(hw)->n_sources;
  assert_int_equal(ferry_hw_set_runtime(hw, "eager"), FERRY_OK);
  const struct ferry_hw_profile *p = ferry_hw_get(hw);
  assert_true(p->has_runtime);
  assert_int_equal(p->runtime.fused_dequant, 0);
  assert_true(p->runtime.launch_ns > 0 && p->runtime.layer_ns > 0 && p->runtime.step_ns > 0);
  /* HF transformers repeats grouped K and V per query head: a figure with its source */
  assert_int_equal(p->runtime.attn_repeat_kv, 1);
  assert_non_null(find_source(p, "runtime.attn_repeat_kv", 0));
  /* fp16 activations and an fp16 dequantized copy, each with its source */
  assert_true(p->runtime.act_bytes == 2 && p->runtime.dequant_bytes == 2);
  assert_non_null(find_source(p, "runtime.act_bytes", 0));
  assert_non_null(find_source(p, "runtime.dequant_bytes", 0));
  /* the model's own host waits (HF's code copying CPU-made tensors), with its source */
  assert_int_equal(p->runtime.model_syncs, 1);
  assert_non_null(find_source(p, "runtime.model_syncs", 0));
  assert_int_equal(p->n_sources, before + 16); /* eager's 16 figures, cpu_fresh_alloc among them */
  assert_true(p->gpu.mem_bw_gbps == 2000); /* the rest untouched */
  /* another preset replaces it, sources included */
  assert_int_equal(ferry_hw_set_runtime(hw, "graph"), FERRY_OK);
  p = ferry_hw_get(hw);
  assert_int_equal(p->runtime.launch_ns, 0);
  assert_int_equal(p->runtime.fused_dequant, 1);
  assert_int_equal(p->n_sources, before + 10); /* graph's 10, prefill_launch_ns among them */
  /* not a runtime */
  assert_int_equal(ferry_hw_set_runtime(hw, "pcie4-x16"), FERRY_ERR_INVALID);
  assert_true(strstr(ferry_last_error(), "pcie4-x16 is a link profile, not a runtime") != NULL);
  assert_int_equal(ferry_hw_set_runtime(hw, "no-such-runtime"), FERRY_ERR_NOT_FOUND);
  assert_int_equal(ferry_hw_get(hw)->runtime.launch_ns, 0); /* unchanged by the failures */
  ferry_hw_close(hw);
}

/* The Xeon Gold 6454S profiles give AMX peaks per core (2.2 GHz x 1024 bf16 flops and x 2048 int8
 * ops per cycle), each with a source; a host without AMX leaves them 0, and a GPU profile on the
 * 6454S host carries them. */
static void test_host_amx(void **state) {
  (void)state;
  use_catalogue_only();
  static const char *const names[] = {"xeon-6454s-1s", "xeon-6454s-2s", "rtx-4090d"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    ferry_hw *hw = NULL;
    if (ferry_hw_open(&hw, names[i]) != FERRY_OK) fail_msg("%s: %s", names[i], ferry_last_error());
    const struct ferry_hw_profile *p = ferry_hw_get(hw);
    assert_true(fabs(p->host.core_gflops.amx_bf16 - 2.2 * 1024) < 1e-9);
    assert_true(fabs(p->host.core_gflops.amx_int8 - 2.2 * 2048) < 1e-9);
    if (!find_source(p, "host.core_gflops.amx_bf16", 0) || !find_source(p, "host.core_gflops.amx_int8", 0))
      fail_msg("%s: an AMX peak lacks a source", names[i]);
    ferry_hw_close(hw);
  }
  ferry_hw *hw = NULL;
  assert_int_equal(ferry_hw_open(&hw, "ddr5"), FERRY_OK);
  assert_true(ferry_hw_get(hw)->host.core_gflops.amx_int8 == 0 && ferry_hw_get(hw)->host.core_gflops.amx_bf16 == 0);
  ferry_hw_close(hw);
}

/* BASE+SECTION=PART: the base profile with whole sections, and their sources, from other parts,
 * as a buyer swaps the CPU, the link or the disk beside one GPU. */
static void test_compose_parts(void **state) {
  (void)state;
  use_catalogue_only();
  ferry_hw *base = NULL, *xeon = NULL, *gen3 = NULL, *hw = NULL;
  assert_int_equal(ferry_hw_open(&base, "h100-pcie"), FERRY_OK);
  assert_int_equal(ferry_hw_open(&xeon, "xeon-6454s-2s"), FERRY_OK);
  assert_int_equal(ferry_hw_open(&gen3, "pcie3-x16"), FERRY_OK);
  assert_int_equal(ferry_hw_open(&hw, "h100-pcie+host=xeon-6454s-2s+link=pcie3-x16"), FERRY_OK);
  const struct ferry_hw_profile *p = ferry_hw_get(hw), *b = ferry_hw_get(base);
  assert_string_equal(p->name, "h100-pcie+host=xeon-6454s-2s+link=pcie3-x16");
  assert_int_equal(p->host.cores, 64); /* the base's host names no cores */
  assert_int_equal(b->host.cores, 0);
  assert_true(p->host.core_gflops.amx_int8 == ferry_hw_get(xeon)->host.core_gflops.amx_int8);
  assert_true(p->host.memory_bytes == ferry_hw_get(xeon)->host.memory_bytes);
  assert_true(p->link.h2d_gbps == ferry_hw_get(gen3)->link.h2d_gbps && p->link.h2d_gbps < b->link.h2d_gbps);
  /* what was not named stays the base's */
  assert_true(p->gpu.mem_bw_gbps == b->gpu.mem_bw_gbps && p->disk.read_gbps == b->disk.read_gbps);
  assert_true(p->price_per_hour_usd == b->price_per_hour_usd);
  /* each figure's source is the part's: the Xeon's DRAM source, and only one per figure */
  const struct ferry_hw_source *dram = find_source(p, "host.dram_gbps", 0);
  assert_non_null(dram);
  assert_string_equal(dram->source, find_source(ferry_hw_get(xeon), "host.dram_gbps", 0)->source);
  assert_null(find_source(p, "host.dram_gbps", 1));
  assert_non_null(find_source(p, "gpu.mem_bw_gbps", 0));
  ferry_hw_close(hw);
  /* a figure of the base's host fitted to measurements goes with its host, the link's stays */
  assert_int_equal(ferry_hw_open(&hw, "t4+host=xeon-6454s-2s"), FERRY_OK);
  assert_false(is_fitted(ferry_hw_get(hw), "host.cpu_gflops"));
  assert_true(is_fitted(ferry_hw_get(hw), "link.h2d_gbps"));
  ferry_hw_close(hw);
  /* FIELD=VALUE sets one figure, its source the name; sizes take units; a fitted mark goes */
  assert_int_equal(ferry_hw_open(&hw, "t4+host.memory_bytes=256GiB+link.h2d_gbps=20"), FERRY_OK);
  p = ferry_hw_get(hw);
  assert_true(p->host.memory_bytes == 256ull << 30 && p->link.h2d_gbps == 20);
  assert_false(is_fitted(p, "link.h2d_gbps"));
  assert_true(is_fitted(p, "link.d2h_gbps") && is_fitted(p, "host.cpu_gflops"));
  const struct ferry_hw_source *given = find_source(p, "link.h2d_gbps", 0);
  assert_non_null(given);
  assert_string_equal(given->value, "20");
  assert_true(strstr(given->source, "t4+host.memory_bytes=256GiB+link.h2d_gbps=20") != NULL);
  assert_null(find_source(p, "link.h2d_gbps", 1));
  assert_string_equal(find_source(p, "host.memory_bytes", 0)->value, "256GiB");
  ferry_hw_close(hw);
  /* the runtime is a part like the others */
  assert_int_equal(ferry_hw_open(&hw, "h100-pcie+runtime=graph"), FERRY_OK);
  assert_true(ferry_hw_get(hw)->has_runtime && ferry_hw_get(hw)->runtime.fused_dequant == 1);
  assert_int_equal(ferry_hw_get(hw)->runtime.attn_fa2_kvcache, 0);
  ferry_hw_close(hw);
  /* and a runtime's figure after it (the kernel sets' Sarathi-Serve attention) */
  assert_int_equal(ferry_hw_open(&hw, "a100-80gb-sxm+runtime=graph+runtime.attn_fa2_kvcache=1"), FERRY_OK);
  assert_int_equal(ferry_hw_get(hw)->runtime.attn_fa2_kvcache, 1);
  ferry_hw_close(hw);
  /* bytes per element are a number, not a byte count: a fraction stays (a sensitivity study
   * scales runtime.dequant_pass_bytes 12.5 to 11.25; it was refused as a fractional size) */
  assert_int_equal(ferry_hw_open(&hw, "t4+runtime=flexgen+runtime.dequant_pass_bytes=11.25+runtime.kv_quant_bytes=22.95"),
                   FERRY_OK);
  assert_true(ferry_hw_get(hw)->runtime.dequant_pass_bytes == 11.25 && ferry_hw_get(hw)->runtime.kv_quant_bytes == 22.95);
  assert_string_equal(find_source(ferry_hw_get(hw), "runtime.dequant_pass_bytes", 0)->value, "11.25");
  ferry_hw_close(hw);
  /* bad compositions say what is wrong, and leave no handle */
  static const struct {
    const char *name;
    ferry_status st;
    const char *says;
  } bad[] = {
      {"h100-pcie+gpu=l4", FERRY_ERR_INVALID, "is not SECTION=PART"},
      {"h100-pcie+gpu.name=x", FERRY_ERR_INVALID, "nor FIELD=VALUE"},
      {"h100-pcie+host.memory_bytes=lots", FERRY_ERR_INVALID, "not a size"},
      {"h100-pcie+link.h2d_gbps=fast", FERRY_ERR_INVALID, "not a number"},
      {"h100-pcie+link.h2d_gbps=-1", FERRY_ERR_FORMAT, "link.h2d_gbps must be positive"},
      {"h100-pcie+link.copy_engines=1.5", FERRY_ERR_INVALID, "must be an integer"},
      {"h100-pcie+gpu.compute_capability=6.1", FERRY_ERR_FORMAT,
       "gpu.compute_capability must be a CUDA compute capability ferry knows"},
      {"h100-pcie+gpu.sm_count=0", FERRY_ERR_FORMAT, "gpu.sm_count must be positive"},
      {"h100-pcie+runtime=graph+runtime.attn_fa2_kvcache=2", FERRY_ERR_FORMAT, "runtime.attn_fa2_kvcache"},
      /* a fraction of a byte would be cut off, and the name, the figure's source, would disagree
       * with it (fuzzing: hw_name/crash-fractional-bytes) */
      {"l4+host.memory_bytes=4.5", FERRY_ERR_INVALID, "a byte count must be whole"},
      {"t4+runtime=flexgen+runtime.dequant_pass_bytes=1GiB", FERRY_ERR_INVALID, "not a number"},
      {"h100-pcie+interconnect.gpus=2", FERRY_ERR_INVALID, "no interconnect section"},
      {"h100-pcie+host=pcie4-x16", FERRY_ERR_INVALID, "pcie4-x16 is a link profile with no host section"},
      {"h100-pcie+host=no-such-part", FERRY_ERR_NOT_FOUND, "no-such-part"},
      {"no-such-gpu+host=ddr4", FERRY_ERR_NOT_FOUND, "no-such-gpu"},
      {"h100-pcie+", FERRY_ERR_INVALID, "is not SECTION=PART"},
      {"h100-pcie++host=ddr4", FERRY_ERR_INVALID, "is not SECTION=PART"},
      {"h100-pcie+host=xeon-6454s-2s+link=pcie3-x16+disk=nvme-gen3+runtime=ktransformers-v0.3+host=ddr4+link=pcie4-x16+disk=nvme-gen4+runtime=eager",
       FERRY_ERR_INVALID, "longer than 127"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    hw = (ferry_hw *)1;
    const ferry_status st = ferry_hw_open(&hw, bad[i].name);
    if (st != bad[i].st) fail_msg("%s: %s (%s)", bad[i].name, ferry_status_name(st), ferry_last_error());
    assert_null(hw);
    if (!strstr(ferry_last_error(), bad[i].says)) fail_msg("%s: %s", bad[i].name, ferry_last_error());
  }
  ferry_hw_close(base);
  ferry_hw_close(xeon);
  ferry_hw_close(gen3);
}

/* A link that does not give its pageable rate gets half of its own pinned rate (the profile's,
 * after its overrides), and that figure follows the pinned rate set by a composed name or
 * ferry_hw_link_set_h2d(); a given pageable rate stays. */
static const struct ferry_hw_figure *find_figure(const struct ferry_hw_figure *v, size_t n, const char *path) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(v[i].path, path)) return &v[i];
  return NULL;
}

/* ferry_hw_figures(): the rates, times and efficiencies a sensitivity study scales, each with
 * what it rests on; ferry_hw_set_figure() sets one as a composed name would. */
static void test_figures(void **state) {
  (void)state;
  use_catalogue_only();
  ferry_hw *hw = NULL;
  assert_int_equal(ferry_hw_open(&hw, "rtx-a6000"), FERRY_OK);
  assert_int_equal(ferry_hw_set_runtime(hw, "eager"), FERRY_OK);
  struct ferry_hw_figure *v = NULL;
  size_t n = 0;
  assert_int_equal(ferry_hw_figures(ferry_hw_get(hw), &v, &n), FERRY_OK);
  assert_true(n > 10);
  const struct ferry_hw_figure *f = find_figure(v, n, "link.h2d_gbps");
  assert_non_null(f);
  assert_true(f->value == 24.006 && f->basis == FERRY_HW_BASIS_SOURCED && !f->integer && f->source[0]);
  f = find_figure(v, n, "link.pageable_h2d_gbps");
  assert_true(f && f->basis == FERRY_HW_BASIS_DERIVED);
  f = find_figure(v, n, "host.cpu_gflops"); /* the ddr4 part's rough CPU */
  assert_true(f && f->basis == FERRY_HW_BASIS_DEFAULT && !strncmp(f->source, "ferry default", 13));
  f = find_figure(v, n, "gpu.efficiency.gemm"); /* not in the file: the reader's default */
  assert_true(f && f->basis == FERRY_HW_BASIS_DEFAULT && f->value == 0.7);
  f = find_figure(v, n, "runtime.launch_ns");
  assert_true(f && f->basis == FERRY_HW_BASIS_ESTIMATE && f->integer && f->value == 15000);
  assert_string_equal(ferry_hw_basis_name(FERRY_HW_BASIS_ESTIMATE), "estimate");
  for (size_t i = 0; i < n; i++) {
    const size_t len = strlen(v[i].path);
    assert_true(v[i].value > 0);
    assert_false(len > 6 && !strcmp(v[i].path + len - 6, "_bytes")); /* capacities decide what fits, not speed */
    assert_false(strstr(v[i].path, "price") || strstr(v[i].path, "copy_engines") || strstr(v[i].path, "queue_depth"));
    if (v[i].integer) assert_true(len > 3 && !strcmp(v[i].path + len - 3, "_ns"));
  }
  assert_null(find_figure(v, n, "interconnect.gpu_gbps")); /* a section the profile lacks */
  /* every figure listed can be set: it then reads back, given (sourced) */
  for (size_t i = 0; i < n; i++) {
    ferry_hw *h = NULL;
    assert_int_equal(ferry_hw_open(&h, "rtx-a6000"), FERRY_OK);
    assert_int_equal(ferry_hw_set_runtime(h, "eager"), FERRY_OK);
    char text[64];
    if (v[i].integer) snprintf(text, sizeof text, "%lld", (long long)(v[i].value * 0.9));
    else snprintf(text, sizeof text, "%.17g", v[i].value * 0.9);
    assert_int_equal(ferry_hw_set_figure(h, v[i].path, text), FERRY_OK);
    struct ferry_hw_figure *w = NULL;
    size_t m = 0;
    assert_int_equal(ferry_hw_figures(ferry_hw_get(h), &w, &m), FERRY_OK);
    const struct ferry_hw_figure *g = find_figure(w, m, v[i].path);
    assert_non_null(g);
    assert_true(g->value == strtod(text, NULL));
    assert_int_equal(g->basis, FERRY_HW_BASIS_SOURCED);
    if (!strcmp(v[i].path, "link.h2d_gbps")) /* the derived pageable rate follows */
      assert_true(fabs(find_figure(w, m, "link.pageable_h2d_gbps")->value - g->value * FERRY_HW_PAGEABLE_H2D_SHARE) < 1e-9);
    ferry_hw_figures_free(w);
    ferry_hw_close(h);
  }
  ferry_hw_figures_free(v);
  /* what cannot be set says why */
  assert_int_equal(ferry_hw_set_figure(hw, "gpu.name", "x"), FERRY_ERR_INVALID);
  assert_int_equal(ferry_hw_set_figure(hw, "gpu.no_such_rate", "1"), FERRY_ERR_INVALID);
  assert_int_equal(ferry_hw_set_figure(hw, "link.h2d_gbps", "fast"), FERRY_ERR_INVALID);
  assert_int_equal(ferry_hw_set_figure(hw, "link.h2d_gbps", "-3"), FERRY_ERR_FORMAT);
  assert_int_equal(ferry_hw_set_figure(hw, "interconnect.gpu_gbps", "100"), FERRY_ERR_INVALID);
  assert_int_equal(ferry_hw_set_figure(hw, NULL, "1"), FERRY_ERR_INVALID);
  assert_int_equal(ferry_hw_figures(NULL, &v, &n), FERRY_ERR_INVALID);
  ferry_hw_close(hw);
}

static void test_pageable_derived(void **state) {
  (void)state;
  use_catalogue_only();
  ferry_hw *hw = NULL;
  assert_int_equal(ferry_hw_open(&hw, "rtx-a6000"), FERRY_OK);
  const struct ferry_hw_profile *p = ferry_hw_get(hw);
  assert_true(p->link.pageable_derived);
  assert_true(fabs(p->link.pageable_h2d_gbps - 24.006 * FERRY_HW_PAGEABLE_H2D_SHARE) < 1e-9);
  assert_non_null(find_source(p, "link.pageable_h2d_gbps", 0)); /* the part documents the rule */
  ferry_hw_close(hw);
  /* t4 gives it: half of its PCIe 3.0 part's rate, not of FlexGen's fitted constant */
  assert_int_equal(ferry_hw_open(&hw, "t4"), FERRY_OK);
  p = ferry_hw_get(hw);
  assert_true(p->link.h2d_gbps > 13.8 && p->link.h2d_gbps < 13.9);
  assert_true(p->link.pageable_h2d_gbps == 6.002 && !p->link.pageable_derived);
  ferry_hw_close(hw);
  assert_int_equal(ferry_hw_open(&hw, "rtx-a6000+link.h2d_gbps=20"), FERRY_OK);
  p = ferry_hw_get(hw);
  assert_true(p->link.h2d_gbps == 20 && fabs(p->link.pageable_h2d_gbps - 10) < 1e-9 && p->link.pageable_derived);
  ferry_hw_close(hw);
  /* given in the name, before or after: it stays */
  assert_int_equal(ferry_hw_open(&hw, "rtx-a6000+link.pageable_h2d_gbps=14+link.h2d_gbps=20"), FERRY_OK);
  p = ferry_hw_get(hw);
  assert_true(p->link.h2d_gbps == 20 && p->link.pageable_h2d_gbps == 14 && !p->link.pageable_derived);
  ferry_hw_close(hw);
  assert_int_equal(ferry_hw_open(&hw, "rtx-a6000+link.h2d_gbps=20+link.pageable_h2d_gbps=14"), FERRY_OK);
  assert_true(ferry_hw_get(hw)->link.pageable_h2d_gbps == 14);
  ferry_hw_close(hw);
  /* a link that gives it keeps it (gh200's NVLink-C2C) */
  assert_int_equal(ferry_hw_open(&hw, "gh200"), FERRY_OK);
  p = ferry_hw_get(hw);
  assert_true(!p->link.pageable_derived && p->link.pageable_h2d_gbps == 225 && p->link.h2d_gbps == 450);
  ferry_hw_close(hw);
  /* so does a file that gives it over a part's link, and one that overrides only h2d derives */
  char *dir = private_dir_then_catalogue("hwpageable");
  char path[4096];
  snprintf(path, sizeof path, "%s/given.json", dir);
  const char *given = "{\"name\": \"given\", \"kind\": \"link\", \"link\": {\"base\": \"pcie4-x16\", "
                      "\"pageable_h2d_gbps\": 9}}";
  tu_write_file(path, given, strlen(given));
  snprintf(path, sizeof path, "%s/slower.json", dir);
  const char *slower = "{\"name\": \"slower\", \"kind\": \"link\", \"link\": {\"base\": \"pcie4-x16\", "
                       "\"h2d_gbps\": 18}}";
  tu_write_file(path, slower, strlen(slower));
  assert_int_equal(ferry_hw_open(&hw, "given"), FERRY_OK);
  assert_true(ferry_hw_get(hw)->link.pageable_h2d_gbps == 9 && !ferry_hw_get(hw)->link.pageable_derived);
  ferry_hw_close(hw);
  assert_int_equal(ferry_hw_open(&hw, "slower"), FERRY_OK);
  assert_true(fabs(ferry_hw_get(hw)->link.pageable_h2d_gbps - 9) < 1e-9);
  ferry_hw_close(hw);
  /* a written profile leaves a derived rate to the reader: it reads back derived, and follows */
  assert_int_equal(ferry_hw_open(&hw, "rtx-a6000"), FERRY_OK);
  snprintf(path, sizeof path, "%s/written.json", dir);
  assert_int_equal(ferry_hw_write_json(ferry_hw_get(hw), NULL, 0, "test", path), FERRY_OK);
  ferry_hw_close(hw);
  assert_int_equal(ferry_hw_open(&hw, path), FERRY_OK);
  assert_true(ferry_hw_get(hw)->link.pageable_derived && fabs(ferry_hw_get(hw)->link.pageable_h2d_gbps - 12.003) < 1e-9);
  ferry_hw_close(hw);
  /* the setter: a derived rate follows, a given one stays, nonsense is ignored */
  struct ferry_hw_link link = {.h2d_gbps = 10, .pageable_h2d_gbps = 5, .pageable_derived = 1};
  ferry_hw_link_set_h2d(&link, 30);
  assert_true(link.h2d_gbps == 30 && link.pageable_h2d_gbps == 15);
  ferry_hw_link_set_h2d(&link, 0);
  ferry_hw_link_set_h2d(&link, -1);
  ferry_hw_link_set_h2d(&link, NAN);
  assert_true(link.h2d_gbps == 30 && link.pageable_h2d_gbps == 15);
  link.pageable_derived = 0;
  ferry_hw_link_set_h2d(&link, 40);
  assert_true(link.h2d_gbps == 40 && link.pageable_h2d_gbps == 15);
  ferry_hw_link_set_h2d(NULL, 40);
  tu_rmtree(dir);
  free(dir);
  use_catalogue_only();
}

static void test_malformed(void **state) {
  (void)state;
  use_catalogue_only();
  char *dir = tu_mkdtemp("hw");
  char path[4096];
  snprintf(path, sizeof path, "%s/cycle-b.json", dir);
  const char *cycle_b = "{\"name\": \"cycle-b\", \"kind\": \"link\", \"link\": {\"base\": \"cycle-a\"}}";
  tu_write_file(path, cycle_b, strlen(cycle_b));
  for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
    const struct bad_case *c = &bad_cases[i];
    snprintf(path, sizeof path, "%s/%s", dir, c->file);
    tu_write_file(path, c->json, strlen(c->json));
    ferry_hw *hw = (ferry_hw *)1;
    ferry_status st = ferry_hw_open(&hw, path);
    if (st != c->status || !tu_contains(ferry_last_error(), c->message))
      fail_msg("%s: got %s \"%s\", expected %s \"%s\"", c->file, ferry_status_name(st), ferry_last_error(),
               ferry_status_name(c->status), c->message);
    assert_null(hw);
  }
  tu_rmtree(dir);
  free(dir);
}

/* FERRY_HW_PATH comes first; a local file may compose catalogue parts; unknown names list
 * the folders searched. */
static void test_search_path(void **state) {
  (void)state;
  char *dir = private_dir_then_catalogue("hwpath");
  char path[4096];
  snprintf(path, sizeof path, "%s/t4.json", dir);
  const char *mine = "{\"name\": \"my-t4\", \"kind\": \"gpu\", " GPU_OK ", \"link\": \"pcie4-x16\", "
                     "\"disk\": {\"base\": \"nvme-gen4\", \"queue_depth\": 4}, \"price_per_hour_usd\": 0}";
  tu_write_file(path, mine, strlen(mine));
  ferry_hw *hw;
  assert_int_equal(ferry_hw_open(&hw, "t4"), FERRY_OK);
  const struct ferry_hw_profile *p = ferry_hw_get(hw);
  assert_string_equal(p->name, "my-t4");
  assert_true(p->has_link && p->has_disk && !p->has_host);
  assert_true(fabs(p->link.h2d_gbps - 24.006) < 1e-9); /* 31.508 GB/s raw x 64/84 */
  assert_int_equal(p->disk.queue_depth, 4);
  assert_true(p->disk.read_gbps == 7.0);
  assert_null(find_source(p, "disk.queue_depth", 0)); /* overridden without a new source */
  assert_non_null(find_source(p, "disk.read_gbps", 0));
  assert_int_equal(ferry_hw_require(p, "host"), FERRY_ERR_NOT_FOUND);
  assert_true(tu_contains(ferry_last_error(), "my-t4: host.dram_gbps is needed but the profile has no host section"));
  ferry_hw_close(hw);
  /* the same file opened by path */
  assert_int_equal(ferry_hw_open(&hw, path), FERRY_OK);
  ferry_hw_close(hw);

  assert_int_equal(ferry_hw_open(&hw, "a800"), FERRY_ERR_NOT_FOUND);
  assert_true(tu_contains(ferry_last_error(), "hardware profile \"a800\" not found in"));
  assert_true(tu_contains(ferry_last_error(), dir));
  assert_int_equal(ferry_hw_open(&hw, "../etc/passwd.json"), FERRY_ERR_NOT_FOUND);
  assert_int_equal(ferry_hw_open(&hw, ""), FERRY_ERR_INVALID);
  tu_rmtree(dir);
  free(dir);
  use_catalogue_only();
}

/* Every allocation failure while composing a profile fails cleanly (ASan checks leaks), of its
 * parts from its files or of a composed name's sections. */
static void alloc_failures(const char *name) {
  int ok = 0;
  for (int64_t n = 0; n < 4000 && !ok; n++) {
    ferry_hw *hw = NULL;
    ferry_alloc_fail_after(n);
    ferry_status st = ferry_hw_open(&hw, name);
    ferry_alloc_fail_after(-1);
    if (st == FERRY_OK) {
      ok = 1;
      assert_true(ferry_hw_get(hw)->n_sources > 0);
      ferry_hw_close(hw);
    } else {
      /* common/json.c cannot tell cJSON's out-of-memory from bad syntax (cJSON returns NULL
       * for both), so a failure inside the parser reads as "invalid JSON" */
      if (st != FERRY_ERR_NOMEM && !(st == FERRY_ERR_FORMAT && tu_contains(ferry_last_error(), "invalid JSON")))
        fail_msg("allocation %lld: %s %s", (long long)n, ferry_status_name(st), ferry_last_error());
      assert_null(hw);
    }
  }
  assert_true(ok);
}

static void test_alloc_failures(void **state) {
  (void)state;
  use_catalogue_only();
  alloc_failures("t4");
  alloc_failures("t4+host=xeon-6454s-2s+link=pcie3-x16");
  alloc_failures("t4+host.memory_bytes=256GiB+link.h2d_gbps=20");
}

static void test_cli(void **state) {
  (void)state;
  use_catalogue_only();
  char *out = NULL;
  assert_int_equal(tu_run_ferry("hw list", &out), 0);
  assert_true(tu_contains(out, "h100-pcie"));
  assert_true(tu_contains(out, "pcie4-x16"));
  assert_true(tu_contains(out, "80.00 GiB"));
  free(out);
  assert_int_equal(tu_run_ferry("hw show 8xh100-sxm", &out), 0);
  assert_true(tu_contains(out, "interconnect.gpus            8"));
  assert_true(tu_contains(out, "(the whole machine)"));
  free(out);
  assert_int_equal(tu_run_ferry("hw show t4", &out), 0);
  assert_true(tu_contains(out, "FlexGen"));
  assert_true(tu_contains(out, "link.h2d_gbps"));
  assert_true(tu_contains(out, "fitted"));
  free(out);
  /* what the figures rest on, the ferry defaults named */
  assert_int_equal(tu_run_ferry("hw show rtx-a6000", &out), 0);
  assert_true(tu_contains(out, "rates, times and efficiencies rest on: 11 sourced, 1 derived, 10 default\n"));
  assert_true(tu_contains(out, "  ferry defaults, not measurements: gpu.launch_overhead_ns, gpu.efficiency.gemm,"));
  assert_true(tu_contains(out, "host.cpu_gflops"));
  free(out);
  assert_int_equal(tu_run_ferry("hw show h100-pcie+host=xeon-6454s-2s", &out), 0);
  assert_true(tu_contains(out, "name: h100-pcie+host=xeon-6454s-2s"));
  assert_true(tu_contains(out, "host.cores                   64"));
  free(out);
  assert_int_equal(tu_run_ferry("hw show h100-pcie+gpu=l4", &out), 1);
  assert_true(tu_contains(out, "is not SECTION=PART"));
  free(out);
  assert_int_equal(tu_run_ferry("hw show nope", &out), 1);
  assert_true(tu_contains(out, "ferry: "));
  assert_true(tu_contains(out, "\"nope\" not found"));
  free(out);
  assert_int_equal(tu_run_ferry("hw --help", &out), 0);
  assert_true(tu_contains(out, "Usage: ferry hw"));
  free(out);
  assert_int_equal(tu_run_ferry("hw frobnicate", &out), 2);
  free(out);
  /* one kernel's simulated time: a 4096 x 4096 fp16 GEMV on an H100 PCIe streams 33587200 B at
   * 2000 GB/s x 0.8 = 20992 ns (its 33554432 flops at 756.5 TFLOP/s x 0.7 = 63.4 ns barely add:
   * sqrt of the squares 20992.1 -> 20993) + the 5000 ns launch overhead */
  assert_int_equal(tu_run_ferry("hw kernel h100-pcie 'matmul m=1 n=4096 k=4096 w=fp16'", &out), 0);
  assert_true(tu_contains(out, "25.993"));
  free(out);
  /* int4 weights: fused (native) reads 4x fewer bytes; eager expands them in a kernel of its own */
  double fused = 0, eager = 0;
  assert_int_equal(tu_run_ferry("hw kernel h100-pcie 'matmul m=1 n=4096 k=4096 w=int4-g64'", &out), 0);
  assert_int_equal(sscanf(out, "%lf", &fused), 1);
  free(out);
  assert_int_equal(tu_run_ferry("hw kernel h100-pcie --runtime eager 'matmul m=1 n=4096 k=4096 w=int4-g64'", &out), 0);
  assert_int_equal(sscanf(out, "%lf", &eager), 1);
  free(out);
  assert_true(fused < 25.993 && eager > 25.993);
  assert_int_equal(tu_run_ferry("hw kernel h100-pcie 'matmul m=1 n=4096 k=4096 w=int9'", &out), 2);
  assert_true(tu_contains(out, "w=int9"));
  free(out);
  /* Gemma's GeGLU is gated like SwiGLU (two rows in, one out); its plain GELU-tanh moves less */
  double swiglu = 0, geglu = 0, gelu_tanh = 0;
  assert_int_equal(tu_run_ferry("hw kernel h100-pcie 'activation m=64 n=14336 fn=silu_mul' "
                                "'activation m=64 n=14336 fn=gelu_tanh_mul' 'activation m=64 n=14336 fn=gelu_tanh'",
                                &out),
                   0);
  assert_int_equal(sscanf(out, "%lf %lf %lf", &swiglu, &geglu, &gelu_tanh), 3);
  free(out);
  assert_true(swiglu > 0 && geglu == swiglu && gelu_tanh < swiglu);
  assert_int_equal(tu_run_ferry("hw kernel h100-pcie 'activation m=1 n=8 fn=softmax'", &out), 2);
  assert_true(tu_contains(out, "fn=softmax: expected silu_mul, gelu_tanh_mul"));
  free(out);
}

/* `ferry hw kernel`'s host and GPU-to-GPU specs: a pipeline hand-off and an engine step's host
 * time, as a `ferry sim` run prices them. */
static void test_cli_sendrecv_step(void **state) {
  (void)state;
  char *out = NULL;
  /* a pipeline stage's hand-off: the interconnect's fixed 10 us, then the bytes at NCCL's share
   * of NVLink (20 of every 25 GB/s: 360 of the H100's 450 GB/s, 36 MB in 100 us), at the full
   * rate over PCIe P2P (the L40S box's 29.225 GB/s: 29.225 MB in 1000 us) */
  assert_int_equal(tu_run_ferry("hw kernel 8xh100-sxm 'sendrecv bytes=36000000'", &out), 0);
  assert_true(tu_contains(out, "110.000"));
  free(out);
  assert_int_equal(tu_run_ferry("hw kernel 4xl40s 'sendrecv bytes=29225000'", &out), 0);
  assert_true(tu_contains(out, "1010.000"));
  free(out);
  assert_int_equal(tu_run_ferry("hw kernel 8xh100-sxm 'sendrecv bytes=0'", &out), 2);
  assert_true(tu_contains(out, "sendrecv: bytes= must be at least 1"));
  free(out);
  /* an engine step's host time as the simulator charges it: graph's step_ns 1043209 + 8 sampled
   * rows x row_ns 48687 = 1432705 ns (its launches cost the host nothing); on two GPUs graph-ray's
   * workers add worker_step_ns 6623200 and graph's none; native charges a launch, 4 us */
  double step[5] = {0};
  assert_int_equal(tu_run_ferry("hw kernel 8xa100-80gb-sxm --runtime graph 'step batch=8' 'step batch=8 devices=2'", &out), 0);
  assert_int_equal(sscanf(out, "%lf %lf", &step[0], &step[1]), 2);
  free(out);
  assert_int_equal(tu_run_ferry("hw kernel 8xa100-80gb-sxm --runtime graph-ray 'step batch=8' 'step batch=8 devices=2' "
                                "'step batch=9 devices=4'",
                                &out),
                   0);
  assert_int_equal(sscanf(out, "%lf %lf %lf", &step[2], &step[3], &step[4]), 3);
  free(out);
  assert_true(step[0] == 1432.705 && step[1] == 1432.705 && step[2] == 1432.705);
  assert_true(step[3] == 8055.905 && fabs(step[4] - (8055.905 + 48.687)) < 0.0005);
  assert_int_equal(tu_run_ferry("hw kernel 8xa100-80gb-sxm 'step batch=8'", &out), 0);
  assert_true(tu_contains(out, "4.000"));
  free(out);
  assert_int_equal(tu_run_ferry("hw kernel 8xa100-80gb-sxm --runtime graph 'step batch=0'", &out), 2);
  assert_true(tu_contains(out, "step: batch= must be 1 to 65536"));
  free(out);
  assert_int_equal(tu_run_ferry("hw kernel 8xa100-80gb-sxm --runtime graph 'step batch=1 devices=9'", &out), 2);
  assert_true(tu_contains(out, "devices=9"));
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_catalogue_loads), cmocka_unit_test(test_t4_flexgen_fit), cmocka_unit_test(test_gpu_residency),
      cmocka_unit_test(test_malformed),       cmocka_unit_test(test_search_path),
      cmocka_unit_test(test_alloc_failures),  cmocka_unit_test(test_cli), cmocka_unit_test(test_cli_sendrecv_step),
      cmocka_unit_test(test_runtime_presets), cmocka_unit_test(test_host_amx),
      cmocka_unit_test(test_compose_parts),   cmocka_unit_test(test_pageable_derived), cmocka_unit_test(test_figures),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
