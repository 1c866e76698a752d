/* bench/pipeline: how well the engine streams weights on the host executor. On a synthetic
 * model of at least 1 GiB with a device budget of a quarter of it, prints
 *   (a) the engine's host->device copy throughput vs a plain memcpy of the same bytes,
 *   (b) its O_DIRECT disk read throughput vs `dd iflag=direct` of the same file,
 *   (c) pipeline efficiency = max(compute time, transfer time) / measured time per decode step,
 *       at prefetch depth 0, 1 and 2.
 * Usage: pipeline [--dir DIR] [--keep] (DIR must be on a real disk, not tmpfs). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/alloc.h"
#include "common/fsutil.h"
#include "common/units.h"
#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/gen.h"
#include "ferry/model.h"
#include "ferry/store.h"

struct result {
  double step_ms, compute_ms, transfer_ms, efficiency;
  double h2d_gbps, disk_gbps;
  uint64_t h2d_bytes, disk_bytes;
};

static int run_config(const char *dir, int depth, int disk, struct result *r) {
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  int rc = 1;
  if (ferry_model_open(&m, dir) || ferry_store_open(&s, dir)) goto out;
  uint64_t total = 0;
  for (size_t i = 0; i < ferry_store_file_count(s); i++) total += ferry_store_file_size(s, i);
  struct ferry_engine_config c = {.block_layers = 1, .prefetch_depth = depth, .max_batch = 1, .max_step_tokens = 8,
                                  .max_seq_tokens = 64, .seed = 1, .device_budget_bytes = total / 4};
  if (disk) {
    c.home_disk = 1;
    c.read_flags = FERRY_READ_DIRECT;
  }
  struct ferry_exec_config xc = {.device_budget_bytes = c.device_budget_bytes, .compute_threads = 1};
  if (ferry_exec_create_host(&ex, &xc) || ferry_engine_create(&e, m, s, ex, &c)) goto out;
  const struct ferry_engine_request req = {.id = 0, .prompt_tokens = 4, .output_tokens = 10};
  if (ferry_engine_run(e, &req, 1, &(struct ferry_run_options){.as_fast_as_possible = 1})) goto out;
  int64_t n;
  const struct ferry_step_metrics *st = ferry_engine_step_metrics(e, &n);
  double dur = 0, comp = 0, xfer = 0, h2d_ns = 0, disk_ns = 0;
  uint64_t h2d = 0, dbytes = 0;
  int used = 0;
  for (int64_t i = 2; i < n; i++) { /* skip the prefill and the first decode step (pipeline fill) */
    dur += (double)(st[i].end_ns - st[i].start_ns);
    comp += (double)st[i].compute_busy_ns;
    double t = (double)st[i].h2d_busy_ns;
    if ((double)st[i].disk_busy_ns > t) t = (double)st[i].disk_busy_ns;
    xfer += t;
    h2d_ns += (double)st[i].h2d_busy_ns;
    disk_ns += (double)st[i].disk_busy_ns;
    h2d += st[i].bytes_h2d;
    dbytes += st[i].bytes_disk;
    used++;
  }
  r->step_ms = dur / used / 1e6;
  r->compute_ms = comp / used / 1e6;
  r->transfer_ms = xfer / used / 1e6;
  r->efficiency = (comp > xfer ? comp : xfer) / dur;
  r->h2d_gbps = h2d_ns > 0 ? (double)h2d / h2d_ns : 0;
  r->disk_gbps = disk_ns > 0 ? (double)dbytes / disk_ns : 0;
  r->h2d_bytes = h2d / (uint64_t)used;
  r->disk_bytes = dbytes / (uint64_t)used;
  rc = 0;
out:
  if (rc) fprintf(stderr, "pipeline: %s\n", ferry_last_error());
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_store_close(s);
  ferry_model_close(m);
  return rc;
}

/* A plain memcpy of the same bytes the engine copies per step: `total` bytes from one large
 * source, in `block`-sized pieces, into three rotating destination slots (best of 3). */
static double memcpy_gbps(uint64_t total, uint64_t block) {
  char *a = ferry__aligned_alloc(4096, total), *b = ferry__aligned_alloc(4096, 3 * block);
  if (!a || !b) return 0;
  memset(a, 1, total);
  memset(b, 2, 3 * block);
  double best = 0;
  for (int i = 0; i < 3; i++) {
    int64_t t0 = ferry__mono_ns();
    for (uint64_t off = 0, k = 0; off < total; off += block, k++)
      memcpy(b + (k % 3) * block, a + off, total - off < block ? total - off : block);
    double g = (double)total / (double)(ferry__mono_ns() - t0);
    if (g > best) best = g;
  }
  ferry_free(a);
  ferry_free(b);
  return best;
}

/* dd iflag=direct of the first shard with the engine's request size (one block): the disk's
 * O_DIRECT sequential rate. */
static double dd_gbps(const char *file, uint64_t block) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "dd if='%s' of=/dev/null bs=%lluK iflag=direct 2>&1", file,
           (unsigned long long)(block / 1024 / 4 * 4));
  FILE *p = popen(cmd, "r");
  if (!p) return 0;
  char line[512];
  double bytes = 0, secs = 0;
  while (fgets(line, sizeof line, p)) {
    double b, s;
    if (sscanf(line, "%lf bytes %*[^,], %lf s", &b, &s) == 2) {
      bytes = b;
      secs = s;
    }
  }
  pclose(p);
  return secs > 0 ? bytes / secs / 1e9 : 0;
}

int main(int argc, char **argv) {
  const char *dir = "build/bench-pipeline-model";
  int keep = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
    else if (!strcmp(argv[i], "--keep")) keep = 1;
    else {
      fprintf(stderr, "usage: pipeline [--dir DIR] [--keep]\n");
      return 2;
    }
  }
  if (!ferry__is_dir(dir)) {
    /* Llama-shaped, 24 layers of 48 MB in fp16 + a small vocabulary: 1.2 GB, so a quarter of it
     * holds the pinned embeddings plus three streamed layers. */
    ferry_model *base = NULL, *m = NULL;
    struct ferry_model_config mc;
    if (ferry_model_open(&base, "llama-2-7b") || ferry_model_config_derive(ferry_model_get_config(base), 24, 0.35, 8192, &mc) ||
        ferry_model_create(&m, &mc)) {
      fprintf(stderr, "pipeline: %s\n", ferry_last_error());
      return 1;
    }
    ferry_model_close(base);
    struct ferry_gen_options go = {.dtype = FERRY_DTYPE_F16, .seed = 1, .progress = 1};
    uint64_t bytes = 0;
    int64_t t0 = ferry__mono_ns();
    if (ferry_model_generate(m, &go, dir, &bytes)) {
      fprintf(stderr, "pipeline: %s\n", ferry_last_error());
      return 1;
    }
    double s = (double)(ferry__mono_ns() - t0) / 1e9;
    printf("generated %s: %.2f GB in %.2f s (%.0f MB/s)\n", dir, (double)bytes / 1e9, s, (double)bytes / 1e6 / s);
    ferry_model_close(m);
  }
  struct result r[3], rd;
  for (int d = 0; d <= 2; d++)
    if (run_config(dir, d, 0, &r[d])) return 1;
  if (run_config(dir, 2, 1, &rd)) return 1;
  ferry_store *s = NULL;
  if (ferry_store_open(&s, dir)) return 1;
  double dd = dd_gbps(ferry_store_file_path(s, 0), rd.disk_bytes / 24);
  ferry_store_close(s);
  double mc = memcpy_gbps(r[0].h2d_bytes, r[0].h2d_bytes / 24);
  printf("\n(a) copy: plain memcpy of the same bytes %.2f GB/s; engine host->device %.2f GB/s alone (depth 0, "
         "ratio %.2f), %.2f GB/s while compute runs beside it (depth 2, ratio %.2f)\n",
         mc, r[0].h2d_gbps, mc > 0 ? r[0].h2d_gbps / mc : 0, r[2].h2d_gbps, mc > 0 ? r[2].h2d_gbps / mc : 0);
  printf("(b) disk: engine O_DIRECT reads %.2f GB/s, dd iflag=direct %.2f GB/s, ratio %.2f\n", rd.disk_gbps, dd,
         dd > 0 ? rd.disk_gbps / dd : 0);
  printf("(c) pipeline efficiency per decode step (block = 1 layer, weights streamed from host memory):\n");
  printf("    %-6s %10s %12s %12s %10s\n", "depth", "step ms", "compute ms", "transfer ms", "efficiency");
  for (int d = 0; d <= 2; d++)
    printf("    %-6d %10.1f %12.1f %12.1f %10.2f\n", d, r[d].step_ms, r[d].compute_ms, r[d].transfer_ms, r[d].efficiency);
  printf("    disk-homed, depth 2, O_DIRECT: step %.1f ms, compute %.1f ms, transfer %.1f ms, efficiency %.2f\n",
         rd.step_ms, rd.compute_ms, rd.transfer_ms, rd.efficiency);
  if (!keep) ferry__rm_rf(dir);
  return 0;
}
