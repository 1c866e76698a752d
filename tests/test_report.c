/* reports/: a report built from a fixture database written with the profiler API (a block_layers
 * x prefetch_depth sweep on host and sim, extra hardware profiles, a failed run, a timeline)
 * has every expected section, well-formed SVG plots, CSVs with the right row counts and an
 * HTML page that headless Chromium renders without console errors; a study full of strings
 * that try to break out of gnuplot strings runs no command; bad input (missing,
 * empty, newer-schema databases, missing gnuplot, bad run id) fails with one line and leaves
 * no folder behind. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "ferry/db.h"
#include "ferry/report.h"
#include "testutil.h"

struct fixture {
  char *dir;
  char db[512];
  char out[512];
  int64_t timeline_run;
  size_t timeline_ops; /* ops of the timeline run in steps 0..2 */
  size_t memory_samples;
};

static char *config(int bl, int pd, const char *executor, const char *hw) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "block_layers", bl);
  cJSON_AddNumberToObject(o, "device_budget", 64.0 * 1048576);
  cJSON_AddStringToObject(o, "executor", executor);
  cJSON_AddNumberToObject(o, "host_budget", 0);
  if (hw) cJSON_AddStringToObject(o, "hw", hw);
  cJSON_AddStringToObject(o, "model", "tiny-moe");
  cJSON_AddNumberToObject(o, "prefetch_depth", pd);
  cJSON_AddNumberToObject(o, "seed", 1);
  cJSON_AddStringToObject(o, "trace", "rate=4,n=8");
  char *s = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  return s;
}

static struct ferry_activity act(enum ferry_activity_kind kind, const char *name, int32_t queue, int64_t start,
                                 int64_t end, int32_t step) {
  struct ferry_activity a;
  memset(&a, 0, sizeof a);
  a.kind = kind;
  a.name = name;
  a.queue = queue;
  a.start_ns = start;
  a.end_ns = end;
  a.step = step;
  a.layer = a.expert = -1;
  return a;
}

/* One run: 8 requests whose latency depends on the configuration (sim = real * speed), 6 steps
 * with bytes and stall, memory samples; with timeline, kernels and copies on three queues. */
static int64_t add_run(struct fixture *f, ferry_db *db, int bl, int pd, const char *executor, const char *hw,
                       double speed, int timeline, const char *error) {
  char *cfg = config(bl, pd, executor, hw);
  char hash[17];
  snprintf(hash, sizeof hash, "%08x%08x", (unsigned)(bl * 100 + pd), (unsigned)(strlen(executor) * 31 + (hw ? strlen(hw) : 0) + (hw ? (unsigned char)hw[0] : 0)));
  struct ferry_run_info info = {.kind = !strcmp(executor, "sim") ? FERRY_RUN_SIM : FERRY_RUN_HOST,
                                .model = "tiny-moe",
                                .hardware = hw ? hw : executor,
                                .trace = "rate=4,n=8",
                                .config_json = cfg,
                                .config_hash = hash};
  int64_t id;
  assert_int_equal(ferry_db_run_begin(db, &info, &id), FERRY_OK);
  free(cfg);
  if (error) {
    assert_int_equal(ferry_db_run_finish(db, id, error), FERRY_OK);
    return id;
  }
  double base_ms = (10.0 + 20.0 / bl + (pd == 0 ? 15.0 : 0)) * speed;
  for (int r = 0; r < 8; r++) {
    struct ferry_request_row q = {.req_id = r,
                                  .arrival_ns = r * 250000000LL,
                                  .first_token_ns = r * 250000000LL + (int64_t)(base_ms * 1e6 * (1 + 0.1 * r)),
                                  .prompt_tokens = 32,
                                  .output_tokens = 16};
    q.finish_ns = q.first_token_ns + 15 * (int64_t)(base_ms * 0.2e6);
    assert_int_equal(ferry_db_add_request(db, id, &q), FERRY_OK);
  }
  for (int s = 0; s < 6; s++) {
    struct ferry_step_row st = {.step = s,
                                .start_ns = s * 10000000LL,
                                .end_ns = (s + 1) * 10000000LL,
                                .batch = 4,
                                .tokens = 4,
                                .bytes_disk = (uint64_t)(1 << 20) * (uint64_t)bl,
                                .bytes_h2d = (uint64_t)(4 << 20),
                                .bytes_d2h = 0,
                                .hits = 10 * pd,
                                .misses = 4,
                                .stall_ns = pd ? 1000000 : 4000000};
    assert_int_equal(ferry_db_add_step(db, id, &st), FERRY_OK);
    assert_int_equal(ferry_db_add_memory(db, id, s * 10000000LL, FERRY_TIER_DEVICE, (uint64_t)(40 + s) << 20), FERRY_OK);
    assert_int_equal(ferry_db_add_memory(db, id, s * 10000000LL + 1, FERRY_TIER_HOST, (uint64_t)(100 + s) << 20), FERRY_OK);
    if (timeline) f->memory_samples += 2;
  }
  if (timeline) {
    f->timeline_run = id;
    for (int s = 0; s < 6; s++) {
      int64_t t = s * 10000000LL;
      struct ferry_activity a = act(FERRY_ACT_MEMCPY, "read block", 2, t, t + 3000000, s);
      a.copy_kind = FERRY_COPY_DISK_TO_HOST;
      a.bytes = 1 << 20;
      ferry_db_activity_sink(db, &a);
      a = act(FERRY_ACT_MEMCPY, "h2d block", 1, t + 3000000, t + 5000000, s);
      a.copy_kind = FERRY_COPY_HTOD;
      a.bytes = 4 << 20;
      ferry_db_activity_sink(db, &a);
      for (int k = 0; k < 4; k++) {
        a = act(FERRY_ACT_KERNEL, k % 2 ? "attention" : "matmul", 0, t + 5000000 + k * 1000000, t + 5900000 + k * 1000000, s);
        ferry_db_activity_sink(db, &a);
      }
      if (s <= 2) f->timeline_ops += 6;
    }
  }
  assert_int_equal(ferry_db_run_finish(db, id, NULL), FERRY_OK);
  return id;
}

static int setup(void **state) {
  struct fixture *f = calloc(1, sizeof *f);
  f->dir = tu_mkdtemp("report");
  snprintf(f->db, sizeof f->db, "%s/study.db", f->dir);
  snprintf(f->out, sizeof f->out, "%s/out/report", f->dir);
  ferry_db *db;
  assert_int_equal(ferry_db_open(&db, f->db, FERRY_DB_CREATE), FERRY_OK);
  static const int bls[3] = {1, 2, 4}, pds[2] = {0, 1};
  int first = 1;
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 2; j++) {
      add_run(f, db, bls[i], pds[j], "host", NULL, 1.0, first, NULL);
      first = 0;
      add_run(f, db, bls[i], pds[j], "sim", "h100-pcie", 1.1, 0, NULL);
    }
  /* hardware what-if: the same sim configuration on two more profiles (prices in hw/) */
  add_run(f, db, 1, 1, "sim", "a100-40gb-pcie", 1.6, 0, NULL);
  add_run(f, db, 1, 1, "sim", "t4", 4.0, 0, NULL);
  add_run(f, db, 8, 1, "host", NULL, 1.0, 0, "device budget exceeded");
  ferry_db_close(db);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  struct fixture *f = *state;
  tu_rmtree(f->dir);
  free(f->dir);
  free(f);
  return 0;
}

static char *slurp(const char *path) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return NULL;
  fseek(fp, 0, SEEK_END);
  long n = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  assert_non_null(buf);
  assert_int_equal(fread(buf, 1, (size_t)n, fp), (size_t)n);
  buf[n] = '\0';
  fclose(fp);
  return buf;
}

/* Lines of a CSV file (header included); -1 if missing. Quoted newlines do not occur here. */
static long csv_lines(const char *out, const char *name) {
  char path[1024];
  snprintf(path, sizeof path, "%s/tables/%s.csv", out, name);
  char *t = slurp(path);
  if (!t) return -1;
  long n = 0;
  for (char *p = t; *p; p++) n += *p == '\n';
  free(t);
  return n;
}

/* Minimal XML well-formedness: one root <svg>, every start tag closed in order, comments,
 * processing instructions, CDATA and the doctype skipped, quoted attributes honoured. */
static int xml_well_formed(const char *x, char *why, size_t why_len) {
  char stack[64][64];
  int depth = 0, roots = 0;
  const char *p = x;
  while ((p = strchr(p, '<')) != NULL) {
    if (!strncmp(p, "<?", 2)) {
      p = strstr(p, "?>");
      if (!p) return snprintf(why, why_len, "unterminated <?"), 0;
      continue;
    }
    if (!strncmp(p, "<!--", 4)) {
      p = strstr(p, "-->");
      if (!p) return snprintf(why, why_len, "unterminated comment"), 0;
      continue;
    }
    if (!strncmp(p, "<![CDATA[", 9)) {
      p = strstr(p, "]]>");
      if (!p) return snprintf(why, why_len, "unterminated CDATA"), 0;
      continue;
    }
    if (!strncmp(p, "<!", 2)) {
      p = strchr(p, '>');
      if (!p) return snprintf(why, why_len, "unterminated <!"), 0;
      continue;
    }
    int closing = p[1] == '/';
    const char *name = p + 1 + closing;
    size_t n = strcspn(name, " \t\r\n/>");
    if (n == 0 || n >= 64) return snprintf(why, why_len, "bad tag name at offset %ld", (long)(p - x)), 0;
    const char *q = name + n;
    char quote = 0;
    while (*q && (quote || *q != '>')) {
      if (quote && *q == quote) quote = 0;
      else if (!quote && (*q == '"' || *q == '\'')) quote = *q;
      q++;
    }
    if (!*q) return snprintf(why, why_len, "unterminated tag at offset %ld", (long)(p - x)), 0;
    int self = q[-1] == '/';
    if (closing) {
      if (depth == 0 || strncmp(stack[depth - 1], name, n) || stack[depth - 1][n])
        return snprintf(why, why_len, "</%.*s> does not match <%s>", (int)n, name, depth ? stack[depth - 1] : "(none)"), 0;
      depth--;
    } else if (!self) {
      if (depth == 0) {
        roots++;
        if (strncmp(name, "svg", 3) || n != 3) return snprintf(why, why_len, "root is <%.*s>, expected <svg>", (int)n, name), 0;
      }
      if (depth == 64) return snprintf(why, why_len, "too deep"), 0;
      memcpy(stack[depth], name, n);
      stack[depth++][n] = '\0';
    }
    p = q + 1;
  }
  if (depth) return snprintf(why, why_len, "<%s> never closed", stack[depth - 1]), 0;
  if (roots != 1) return snprintf(why, why_len, "%d root elements", roots), 0;
  return 1;
}

static void build(struct fixture *f, struct ferry_report_summary *sum) {
  struct ferry_report_options o;
  ferry_report_options_init(&o);
  const char *dbs[1] = {f->db};
  o.db_paths = dbs;
  o.n_dbs = 1;
  o.out_dir = f->out;
  o.title = "fixture study";
  o.slo_ttft_p99_ms = 200;
  ferry_status st = ferry_report_write(&o, sum);
  if (st != FERRY_OK) fail_msg("ferry_report_write: %s", ferry_last_error());
}

static void test_sections_plots_tables(void **state) {
  struct fixture *f = *state;
  struct ferry_report_summary sum;
  build(f, &sum);
  assert_int_equal(sum.runs, 15);
  assert_int_equal(sum.complete, 14);
  assert_int_equal(sum.failed, 1);
  unsigned want = FERRY_REPORT_RUNS | FERRY_REPORT_SWEEP | FERRY_REPORT_BYTES | FERRY_REPORT_TIMELINE |
                  FERRY_REPORT_MEMORY | FERRY_REPORT_SIM_VS_REAL | FERRY_REPORT_HARDWARE | FERRY_REPORT_LATENCY;
  assert_int_equal(sum.sections, want);
  /* block_layers, prefetch_depth, executor, hw */
  assert_int_equal(sum.axes, 4);
  /* 6 host runs, each paired with its h100 sim; the (1, 1) one also with a100 and t4 */
  assert_int_equal(sum.sim_real_pairs, 8);

  char path[1024];
  snprintf(path, sizeof path, "%s/index.html", f->out);
  char *html = slurp(path);
  assert_non_null(html);
  for (unsigned bit = 1; bit <= FERRY_REPORT_LATENCY; bit <<= 1) {
    if (!(want & bit)) continue;
    char anchor[64];
    snprintf(anchor, sizeof anchor, "<section id=\"%s\">", ferry_report_section_name((enum ferry_report_section)bit));
    if (!strstr(html, anchor)) fail_msg("index.html lacks %s", anchor);
  }
  assert_true(tu_contains(html, "<title>fixture study</title>"));
  assert_true(tu_contains(html, "device budget exceeded"));
  /* inline SVG without the XML prolog, ids made unique per plot */
  assert_false(tu_contains(html, "<?xml"));
  assert_true(tu_contains(html, "id=\"p1_gnuplot_canvas\""));
  assert_true(tu_contains(html, "id=\"p2_gnuplot_canvas\""));
  free(html);
  snprintf(path, sizeof path, "%s/report.md", f->out);
  char *md = slurp(path);
  assert_non_null(md);
  assert_true(tu_contains(md, "# fixture study"));
  assert_true(tu_contains(md, "## Simulator against real runs"));
  assert_true(tu_contains(md, "## Hardware what-if"));
  assert_true(tu_contains(md, "![sweep_block_layers](plots/sweep_block_layers.svg)"));
  free(md);

  /* every plot: script and a well-formed SVG */
  static const char *const plots[] = {"sweep_block_layers", "sweep_prefetch_depth", "sweep_executor", "sweep_hw",
                                      "latency_cdf", "bytes_stall", "timeline", "memory", "batch_kv", "sim_vs_real",
                                      "hardware"};
  assert_int_equal(sum.plots, sizeof plots / sizeof plots[0]);
  for (size_t i = 0; i < sizeof plots / sizeof plots[0]; i++) {
    snprintf(path, sizeof path, "%s/plots/%s.gp", f->out, plots[i]);
    char *gp = slurp(path);
    if (!gp) fail_msg("missing %s", path);
    assert_true(tu_contains(gp, "set terminal svg"));
    free(gp);
    snprintf(path, sizeof path, "%s/plots/%s.svg", f->out, plots[i]);
    char *svg = slurp(path);
    if (!svg) fail_msg("missing %s", path);
    char why[200];
    if (!xml_well_formed(svg, why, sizeof why)) fail_msg("%s: %s", path, why);
    free(svg);
  }
  /* per-run bar labels: short (no collisions when rotated), executor right after the run label */
  snprintf(path, sizeof path, "%s/plots/bytes_stall.gp", f->out);
  char *gp = slurp(path);
  if (!gp) fail_msg("missing %s", path);
  int labels = 0;
  for (char *line = strstr(gp, "\n\"r"); line; line = strstr(line + 1, "\n\"r")) {
    const char *q = strchr(line + 2, '"');
    assert_non_null(q);
    assert_true(q - (line + 2) <= 48);
    const char *sp = strchr(line + 2, ' ');
    assert_true(sp && sp < q);
    assert_true(!strncmp(sp + 1, "host ", 5) || !strncmp(sp + 1, "sim ", 4));
    labels++;
  }
  free(gp);
  assert_int_equal(labels, 14);
  /* CSVs: header + rows */
  assert_int_equal(csv_lines(f->out, "runs"), 1 + 15);
  assert_int_equal(csv_lines(f->out, "bytes"), 1 + 14);
  assert_int_equal(csv_lines(f->out, "sim_vs_real"), 1 + 8);
  assert_int_equal(csv_lines(f->out, "sim_error"), 1 + 3);
  assert_int_equal(csv_lines(f->out, "hardware"), 1 + 3);
  assert_int_equal(csv_lines(f->out, "timeline"), 1 + (long)f->timeline_ops);
  assert_int_equal(csv_lines(f->out, "timeline_queues"), 1 + 3);
  assert_int_equal(csv_lines(f->out, "memory"), 1 + (long)f->memory_samples);
  assert_int_equal(csv_lines(f->out, "memory_peaks"), 1 + 2);
  /* one point per (series = values of the other axes, x): host and h100 sims on the full grid
   * (2 series x 3 block sizes per prefetch depth); the a100 and t4 runs, one point each, draw no
   * line and are left out of these plots (they have the hardware section) */
  assert_int_equal(csv_lines(f->out, "sweep_block_layers"), 1 + 2 * 2 * 3);
  assert_int_equal(csv_lines(f->out, "sweep_prefetch_depth"), 1 + 3 * 2 * 2);
  assert_int_equal(sum.tables, 15); /* with the failed runs and the latency distributions */
  assert_int_equal(csv_lines(f->out, "failed_runs"), 1 + 1);
  assert_true(csv_lines(f->out, "latency_cdf") > 14 * 3 * 8);

  /* no temporary folders left beside the report */
  snprintf(path, sizeof path, "%s/out", f->dir);
  DIR *d = opendir(path);
  assert_non_null(d);
  struct dirent *e;
  int entries = 0;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') {
      entries++;
      assert_string_equal(e->d_name, "report");
    }
  closedir(d);
  assert_int_equal(entries, 1);
}

static void test_sim_error_and_cost(void **state) {
  struct fixture *f = *state;
  struct ferry_report_summary sum;
  build(f, &sum);
  char path[1024];
  snprintf(path, sizeof path, "%s/tables/sim_error.csv", f->out);
  char *t = slurp(path);
  assert_non_null(t);
  /* h100 pairs predict 10% slow, a100 60%, t4 300%: the mean TTFT row over 8 pairs */
  assert_true(tu_contains(t, "mean TTFT,8,"));
  char *row = strstr(t, "mean TTFT,8,");
  double mean_abs = strtod(row + strlen("mean TTFT,8,"), NULL);
  assert_true(mean_abs > (6 * 10.0 + 60 + 300) / 8 - 1 && mean_abs < (6 * 10.0 + 60 + 300) / 8 + 1);
  free(t);
  snprintf(path, sizeof path, "%s/tables/hardware.csv", f->out);
  t = slurp(path);
  assert_non_null(t);
  /* prices come from the hw/ profiles: h100-pcie 2.89 $/h (RunPod, 2026-09-25) */
  assert_true(tu_contains(t, "h100-pcie"));
  assert_true(tu_contains(t, ",2.89,"));
  assert_true(tu_contains(t, "t4"));
  free(t);
  /* the report replaces an existing folder */
  build(f, &sum);
  snprintf(path, sizeof path, "%s/index.html", f->out);
  assert_true(ferry__is_file(path));
}

/* The what-if lists a run that failed on a profile with its error and says why a cost is
 * missing; the sweep plots name what they leave out; the failed runs have their own table. */
static void test_whatif_failures_and_notes(void **state) {
  struct fixture *f = *state;
  ferry_db *db;
  assert_int_equal(ferry_db_open(&db, f->db, FERRY_DB_CREATE), FERRY_OK);
  add_run(f, db, 1, 1, "sim", "l4", 1.0, 0, "device budget 64.00 MiB is below the minimum working set");
  add_run(f, db, 1, 1, "sim", "priceless-gpu", 2.0, 0, NULL);
  ferry_db_close(db);
  struct ferry_report_summary sum;
  build(f, &sum);
  char path[1024];
  snprintf(path, sizeof path, "%s/tables/hardware.csv", f->out);
  char *t = slurp(path);
  assert_non_null(t);
  assert_true(tu_contains(t, ",l4,"));
  assert_true(tu_contains(t, "failed: device budget 64.00 MiB is below the minimum working set"));
  assert_true(tu_contains(t, "no cost: priceless-gpu has no price_per_hour_usd"));
  free(t);
  snprintf(path, sizeof path, "%s/tables/failed_runs.csv", f->out);
  t = slurp(path);
  assert_non_null(t);
  assert_true(tu_contains(t, "device budget exceeded"));
  assert_true(tu_contains(t, "below the minimum working set"));
  free(t);
  snprintf(path, sizeof path, "%s/report.md", f->out);
  t = slurp(path);
  assert_non_null(t);
  /* the a100, t4 and other single runs draw no line against block_layers: said so */
  assert_true(tu_contains(t, "Left out: "));
  assert_true(tu_contains(t, "configurations with a single value of"));
  /* the what-if's bar labels name a failed profile */
  free(t);
  snprintf(path, sizeof path, "%s/plots/hardware.gp", f->out);
  t = slurp(path);
  assert_non_null(t);
  assert_true(tu_contains(t, "\"l4 (failed)\""));
  assert_true(tu_contains(t, "set xtics rotate by 30 right"));
  free(t);
}

/* ---- hostile strings --------------------------------------------------------------------- */

/* Each tries another way out of a gnuplot string (or Markdown/HTML text); run with C = the
 * canary folder, a command that ran leaves a file there. */
static const char *const evil_fmt[] = {
    "m`touch %s/c1`",
    "$(touch %s/c2)",
    "x'; system('touch %s/c3'); '",
    "x\"; system(\"touch %s/c4\"); \"",
    "a\nsystem('touch %s/c5')\n",
    "b\nEOD\n!touch %s/c6\n",
    "@m `touch %s/c7` <script>alert(1)</script> & | * [x](javascript:alert(1)) %s",
};
#define N_EVIL (sizeof evil_fmt / sizeof evil_fmt[0])

static void evil(const struct fixture *f, size_t i, char *out, size_t len) {
  snprintf(out, len, evil_fmt[i % N_EVIL], f->dir, f->dir);
}

static int64_t add_evil_run(struct fixture *f, ferry_db *db, int sim, size_t model, size_t hw, int knob) {
  char m[512], h[512], q[512], key[512];
  evil(f, model, m, sizeof m);
  evil(f, hw, h, sizeof h);
  evil(f, model + 2, q, sizeof q);
  evil(f, 0, key, sizeof key);
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "executor", sim ? "sim" : "host");
  if (sim) cJSON_AddStringToObject(o, "hw", h);
  cJSON_AddStringToObject(o, "model", m);
  cJSON_AddStringToObject(o, "quant", q);
  cJSON_AddStringToObject(o, "predictor", m);
  cJSON_AddNumberToObject(o, key, knob); /* a swept key with a hostile name */
  char *cfg = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  char hash[17];
  snprintf(hash, sizeof hash, "%04x%04x%08x", (unsigned)model, (unsigned)hw, (unsigned)(sim * 16 + knob));
  struct ferry_run_info info = {.kind = sim ? FERRY_RUN_SIM : FERRY_RUN_HOST, .model = m, .hardware = sim ? h : "host",
                                .trace = q, .config_json = cfg, .config_hash = hash, .notes = h};
  int64_t id;
  assert_int_equal(ferry_db_run_begin(db, &info, &id), FERRY_OK);
  free(cfg);
  for (int r = 0; r < 4; r++) {
    struct ferry_request_row row = {.req_id = r, .arrival_ns = r * 1000000LL, .prompt_tokens = 8, .output_tokens = 4};
    row.first_token_ns = row.arrival_ns + 2000000LL * (1 + (int64_t)model) * (sim ? 2 : 1);
    row.finish_ns = row.first_token_ns + 3000000LL * (1 + knob);
    assert_int_equal(ferry_db_add_request(db, id, &row), FERRY_OK);
  }
  for (int st = 0; st < 3; st++) {
    struct ferry_step_row row = {.step = st, .start_ns = st * 1000000LL, .end_ns = (st + 1) * 1000000LL, .batch = 1,
                                 .tokens = 1, .bytes_disk = 1 << 20, .bytes_h2d = 2 << 20, .hits = 3, .misses = 1,
                                 .stall_ns = 100000};
    assert_int_equal(ferry_db_add_step(db, id, &row), FERRY_OK);
    assert_int_equal(ferry_db_add_memory(db, id, st * 1000000LL, FERRY_TIER_DEVICE, (uint64_t)(10 + st) << 20), FERRY_OK);
    struct ferry_activity a = act(FERRY_ACT_KERNEL, m, 0, st * 1000000LL, st * 1000000LL + 500000, st);
    ferry_db_activity_sink(db, &a);
    a = act(FERRY_ACT_MEMCPY, h, 1, st * 1000000LL, st * 1000000LL + 400000, st);
    a.copy_kind = FERRY_COPY_HTOD;
    a.bytes = 2 << 20;
    ferry_db_activity_sink(db, &a);
  }
  assert_int_equal(ferry_db_run_finish(db, id, NULL), FERRY_OK);
  return id;
}

/* A study whose model paths, hardware names, configuration keys and values, labels and op
 * names try to break out of gnuplot strings (backquotes, $(...), quotes, newlines, system(),
 * a datablock end, macros) and to inject HTML into the report: every section renders and no
 * command runs. */
/* Three swept axes give 4 x 3 = 12 lines against block_layers: too many, so the plot keeps one line
 * per value of the axis with fewest values (hw) and holds prefetch_depth at one value, and the
 * caption says which and how many runs that leaves out. */
static void test_sweep_narrowed(void **state) {
  struct fixture *f = *state;
  snprintf(f->db, sizeof f->db, "%s/narrow.db", f->dir); /* this study only, not the fixture's */
  ferry_db *db;
  assert_int_equal(ferry_db_open(&db, f->db, FERRY_DB_CREATE), FERRY_OK);
  static const char *const hws[3] = {"a100", "l4", "t4"};
  for (int bl = 1; bl <= 4; bl *= 2)
    for (int pd = 0; pd < 4; pd++)
      for (int h = 0; h < 3; h++) add_run(f, db, bl, pd, "sim", hws[h], 1.0 + 0.5 * h, 0, NULL);
  ferry_db_close(db);
  struct ferry_report_summary sum;
  build(f, &sum);
  char path[1024];
  snprintf(path, sizeof path, "%s/report.md", f->out);
  char *t = slurp(path);
  assert_non_null(t);
  assert_true(tu_contains(t, "other parameters fixed at prefetch_depth="));
  /* 36 runs, 9 drawn (3 hw x 3 block sizes at one prefetch depth): 27 left out */
  assert_true(tu_contains(t, "27 runs at other values of the fixed parameters"));
  free(t);
  snprintf(path, sizeof path, "%s/tables/sweep_block_layers.csv", f->out);
  t = slurp(path);
  assert_non_null(t);
  size_t lines = 0;
  for (const char *c = t; *c; c++) lines += *c == '\n';
  assert_int_equal(lines, 1 + 9); /* header + 3 series x 3 values */
  free(t);
  snprintf(path, sizeof path, "%s/plots/sweep_block_layers.gp", f->out);
  t = slurp(path);
  assert_non_null(t);
  assert_true(tu_contains(t, "$s2 << EOD"));
  assert_false(tu_contains(t, "$s3 << EOD"));
  free(t);
}

static void test_hostile_strings(void **state) {
  struct fixture *f = *state;
  char db_path[1024];
  snprintf(db_path, sizeof db_path, "%s/hostile.db", f->dir);
  ferry_db *db;
  assert_int_equal(ferry_db_open(&db, db_path, FERRY_DB_CREATE), FERRY_OK);
  for (size_t i = 0; i < N_EVIL; i++) {
    add_evil_run(f, db, 0, i, 0, 1 + (int)(i % 2));
    add_evil_run(f, db, 1, i, i + 1, 1 + (int)(i % 2));
  }
  /* the same sim run on every hardware name: the hardware what-if */
  for (size_t h = 1; h < N_EVIL; h++) add_evil_run(f, db, 1, 0, h + 1, 1);
  char fail_text[512];
  evil(f, 5, fail_text, sizeof fail_text);
  struct ferry_run_info info = {.kind = FERRY_RUN_HOST, .model = fail_text, .config_json = "{\"x\": 1}"};
  int64_t id;
  assert_int_equal(ferry_db_run_begin(db, &info, &id), FERRY_OK);
  assert_int_equal(ferry_db_run_finish(db, id, fail_text), FERRY_OK);
  ferry_db_close(db);

  char title[512];
  evil(f, 6, title, sizeof title);
  struct ferry_report_options o;
  ferry_report_options_init(&o);
  const char *dbs[1] = {db_path};
  o.db_paths = dbs;
  o.n_dbs = 1;
  o.out_dir = f->out;
  o.title = title;
  struct ferry_report_summary sum;
  ferry_status st = ferry_report_write(&o, &sum);
  if (st != FERRY_OK) fail_msg("ferry_report_write: %s", ferry_last_error());
  unsigned want = FERRY_REPORT_RUNS | FERRY_REPORT_SWEEP | FERRY_REPORT_BYTES | FERRY_REPORT_TIMELINE |
                  FERRY_REPORT_MEMORY | FERRY_REPORT_SIM_VS_REAL | FERRY_REPORT_QUANT | FERRY_REPORT_PREDICTOR |
                  FERRY_REPORT_PREDICTOR_CI | FERRY_REPORT_HARDWARE | FERRY_REPORT_LATENCY;
  assert_int_equal(sum.sections, want);
  for (int c = 1; c <= 8; c++) {
    char canary[1024];
    snprintf(canary, sizeof canary, "%s/c%d", f->dir, c);
    if (access(canary, F_OK) == 0) fail_msg("a command in a hostile string ran: %s exists", canary);
  }
  /* the strings did reach the scripts, as inert single-quoted text or data */
  char path[1024];
  snprintf(path, sizeof path, "%s/plots/hardware.gp", f->out);
  char *gp = slurp(path);
  assert_non_null(gp);
  /* bar labels are the profiles' last path components: the quote of c3's string is data */
  assert_true(tu_contains(gp, "\"c3'); '"));
  assert_null(strstr(gp, "\nEOD\n!"));
  free(gp);
  snprintf(path, sizeof path, "%s/plots/sweep_hw.gp", f->out);
  gp = slurp(path);
  assert_non_null(gp);
  /* tick and series labels are the values' last path components, quotes doubled */
  assert_true(tu_contains(gp, "'c3''); '''"));
  free(gp);
  /* plots and tables of a hostile key get file names of their own kind */
  snprintf(path, sizeof path, "%s/plots", f->out);
  DIR *d = opendir(path);
  assert_non_null(d);
  struct dirent *e;
  int evil_key_plot = 0;
  while ((e = readdir(d)) != NULL) {
    for (const char *c = e->d_name; *c; c++)
      if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.", *c))
        fail_msg("plot file name '%s' has '%c'", e->d_name, *c);
    evil_key_plot |= !strncmp(e->d_name, "sweep_m_touch", 13);
  }
  closedir(d);
  assert_true(evil_key_plot);
  snprintf(path, sizeof path, "%s/index.html", f->out);
  char *html = slurp(path);
  assert_non_null(html);
  assert_null(strstr(html, "<script"));
  free(html);
  /* Markdown: the text is there, no raw HTML, link or table syntax from the database */
  snprintf(path, sizeof path, "%s/report.md", f->out);
  char *md = slurp(path);
  assert_non_null(md);
  assert_true(tu_contains(md, "&lt;script&gt;alert(1)&lt;/script&gt;"));
  assert_null(strstr(md, "<script"));
  assert_null(strstr(md, "[x]("));
  assert_true(tu_contains(md, "\\[x\\](javascript"));
  free(md);
}

/* --out replaces only a previous report (it holds .ferry-report) or an empty folder; anything
 * else, and a folder holding a database being read, is refused and left as it was. */
static void test_out_folder(void **state) {
  struct fixture *f = *state;
  struct ferry_report_summary sum;
  char path[1024], args[2048], *out = NULL;
  /* a folder of someone's files */
  assert_int_equal(ferry__mkdir_p(f->out, NULL), FERRY_OK);
  snprintf(path, sizeof path, "%s/thesis.tex", f->out);
  tu_write_file(path, "precious", 8);
  snprintf(args, sizeof args, "report --db %s --out %s", f->db, f->out);
  assert_int_equal(tu_run_ferry(args, &out), 1);
  assert_true(tu_contains(out, "is not a ferry report"));
  assert_non_null(strchr(out, '\n'));
  assert_int_equal(strchr(out, '\n')[1], '\0'); /* one line */
  free(out);
  assert_true(ferry__is_file(path));
  snprintf(path, sizeof path, "%s/index.html", f->out);
  assert_false(ferry__is_file(path));
  /* an empty folder is filled, a report replaced */
  snprintf(path, sizeof path, "%s/thesis.tex", f->out);
  assert_int_equal(unlink(path), 0);
  build(f, &sum);
  snprintf(path, sizeof path, "%s/.ferry-report", f->out);
  assert_true(ferry__is_file(path));
  snprintf(path, sizeof path, "%s/extra.txt", f->out);
  tu_write_file(path, "x", 1);
  build(f, &sum);
  assert_false(ferry__is_file(path));
  /* a report folder that now holds the database it is made from */
  snprintf(path, sizeof path, "%s/study.db", f->out);
  char cmd[2200];
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", f->db, path);
  assert_int_equal(system(cmd), 0);
  snprintf(args, sizeof args, "report --db %s --out %s/", path, f->out);
  assert_int_equal(tu_run_ferry(args, &out), 2);
  assert_true(tu_contains(out, "must not overwrite"));
  free(out);
  struct ferry_report_options o;
  ferry_report_options_init(&o);
  const char *dbs[1] = {path};
  o.db_paths = dbs;
  o.n_dbs = 1;
  o.out_dir = f->out;
  assert_int_equal(ferry_report_write(&o, NULL), FERRY_ERR_INVALID);
  assert_true(ferry__is_file(path));
  /* a file, or a link to a folder, is no report folder */
  snprintf(path, sizeof path, "%s/file", f->dir);
  tu_write_file(path, "x", 1);
  o.db_paths = (const char *[]){f->db};
  o.out_dir = path;
  assert_int_equal(ferry_report_write(&o, NULL), FERRY_ERR_EXISTS);
  snprintf(path, sizeof path, "%s/link", f->dir);
  assert_int_equal(symlink(f->out, path), 0);
  assert_int_equal(ferry_report_write(&o, NULL), FERRY_ERR_EXISTS);
  assert_true(ferry__is_dir(f->out));
}

/* Errors: one line, non-zero, nothing written. */
static void expect_error(struct fixture *f, const char *db_path, const char *gnuplot, int64_t run, const char *needle) {
  struct ferry_report_options o;
  ferry_report_options_init(&o);
  const char *dbs[1] = {db_path};
  o.db_paths = dbs;
  o.n_dbs = 1;
  o.out_dir = f->out;
  o.gnuplot = gnuplot;
  o.timeline_run = run;
  ferry_status st = ferry_report_write(&o, NULL);
  assert_int_not_equal(st, FERRY_OK);
  const char *msg = ferry_last_error();
  if (!strstr(msg, needle)) fail_msg("error '%s' lacks '%s'", msg, needle);
  assert_null(strchr(msg, '\n'));
  assert_false(ferry__is_dir(f->out));
  char parent[1024];
  snprintf(parent, sizeof parent, "%s/out", f->dir);
  DIR *d = opendir(parent);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
      if (e->d_name[0] != '.') fail_msg("left behind: %s", e->d_name);
    closedir(d);
  }
}

static void test_bad_input(void **state) {
  struct fixture *f = *state;
  char path[1024];
  snprintf(path, sizeof path, "%s/missing.db", f->dir);
  expect_error(f, path, NULL, -1, "no such database");
  /* an empty database: schema but no runs */
  snprintf(path, sizeof path, "%s/empty.db", f->dir);
  ferry_db *db;
  assert_int_equal(ferry_db_open(&db, path, FERRY_DB_CREATE), FERRY_OK);
  ferry_db_close(db);
  expect_error(f, path, NULL, -1, "no runs");
  /* a newer schema */
  sqlite3 *s;
  assert_int_equal(sqlite3_open(path, &s), SQLITE_OK);
  assert_int_equal(sqlite3_exec(s, "PRAGMA user_version = 99", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(s);
  expect_error(f, path, NULL, -1, "newer than this build");
  /* not a database */
  snprintf(path, sizeof path, "%s/junk.db", f->dir);
  tu_write_file(path, "this is not sqlite, just some text padding it out to a header....................................",
                96);
  expect_error(f, path, NULL, -1, "not a ferry database");
  /* gnuplot missing, bad timeline run */
  expect_error(f, f->db, "/nonexistent/gnuplot", -1, "cannot run gnuplot '/nonexistent/gnuplot' (No such file or directory)");
  for (const char *c = ferry_last_error(); *c; c++) assert_true((unsigned char)*c >= 0x20);
  expect_error(f, f->db, NULL, 999, "no run 999");
  /* the same through the command */
  char args[2048], *out = NULL;
  snprintf(args, sizeof args, "report --db %s/empty.db --out %s", f->dir, f->out);
  int rc = tu_run_ferry(args, &out);
  assert_int_not_equal(rc, 0);
  assert_true(tu_contains(out, "ferry: "));
  assert_true(tu_contains(out, "newer than this build"));
  free(out);
  assert_false(ferry__is_dir(f->out));
}

static void test_cli(void **state) {
  struct fixture *f = *state;
  char args[2048], *out = NULL;
  snprintf(args, sizeof args, "report --db %s --out %s --timeline-run %lld --steps 1:3 --title CLI", f->db, f->out,
           (long long)f->timeline_run);
  int rc = tu_run_ferry(args, &out);
  if (rc != 0) fail_msg("ferry %s: %s", args, out);
  assert_true(tu_contains(out, "sections: runs sweep bytes timeline memory sim-vs-real hardware"));
  free(out);
  char path[1024];
  snprintf(path, sizeof path, "%s/plots/timeline.gp", f->out);
  char *gp = slurp(path);
  assert_non_null(gp);
  assert_true(tu_contains(gp, "steps 1 to 3"));
  free(gp);
  assert_int_equal(csv_lines(f->out, "timeline"), 1 + 3 * 6);
  rc = tu_run_ferry("report --out x", &out);
  assert_int_equal(rc, 2);
  assert_true(tu_contains(out, "missing --db"));
  free(out);
}

/* Headless Chromium renders index.html without console errors and takes a screenshot. */
static void test_chromium(void **state) {
  struct fixture *f = *state;
  const char *candidates[] = {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"};
  const char *chrome = NULL;
  for (size_t i = 0; i < 3 && !chrome; i++)
    if (access(candidates[i], X_OK) == 0) chrome = candidates[i];
  if (!chrome) {
    if (geteuid() == 0 && !getenv("FERRY_SKIP_CHROMIUM"))
      fail_msg("chromium is not installed (scripts/setup-deps.sh installs it; FERRY_SKIP_CHROMIUM=1 skips)");
    print_message("SKIP: chromium is not installed (Debian package chromium); HTML rendering not checked\n");
    skip();
  }
  struct ferry_report_summary sum;
  build(f, &sum);
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "timeout 120 %s --headless --no-sandbox --disable-gpu --disable-background-networking "
           "--disable-component-update --disable-sync --no-first-run --disable-dev-shm-usage "
           "--user-data-dir=%s/chrome --enable-logging=stderr --v=0 --screenshot=%s/shot.png "
           "--window-size=1280,2000 file://%s/index.html > %s/chrome.log 2>&1",
           chrome, f->dir, f->dir, f->out, f->dir);
  int rc = system(cmd);
  char path[1024];
  snprintf(path, sizeof path, "%s/chrome.log", f->dir);
  char *log = slurp(path);
  if (rc != 0) fail_msg("chromium failed (%d): %s", rc, log ? log : "");
  snprintf(path, sizeof path, "%s/shot.png", f->dir);
  struct stat sb;
  assert_int_equal(stat(path, &sb), 0);
  assert_true(sb.st_size > 10000);
  char *png = slurp(path);
  assert_memory_equal(png, "\x89PNG", 4);
  free(png);
  /* page errors are logged as "Uncaught ..." or CONSOLE(...) lines */
  if (log && (strstr(log, "Uncaught") || strstr(log, ":CONSOLE(")))
    fail_msg("console errors while rendering index.html:\n%s", log);
  free(log);
  /* FERRY_REPORT_KEEP=DIR keeps the fixture report and its screenshot for a look */
  const char *keep = getenv("FERRY_REPORT_KEEP");
  if (keep && *keep) {
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s' && cp -r '%s' '%s/report' && cp '%s/shot.png' '%s/'", keep,
             keep, f->out, keep, f->dir, keep);
    assert_int_equal(system(cmd), 0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_sections_plots_tables, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sim_error_and_cost, setup, teardown),
      cmocka_unit_test_setup_teardown(test_whatif_failures_and_notes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sweep_narrowed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_hostile_strings, setup, teardown),
      cmocka_unit_test_setup_teardown(test_out_folder, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_input, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cli, setup, teardown),
      cmocka_unit_test_setup_teardown(test_chromium, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
