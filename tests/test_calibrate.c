/* The cost fit of `ferry calibrate`: exact recovery of both model forms from noiseless data,
 * the total-time scaling on noisy data (the simulated sum of durations equals the measured
 * one), and the degenerate cases; a failed probe releases what it took; `ferry calibrate --db` on
 * a recorded host run (fit quality and the runtime's host costs in the profile), and `ferry sim`
 * warning of weak fits; the fit of the link's contention with kernels (link.contention); a profile
 * written by ferry_hw_write_json() reads back with every figure it had. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "ferry/calibrate.h"
#include "ferry/hw.h"
#include "sim/hw_internal.h"
#include "testutil.h"

static double predict(const struct ferry_hw_cost *c, const struct ferry_calib_sample *s) {
  double b = s->bytes * c->ns_per_byte, f = s->flops * c->ns_per_flop;
  return c->overhead_ns + (c->roofline ? (b > f ? b : f) : b + f);
}

/* Shapes like a decode and prefill mix: bytes from 64 KiB to 64 MiB, intensity 0.5 to 64. */
static size_t shapes(struct ferry_calib_sample *s, size_t cap) {
  size_t n = 0;
  for (double bytes = 65536; bytes <= 64.0 * 1048576 && n < cap; bytes *= 2)
    for (double intensity = 0.5; intensity <= 64 && n < cap; intensity *= 2)
      s[n++] = (struct ferry_calib_sample){bytes, bytes * intensity, 0};
  return n;
}

static void test_recovers_sum_form(void **state) {
  (void)state;
  struct ferry_calib_sample s[128];
  size_t n = shapes(s, 128);
  const struct ferry_hw_cost truth = {.overhead_ns = 5000, .ns_per_byte = 0.1, .ns_per_flop = 0.02, .roofline = 0};
  for (size_t i = 0; i < n; i++) s[i].duration_ns = predict(&truth, &s[i]);
  struct ferry_hw_cost fit;
  double r2 = 0;
  assert_int_equal(ferry_calibrate_fit(s, n, &fit, &r2), FERRY_OK);
  assert_int_equal(fit.roofline, 0);
  assert_true(fabs(fit.ns_per_byte - 0.1) < 1e-6);
  assert_true(fabs(fit.ns_per_flop - 0.02) < 1e-7);
  assert_true(fabs(fit.overhead_ns - 5000) < 1.0);
  assert_true(r2 > 0.999999);
}

static void test_recovers_roofline_form(void **state) {
  (void)state;
  struct ferry_calib_sample s[128];
  size_t n = shapes(s, 128);
  const struct ferry_hw_cost truth = {.overhead_ns = 3000, .ns_per_byte = 0.05, .ns_per_flop = 0.004, .roofline = 1};
  for (size_t i = 0; i < n; i++) s[i].duration_ns = predict(&truth, &s[i]);
  struct ferry_hw_cost fit;
  assert_int_equal(ferry_calibrate_fit(s, n, &fit, NULL), FERRY_OK);
  assert_int_equal(fit.roofline, 1);
  for (size_t i = 0; i < n; i++) assert_true(fabs(predict(&fit, &s[i]) / s[i].duration_ns - 1) < 1e-6);
}

/* Multiplicative noise (±40 %, seeded): relative least squares alone would come out low; the
 * fit's durations must add up to the measured total, and the per-byte cost stay close. */
static void test_noisy_total_preserved(void **state) {
  (void)state;
  struct ferry_calib_sample s[128];
  size_t n = shapes(s, 128);
  const struct ferry_hw_cost truth = {.overhead_ns = 2000, .ns_per_byte = 0.08, .ns_per_flop = 0.01, .roofline = 0};
  uint64_t x = 12345;
  double measured = 0;
  for (size_t i = 0; i < n; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    double u = (double)(x >> 11) / 9007199254740992.0; /* [0, 1) */
    s[i].duration_ns = predict(&truth, &s[i]) * (0.6 + 0.8 * u);
    measured += s[i].duration_ns;
  }
  struct ferry_hw_cost fit;
  assert_int_equal(ferry_calibrate_fit(s, n, &fit, NULL), FERRY_OK);
  double predicted = 0;
  for (size_t i = 0; i < n; i++) predicted += predict(&fit, &s[i]);
  assert_true(fabs(predicted / measured - 1) < 1e-9);
  assert_true(fabs(fit.ns_per_byte / truth.ns_per_byte - 1) < 0.25);
}

static void test_degenerate(void **state) {
  (void)state;
  struct ferry_hw_cost fit;
  assert_int_equal(ferry_calibrate_fit(NULL, 0, &fit, NULL), FERRY_ERR_INVALID);
  /* nothing but a fixed cost: the mean */
  struct ferry_calib_sample s[4] = {{0, 0, 100}, {0, 0, 200}, {0, 0, 300}, {0, 0, 400}};
  assert_int_equal(ferry_calibrate_fit(s, 4, &fit, NULL), FERRY_OK);
  assert_true(fit.ns_per_byte == 0 && fit.ns_per_flop == 0);
  double predicted = 0;
  for (int i = 0; i < 4; i++) predicted += predict(&fit, &s[i]);
  assert_true(fabs(predicted - 1000) < 1e-6);
}

/* A probe that fails (its scratch folder cannot be made) says where and releases everything
 * (the ASan build's leak check fails this test otherwise: it lost its event). */
/* link.contention: kernels of 12 shapes, each run with no copy beside it and beside copies that
 * overlapped a quarter, half or all of it, costing 0.3 ns more per ns of overlap, with +-2 %
 * noise (seeded) and one kernel per shape the OS descheduled (10x its time): the within-shape
 * fit recovers 0.3 whatever each shape costs. Without any overlap there is nothing to fit. */
static void test_recovers_contention(void **state) {
  (void)state;
  struct ferry_calib_overlap s[12 * 41];
  size_t n = 0;
  uint64_t rng = 7;
  for (int g = 0; g < 12; g++) {
    const double base = 1e4 * (1 + g * g); /* 10 us to 1.2 ms */
    for (int r = 0; r < 40; r++) {
      rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
      const double noise = 1 + 0.04 * ((double)(rng >> 11) / 9007199254740992.0 - 0.5);
      const double ov = base * 0.25 * (r % 5); /* ns of it with a copy beside it */
      s[n++] = (struct ferry_calib_overlap){(uint64_t)g, (base + 0.3 * ov) * noise, ov};
    }
    s[n++] = (struct ferry_calib_overlap){(uint64_t)g, 10 * base, 0};
  }
  struct ferry_calib_contention f;
  assert_int_equal(ferry_calibrate_fit_contention(s, n, &f), FERRY_OK);
  if (fabs(f.contention - 0.3) > 0.02) fail_msg("contention %.4f +- %.4f", f.contention, f.std_error);
  assert_true(f.std_error > 0 && f.std_error < 0.01);
  assert_int_equal(f.samples, 12 * 40); /* the descheduled ones left out */
  assert_int_equal(f.overlapped, 12 * 32);
  assert_true(f.r2 > 0.5 && f.r2 <= 1);
  for (size_t i = 0; i < n; i++) s[i].overlap_ns = 0;
  assert_int_equal(ferry_calibrate_fit_contention(s, n, &f), FERRY_OK);
  assert_true(f.contention == 0 && f.overlapped == 0);
  assert_int_equal(ferry_calibrate_fit_contention(s, 0, &f), FERRY_ERR_INVALID);
}

static void test_failed_probe(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("calib");
  char file[600];
  snprintf(file, sizeof file, "%s/not-a-folder", dir);
  tu_write_file(file, "x", 1);
  struct ferry_hw_profile p;
  assert_int_not_equal(ferry_calibrate_probe(file, NULL, &p), FERRY_OK);
  assert_true(tu_contains(ferry_last_error(), file));
  tu_rmtree(dir);
  free(dir);
}

/* A recorded host run fitted: R^2 per kernel kind and the runtime's host costs (step, layer)
 * land in the profile; the profile loads and simulates. */
static void test_fit_from_run(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("calibrate"), args[2048], *out = NULL;
  snprintf(args, sizeof args, "model gen --preset tiny-dense --layers 2 --out '%s/m' --quiet", dir);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  free(out);
  snprintf(args, sizeof args,
           "run --model '%s/m' --synthetic rate=200,n=6,prompt=24,output=6 --device-budget 4MiB --db '%s/r.db' --quiet",
           dir, dir);
  if (tu_run_ferry(args, &out) != 0) fail_msg("%s", out);
  free(out);
  snprintf(args, sizeof args, "calibrate --db '%s/r.db' --run 1 --base h100-pcie --out '%s/fit.json'", dir, dir);
  if (tu_run_ferry(args, &out) != 0) fail_msg("%s", out);
  assert_true(tu_contains(out, "matmul"));
  assert_true(tu_contains(out, "(R^2 "));
  assert_true(tu_contains(out, "step "));
  assert_true(tu_contains(out, "% of the runs' time)")); /* how much the gaps between steps weigh */
  assert_true(tu_contains(out, "layers: "));
  assert_true(tu_contains(out, "had a copy beside them")); /* the overlap the contention fit saw */
  assert_true(tu_contains(out, "contention "));
  /* every kernel kind the run recorded is fitted, so their shares of the kernel time add up */
  double shares = 0;
  int kinds = 0;
  for (const char *at = out; (at = strstr(at, "; ")) != NULL; at++) {
    double pct;
    char tail[24];
    if (sscanf(at, "; %lf %% of kernel %15s", &pct, tail) == 2 && !strcmp(tail, "time)")) {
      assert_true(pct >= 0 && pct <= 100);
      shares += pct;
      kinds++;
    }
  }
  if (kinds < 4 || shares < 99.0 || shares > 100.6) fail_msg("%d kinds' shares add up to %g %%:\n%s", kinds, shares, out);
  free(out);
  snprintf(args, sizeof args, "%s/fit.json", dir);
  ferry_hw *hw = NULL;
  assert_int_equal(ferry_hw_open(&hw, args), FERRY_OK);
  const struct ferry_hw_profile *p = ferry_hw_get(hw);
  assert_true(p->has_runtime);
  assert_int_equal(p->runtime.fused_dequant, 0); /* the host executor expands weights first */
  assert_true(p->runtime.step_ns >= 0 && p->runtime.layer_ns >= 0);
  const struct ferry_hw_cost *mm = ferry_hw_cost_of(p, "matmul");
  assert_non_null(mm);
  assert_true(mm->r2 != 0 && mm->r2 <= 1);
  int fitted_step = 0;
  for (size_t i = 0; i < p->n_fitted; i++) fitted_step |= !strcmp(p->fitted[i], "runtime.step_ns");
  assert_true(fitted_step);
  /* what the fit does not touch is the base's: its disk's write rate (left out before) */
  ferry_hw *base = NULL;
  assert_int_equal(ferry_hw_open(&base, "h100-pcie"), FERRY_OK);
  assert_true(ferry_hw_get(base)->disk.write_gbps > 0);
  assert_true(p->disk.write_gbps == ferry_hw_get(base)->disk.write_gbps);
  ferry_hw_close(base);
  ferry_hw_close(hw);
  snprintf(args, sizeof args, "sim --model '%s/m' --hw '%s/fit.json' --synthetic rate=200,n=6,prompt=24,output=6 "
                              "--device-budget 4MiB --quiet", dir, dir);
  if (tu_run_ferry(args, &out) != 0) fail_msg("%s", out);
  assert_true(tu_contains(out, "requests: 6 done"));
  free(out);
  tu_rmtree(dir);
  free(dir);
}

/* A tiny model's run recorded in DIR/r.db, then `sql` applied to its database (the timeline
 * made to look like another recorder's): at least `min_changes` rows must change. */
static void recorded_run_edited(const char *dir, const char *sql, int min_changes) {
  char path[1024], *out = NULL;
  if (tu_run_ferryf(&out, "model gen --preset tiny-dense --layers 2 --out '%s/m' --quiet", dir) != 0) fail_msg("%s", out);
  free(out);
  if (tu_run_ferryf(&out, "run --model '%s/m' --synthetic rate=200,n=6,prompt=24,output=6 --device-budget 4MiB "
                          "--db '%s/r.db' --quiet", dir, dir) != 0)
    fail_msg("%s", out);
  free(out);
  snprintf(path, sizeof path, "%s/r.db", dir);
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
  assert_true(sqlite3_changes(db) >= min_changes);
  sqlite3_close(db);
}

/* A run whose kernels carry no ferry kind, bytes or flops (a GPU timeline CUPTI recorded with
 * --profile, or an Nsight Systems import: here a host run's sizes erased) is said, and neither
 * kernel costs nor link.contention are fitted from it; its copies still are. */
static void test_unsized_kernels_said(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("calibunsized"), path[1024], *out = NULL;
  recorded_run_edited(dir, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET bytes = 0, flops = 0", 1);
  if (tu_run_ferryf(&out, "calibrate --db '%s/r.db' --run 1 --base h100-pcie --out '%s/fit.json'", dir, dir) != 0)
    fail_msg("%s", out);
  assert_true(tu_contains(out, "carry no ferry kind, bytes or flops"));
  assert_true(tu_contains(out, "record the run without --profile"));
  assert_false(tu_contains(out, "\nmatmul "));
  assert_false(tu_contains(out, "\ncontention "));
  assert_true(tu_contains(out, "\nh2d ")); /* the copies are fitted */
  free(out);
  snprintf(path, sizeof path, "%s/fit.json", dir);
  ferry_hw *hw = NULL;
  assert_int_equal(ferry_hw_open(&hw, path), FERRY_OK);
  const struct ferry_hw_profile *p = ferry_hw_get(hw);
  assert_null(ferry_hw_cost_of(p, "matmul"));
  for (size_t i = 0; i < p->n_fitted; i++) assert_string_not_equal(p->fitted[i], "link.contention");
  ferry_hw_close(hw);
  tu_rmtree(dir);
  free(dir);
}

/* Host-to-device copies all of one size and duration (an offload run streams one block size)
 * cannot tell a fixed cost from a rate: said, and the base's rate kept, not a fit that put the
 * whole time in the fixed cost. */
static void test_one_size_copies_said(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("calibonesize"), path[1024], *out = NULL;
  recorded_run_edited(dir, "UPDATE CUPTI_ACTIVITY_KIND_MEMCPY SET bytes = 1000000, end = start + 50000 WHERE copyKind = 1",
                      3);
  if (tu_run_ferryf(&out, "calibrate --db '%s/r.db' --run 1 --base h100-pcie --out '%s/fit.json'", dir, dir) != 0)
    fail_msg("%s", out);
  if (!tu_contains(out, "no rate fitted (1000000 to 1000000 bytes: one size cannot tell a fixed cost from a rate)"))
    fail_msg("%s", out);
  free(out);
  snprintf(path, sizeof path, "%s/fit.json", dir);
  ferry_hw *hw = NULL, *base = NULL;
  assert_int_equal(ferry_hw_open(&hw, path), FERRY_OK);
  assert_int_equal(ferry_hw_open(&base, "h100-pcie"), FERRY_OK);
  const struct ferry_hw_profile *p = ferry_hw_get(hw);
  assert_true(p->link.h2d_gbps == ferry_hw_get(base)->link.h2d_gbps);
  for (size_t i = 0; i < p->n_fitted; i++) assert_string_not_equal(p->fitted[i], "link.h2d_gbps");
  ferry_hw_close(base);
  ferry_hw_close(hw);
  tu_rmtree(dir);
  free(dir);
}

/* host.event_wake_ns from a host run's blocked waits: the time from the last op of another queue
 * that ended inside a wait to the wait's end, its median. Here the run's own waits are replaced
 * by 45 at known times: 10 that end 50 us after a copy of another queue ends inside them, 25
 * alike with an op of the waiting queue's own ending later inside them (not what it waited for:
 * taken, the median would be 10 us), and 10 inside which no other queue's op ends (not
 * measured). */
static void test_event_wake_fitted(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("calibwake"), path[1024], *out = NULL;
  recorded_run_edited(dir,
                      "DELETE FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;"
                      "WITH RECURSIVE i(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM i WHERE n < 44) "
                      "INSERT INTO CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (runId, start, end, streamId, syncType) "
                      "SELECT 1, 1000000000000 + n * 1000000, 1000000000000 + n * 1000000 + 200000, 0, 1 FROM i;"
                      "WITH RECURSIVE i(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM i WHERE n < 44) "
                      "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (runId, start, end, streamId, bytes, copyKind) "
                      "SELECT 1, e - 1000, e, s, 64, 10 FROM (SELECT 1000000000000 + n * 1000000 + 150000 AS e, 5 AS s "
                      "FROM i WHERE n < 35 UNION ALL SELECT 1000000000000 + n * 1000000 + 190000, 0 FROM i WHERE n >= 10 "
                      "AND n < 35 UNION ALL SELECT 1000000000000 + n * 1000000 - 5000, 5 FROM i WHERE n >= 35);",
                      45);
  if (tu_run_ferryf(&out, "calibrate --db '%s/r.db' --run 1 --base h100-pcie --out '%s/fit.json'", dir, dir) != 0)
    fail_msg("%s", out);
  if (!tu_contains(out, "event wake       35 waits: 50000 ns")) fail_msg("%s", out);
  free(out);
  snprintf(path, sizeof path, "%s/fit.json", dir);
  ferry_hw *hw = NULL;
  assert_int_equal(ferry_hw_open(&hw, path), FERRY_OK);
  const struct ferry_hw_profile *p = ferry_hw_get(hw);
  assert_int_equal(p->host.event_wake_ns, 50000);
  int fitted = 0;
  for (size_t i = 0; i < p->n_fitted; i++) fitted |= !strcmp(p->fitted[i], "host.event_wake_ns");
  assert_true(fitted);
  ferry_hw_close(hw);
  tu_rmtree(dir);
  free(dir);
}

/* The number before " ops:" on the line of kind in calibrate's output (0 when absent). */
static long ops_of(const char *out, const char *kind) {
  char key[64];
  snprintf(key, sizeof key, "\n%-12s ", kind);
  const char *at = strstr(out, key);
  return at ? strtol(at + strlen(key), NULL, 10) : 0;
}

/* The simulated duration of a fixed workload under profile json (from the JSON summary). */
static double simulated_duration_s(const char *dir, const char *json) {
  char *out = NULL;
  if (tu_run_ferryf(&out, "sim --model '%s/m' --hw '%s/%s' --synthetic rate=200,n=6,prompt=24,output=6 "
                          "--device-budget 4MiB --format json --quiet", dir, dir, json) != 0)
    fail_msg("%s", out);
  const char *at = strstr(out, "\"duration_s\":");
  if (!at) fail_msg("no duration_s in %s", out);
  double v = strtod(at + strlen("\"duration_s\":"), NULL);
  free(out);
  return v;
}

/* Several runs fitted together: their ops pool into one fit (twice the ops for two runs), two
 * identical runs (the simulator's, deterministic) give the fit of one, runs of different
 * executors and missing runs are refused by name, and a malformed list is a usage error. */
static void test_fit_pooled_runs(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("calibpool"), *out = NULL, *one = NULL;
  if (tu_run_ferryf(&out, "model gen --preset tiny-dense --layers 2 --out '%s/m' --quiet", dir) != 0) fail_msg("%s", out);
  free(out);
  for (int i = 0; i < 2; i++) {
    if (tu_run_ferryf(&out, "sim --model '%s/m' --hw h100-pcie --synthetic rate=200,n=6,prompt=24,output=6 "
                            "--device-budget 4MiB --db '%s/r.db' --quiet", dir, dir) != 0)
      fail_msg("%s", out);
    free(out);
  }
  if (tu_run_ferryf(&out, "run --model '%s/m' --synthetic rate=200,n=6,prompt=24,output=6 --device-budget 4MiB "
                          "--db '%s/r.db' --quiet", dir, dir) != 0)
    fail_msg("%s", out);
  free(out);
  if (tu_run_ferryf(&one, "calibrate --db '%s/r.db' --run 1 --base h100-pcie --out '%s/one.json'", dir, dir) != 0)
    fail_msg("%s", one);
  if (tu_run_ferryf(&out, "calibrate --db '%s/r.db' --run 1,2 --base h100-pcie --out '%s/two.json'", dir, dir) != 0)
    fail_msg("%s", out);
  assert_true(ops_of(one, "matmul") > 0);
  assert_int_equal(ops_of(out, "matmul"), 2 * ops_of(one, "matmul"));
  assert_int_equal(ops_of(out, "norm"), 2 * ops_of(one, "norm"));
  assert_true(tu_contains(out, "(fitted to runs 1,2)"));
  assert_true(tu_contains(out, "rates, times and efficiencies rest on:"));
  free(out);
  free(one);
  /* the written profile keeps the sources of what it did not measure (the base's datasheet
   * figures), notes what it fitted, and its fitted costs count as fitted */
  {
    char path[4200];
    snprintf(path, sizeof path, "%s/one.json", dir);
    ferry_hw *hw = NULL;
    assert_int_equal(ferry_hw_open(&hw, path), FERRY_OK);
    struct ferry_hw_figure *v = NULL;
    size_t n = 0;
    assert_int_equal(ferry_hw_figures(ferry_hw_get(hw), &v, &n), FERRY_OK);
    int datasheet = 0, fitted_costs = 0, fitted_note = 0;
    for (size_t i = 0; i < n; i++) {
      if (!strcmp(v[i].path, "gpu.mem_bw_gbps"))
        datasheet = v[i].basis == FERRY_HW_BASIS_SOURCED && tu_contains(v[i].source, "H100");
      if (!strncmp(v[i].path, "cost.", 5)) fitted_costs += v[i].basis == FERRY_HW_BASIS_FITTED;
      if (!strcmp(v[i].path, "runtime.layer_ns"))
        fitted_note = v[i].basis == FERRY_HW_BASIS_FITTED;
    }
    assert_true(datasheet);
    assert_true(fitted_costs > 0);
    assert_true(fitted_note);
    ferry_hw_figures_free(v);
    ferry_hw_close(hw);
  }
  /* the same samples twice: the same costs where they were measured (collinear terms may split
   * differently, so the comparison is of what the profiles predict) */
  const double duration_one = simulated_duration_s(dir, "one.json"), duration_two = simulated_duration_s(dir, "two.json");
  assert_true(duration_one > 0);
  assert_true(fabs(duration_two - duration_one) <= 1e-3 * duration_one);
  /* --run all is runs 1-3: the sim's and the host executor's */
  assert_int_not_equal(tu_run_ferryf(&out, "calibrate --db '%s/r.db' --run all --base h100-pcie --out '%s/all.json'",
                                     dir, dir), 0);
  assert_true(tu_contains(out, "run 1 was recorded on the sim executor, run 3 on host"));
  assert_false(tu_contains(out, "matmul ")); /* refused before fitting anything */
  free(out);
  assert_int_not_equal(tu_run_ferryf(&out, "calibrate --db '%s/r.db' --run 2 --run 7 --base h100-pcie --out '%s/x.json'",
                                     dir, dir), 0);
  assert_true(tu_contains(out, "no run 7"));
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "calibrate --db '%s/r.db' --run 1,,2 --base h100-pcie --out '%s/x.json'", dir, dir),
                   2);
  assert_true(tu_contains(out, "--run"));
  free(out);
  assert_int_equal(tu_run_ferryf(&out, "calibrate --db '%s/r.db' --run all --run 1 --base h100-pcie --out '%s/x.json'",
                                 dir, dir), 2);
  free(out);
  tu_rmtree(dir);
  free(dir);
}

/* A profile whose fitted costs explain little of their measurements: `ferry sim` warns and
 * records which in the run (WEAK_FITS), where the report flags it. */
static void test_weak_fit_warned(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("weakfit"), path[512], args[2048], *out = NULL;
  snprintf(path, sizeof path, "%s/weak.json", dir);
  const char *json = "{\"name\": \"weak\", \"kind\": \"gpu\", \"gpu\": \"h100-pcie\", \"link\": \"pcie5-x16\","
                     " \"host\": \"ddr5\", \"disk\": \"nvme-gen4\","
                     " \"cost\": {\"matmul\": {\"overhead_ns\": 1000, \"ns_per_byte\": 0.001, \"ns_per_flop\": 0, \"r2\": 0.42},"
                     " \"norm\": {\"overhead_ns\": 500, \"ns_per_byte\": 0, \"ns_per_flop\": 0, \"r2\": 0.97}}}";
  tu_write_file(path, json, strlen(json));
  snprintf(args, sizeof args, "sim --model tiny-dense --hw '%s' --synthetic rate=5,n=2,prompt=8,output=2 --db '%s/s.db' --quiet",
           path, dir);
  if (tu_run_ferry(args, &out) != 0) fail_msg("%s", out);
  assert_true(tu_contains(out, "warning: weak has weak fitted costs (matmul R^2 0.42 < 0.9)"));
  free(out);
  snprintf(args, sizeof args, "%s/s.db", dir);
  sqlite3 *db = NULL;
  assert_int_equal(sqlite3_open_v2(args, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  sqlite3_stmt *q = NULL;
  assert_int_equal(sqlite3_prepare_v2(db, "SELECT value FROM META_DATA_EXPORT WHERE name = 'WEAK_FITS'", -1, &q, NULL),
                   SQLITE_OK);
  assert_int_equal(sqlite3_step(q), SQLITE_ROW);
  assert_string_equal((const char *)sqlite3_column_text(q, 0), "matmul R^2 0.42");
  sqlite3_finalize(q);
  sqlite3_close(db);
  tu_rmtree(dir);
  free(dir);
}

/* Write profile `name` (a runtime preset applied when given) and read the file back: NULL when
 * every figure came back, else the first one that did not. */
static const char *write_read_back(const char *dir, const char *name, const char *runtime, ferry_hw **back) {
  ferry_hw *hw = NULL;
  assert_int_equal(ferry_hw_open(&hw, name), FERRY_OK);
  if (runtime) assert_int_equal(ferry_hw_set_runtime(hw, runtime), FERRY_OK);
  char path[1024];
  snprintf(path, sizeof path, "%s/written.json", dir);
  const struct ferry_hw_profile *p = ferry_hw_get(hw);
  if (ferry_hw_write_json(p, p->fitted, p->n_fitted, "test", path) != FERRY_OK) fail_msg("%s", ferry_last_error());
  if (ferry_hw_open(back, path) != FERRY_OK) fail_msg("%s written back: %s", name, ferry_last_error());
  const char *differs = ferry__hw_first_difference(p, ferry_hw_get(*back));
  ferry_hw_close(hw);
  return differs;
}

/* Every catalogue profile written by ferry_hw_write_json() (what `ferry calibrate` writes from its
 * base) reads back with every figure it had: the composed parts' host cores and per-core peaks
 * (AMX too), the disk's write rate and the interconnect section were left out before; a runtime
 * preset's AMX and allocation figures come through; figures whose 0 is not their default
 * (gpu.launch_overhead_ns, host.cpu_op_ns) are written as 0. */
static void test_write_reads_back(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("hwwrite");
  char **names = NULL;
  size_t n = 0;
  assert_int_equal(ferry_hw_list(&names, &n), FERRY_OK);
  assert_true(n >= 40);
  for (size_t i = 0; i < n; i++) {
    ferry_hw *back = NULL;
    const char *differs = write_read_back(dir, names[i], NULL, &back);
    if (differs) fail_msg("%s written and read back: %s differs", names[i], differs);
    ferry_hw_close(back);
  }
  ferry_hw_list_free(names, n);
  ferry_hw *back = NULL;
  assert_null(write_read_back(dir, "rtx-4090d-1s", "ktransformers-v0.3", &back));
  const struct ferry_hw_profile *p = ferry_hw_get(back);
  assert_true(p->host.core_gflops.amx_int8 == 4505.6 && p->host.cores == 32 && p->disk.write_gbps > 0);
  assert_int_equal(p->runtime.cpu_amx, 1);
  assert_int_equal(p->runtime.cpu_amx_min_rows, 5);
  ferry_hw_close(back);
  assert_null(write_read_back(dir, "4xl40s", NULL, &back));
  assert_int_equal(ferry_hw_gpu_count(ferry_hw_get(back)), 4);
  ferry_hw_close(back);
  char path[1024];
  snprintf(path, sizeof path, "%s/zeros.json", dir);
  static const char zeros[] = "{\"name\": \"z\", \"kind\": \"gpu\", \"gpu\": {\"name\": \"g\", "
                              "\"launch_overhead_ns\": 0}, \"host\": {\"name\": \"h\", \"cpu_op_ns\": 0}, \"cost\": {}}";
  tu_write_file(path, zeros, strlen(zeros));
  assert_null(write_read_back(dir, path, NULL, &back));
  p = ferry_hw_get(back);
  assert_true(p->gpu.launch_overhead_ns == 0 && p->host.cpu_op_ns == 0 && p->has_cost && !p->cost_set);
  ferry_hw_close(back);
  tu_rmtree(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_recovers_sum_form),
      cmocka_unit_test(test_recovers_roofline_form),
      cmocka_unit_test(test_noisy_total_preserved),
      cmocka_unit_test(test_degenerate),
      cmocka_unit_test(test_recovers_contention),
      cmocka_unit_test(test_failed_probe),
      cmocka_unit_test(test_fit_from_run),
      cmocka_unit_test(test_unsized_kernels_said),
      cmocka_unit_test(test_one_size_copies_said),
      cmocka_unit_test(test_event_wake_fitted),
      cmocka_unit_test(test_fit_pooled_runs),
      cmocka_unit_test(test_weak_fit_warned),
      cmocka_unit_test(test_write_reads_back),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
