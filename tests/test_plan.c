/* Capacity planning decisions (ferry/plan.h) on numbers, and `ferry plan` end to end on a tiny
 * model: the rate search ends within its tolerance of the capacity a brute-force scan of the
 * same predicate finds, whatever it starts from; a queue served slower than it fills is
 * saturated and a slow but stable one is not; costs and the cheapest pick follow their
 * definitions; `ferry plan`'s rate is within its tolerance of a brute-force scan (--verify) and
 * meets the SLO when `ferry sim` replays its printed command, the cheapest profile is the
 * cheapest eligible, saturation stops the rate and is reported, and two plans print the same
 * figures. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/metrics.h"
#include "ferry/plan.h"
#include "testutil.h"

/* ---- the rate search -------------------------------------------------------------------- */

/* Run a search against "feasible below capacity", returning the probes it took. */
static int search(double capacity, double start, double tol, double *found) {
  struct ferry_plan_search s;
  ferry_plan_search_init(&s, start, 1e-3, 1000, tol);
  double r;
  int n = 0;
  while (ferry_plan_search_next(&s, &r)) {
    assert_true(r > 0);
    ferry_plan_search_report(&s, r, r <= capacity, r > capacity * 1.02, r <= capacity ? 0 : 1 + (r - capacity) / capacity);
    assert_true(++n < 64);
  }
  *found = s.best_rps;
  return n;
}

static void test_search_brackets(void **state) {
  (void)state;
  const double tol = 0.05;
  /* from far below, near, and far above the capacity */
  const double starts[] = {0.05, 0.5, 0.85, 1.0, 1.2, 3.5};
  for (size_t i = 0; i < sizeof starts / sizeof starts[0]; i++) {
    double found;
    int n = search(10.0, 10.0 * starts[i], tol, &found);
    if (!(found <= 10.0 && found * (1 + tol) >= 10.0))
      fail_msg("start %g: found %g, capacity 10 (tolerance %g)", starts[i], found, tol);
    assert_true(n <= 14);
  }
  /* nothing meets the SLO: the search gives up at the floor */
  struct ferry_plan_search s;
  ferry_plan_search_init(&s, 8, 1, 16, tol);
  double r;
  while (ferry_plan_search_next(&s, &r)) ferry_plan_search_report(&s, r, 0, 0, 0);
  assert_true(s.best_rps == 0 && s.fail_rps == 1);
  /* everything does: it stops at the ceiling */
  ferry_plan_search_init(&s, 8, 1, 16, tol);
  while (ferry_plan_search_next(&s, &r)) ferry_plan_search_report(&s, r, 1, 0, 0);
  assert_true(s.best_rps == 16 && s.fail_rps == 0);
  /* the smallest saturated probe is kept apart from other failures */
  ferry_plan_search_init(&s, 8, 1, 16, tol);
  ferry_plan_search_report(&s, 12, 0, 1, 0);
  ferry_plan_search_report(&s, 9, 0, 0, 1.5);
  ferry_plan_search_report(&s, 14, 0, 1, 0);
  assert_true(s.saturated_rps == 12 && s.fail_rps == 9);
  /* a limit missed by the same at half the rate: the load is not what misses it */
  ferry_plan_search_init(&s, 8, 0.01, 16, tol);
  int n = 0;
  while (ferry_plan_search_next(&s, &r)) {
    ferry_plan_search_report(&s, r, 0, 0, r > 4 ? 3.0 : 1.9);
    n++;
  }
  assert_true(s.unreachable && s.best_rps == 0);
  assert_true(n <= 4);
}

/* The floor check: a clear miss at the floor ends a search at once; a floor that meets the SLO,
 * or misses it narrowly, leaves the rates probed (and the answer) as without the check. */
static void test_search_floor_check(void **state) {
  (void)state;
  struct ferry_plan_search s;
  double r;
  int n = 0;
  ferry_plan_search_init(&s, 8, 0.01, 16, 0.05);
  s.floor_check = 1;
  assert_true(ferry_plan_search_floor_next(&s));
  while (ferry_plan_search_next(&s, &r)) {
    assert_true(r == 0.01);
    ferry_plan_search_report(&s, r, 0, 0, FERRY_PLAN_FLOOR_MISS * 1.5);
    n++;
  }
  assert_int_equal(n, 1);
  assert_true(s.unreachable && s.floor_probed && !s.floor_ok && s.best_rps == 0);
  /* after a first miss: the floor comes second */
  ferry_plan_search_init(&s, 8, 0.01, 16, 0.05);
  s.floor_check = 2;
  n = 0;
  while (ferry_plan_search_next(&s, &r)) {
    assert_true(n == 0 ? r == 8 : r == 0.01);
    ferry_plan_search_report(&s, r, 0, 0, FERRY_PLAN_FLOOR_MISS * 1.5);
    n++;
  }
  assert_true(n == 2 && s.unreachable);
  /* capacity 3 (feasible below), a narrow miss at the floor (noise): the same probes after it,
   * the floor first or after the first miss (8 > 3) */
  const double misses[] = {0, 1.01};
  for (int k = 0; k < 4; k++) {
    double plain[64], checked[64];
    int np = 0, nc = 0;
    for (int check = 0; check < 2; check++) {
      ferry_plan_search_init(&s, 8, 0.01, 16, 0.05);
      s.floor_check = check ? 1 + k / 2 : 0;
      for (;;) {
        const int floor_next = ferry_plan_search_floor_next(&s);
        if (!ferry_plan_search_next(&s, &r)) break;
        const int floor_probe = check && !s.floor_probed && r == 0.01;
        assert_int_equal(floor_next, floor_probe); /* says which probe is the floor check */
        const int ok = floor_probe ? misses[k % 2] == 0 : r <= 3;
        ferry_plan_search_report(&s, r, ok, 0, ok ? 0 : floor_probe ? misses[k % 2] : 1 + (r - 3) / 3);
        if (!floor_probe) {
          if (check) checked[nc++] = r;
          else plain[np++] = r;
        }
        assert_true(np < 64 && nc < 64);
      }
      assert_true(s.best_rps <= 3 && s.best_rps * 1.05 >= 3 && !s.unreachable);
      if (check) assert_true(s.floor_probed && s.floor_ok == (misses[k % 2] == 0));
    }
    assert_int_equal(np, nc);
    assert_memory_equal(plain, checked, (size_t)np * sizeof plain[0]);
  }
}

/* The floor check's bounds from part of a sample: whatever the unknown values (non-negative),
 * the whole sample's percentiles and mean, as ferry computes them, are at least the bounds; and
 * the percentile bound is tight (the unknown values all 0 reach it). */
static void test_partial_sample_bounds(void **state) {
  (void)state;
  unsigned seed = 11;
  double v[120], w[120];
  static const double pct[] = {50, 90, 99};
  int proven = 0;
  for (int trial = 0; trial < 400; trial++) {
    seed = seed * 1103515245u + 12345u;
    const size_t n = 1 + seed % 120;
    seed = seed * 1103515245u + 12345u;
    const size_t known = seed % (n + 1);
    for (size_t i = 0; i < n; i++) {
      seed = seed * 1103515245u + 12345u;
      v[i] = (double)(seed % 100000) * 1e3;
    }
    for (int zero = 0; zero < 2; zero++) {
      /* the unknown values: random, or all 0 (the lowest they can be) */
      memcpy(w, v, n * sizeof *w);
      if (zero)
        for (size_t i = known; i < n; i++) w[i] = 0;
      double bound[4] = {ferry_plan_mean_floor(w, known, n)};
      for (int p = 0; p < 3; p++) bound[p + 1] = ferry_plan_percentile_floor(w, known, n, pct[p]);
      struct ferry__dist d;
      ferry__dist_compute(w, n, &d); /* sorts w: the bounds were taken first */
      const double whole[4] = {d.mean, d.p50, d.p90, d.p99};
      for (int k = 0; k < 4; k++)
        if (!(bound[k] <= whole[k])) fail_msg("n %zu, %zu known: bound %d is %g above the whole's %g", n, known, k, bound[k], whole[k]);
      const size_t lo = (size_t)(99 / 100.0 * (double)(n - 1)); /* ferry's rank of the P99 */
      if (known < n - lo) {
        assert_true(bound[3] == 0); /* too few known: nothing proven */
      } else if (zero) {
        assert_true(bound[3] == w[lo]); /* the rest at 0: the value at the rank itself */
        proven++;
      }
    }
  }
  assert_true(proven > 10);
  assert_true(ferry_plan_percentile_floor(NULL, 0, 10, 99) == 0 && ferry_plan_mean_floor(v, 5, 0) == 0);
}

/* A brute-force scan of a monotone predicate on a fine grid against the search. */
static void test_search_brute_force(void **state) {
  (void)state;
  unsigned seed = 7;
  for (int trial = 0; trial < 200; trial++) {
    seed = seed * 1103515245u + 12345u;
    const double capacity = 0.1 + (double)(seed % 100000) / 1000.0; /* 0.1 .. 100 */
    seed = seed * 1103515245u + 12345u;
    const double start = capacity * (0.2 + (double)(seed % 1000) / 500.0); /* 0.2 .. 2.2 x */
    double found;
    search(capacity, start, 0.05, &found);
    /* brute force: the largest of 100000 grid rates in (0, 1000] (the search's range) that passes */
    double brute = 0;
    for (int g = 1; g <= 100000; g++) {
      const double r = 1000.0 * g / 100000.0;
      if (r <= capacity) brute = r;
    }
    if (!(found <= capacity && found * 1.05 >= brute))
      fail_msg("capacity %g start %g: search %g, brute force %g", capacity, start, found, brute);
  }
}

/* ---- saturation -------------------------------------------------------------------------- */

/* n requests arriving every `gap` s, served by `servers` FIFO servers taking `service` s each;
 * the first token comes when service starts. */
static void queue(int n, double gap, double service, int servers, int64_t *arr, int64_t *first, int64_t *fin) {
  double free_at[64] = {0};
  for (int i = 0; i < n; i++) {
    const double a = i * gap;
    int s = 0;
    for (int k = 1; k < servers; k++)
      if (free_at[k] < free_at[s]) s = k;
    const double start = a > free_at[s] ? a : free_at[s];
    free_at[s] = start + service;
    arr[i] = (int64_t)(a * 1e9);
    first[i] = (int64_t)(start * 1e9) + 1;
    fin[i] = (int64_t)(free_at[s] * 1e9);
  }
}

static void test_saturation(void **state) {
  (void)state;
  enum { N = 200 };
  int64_t arr[N], first[N], fin[N];
  struct ferry_plan_load l;
  /* served twice as fast as it fills: stable */
  queue(N, 1.0, 0.5, 1, arr, first, fin);
  assert_int_equal(ferry_plan_load_analyze(arr, first, fin, N, &l), FERRY_OK);
  assert_false(l.saturated);
  assert_true(fabs(l.offered_rps - 1.0) < 1e-6);
  /* twice as slow: the line grows by half a request a second */
  queue(N, 1.0, 2.0, 1, arr, first, fin);
  assert_int_equal(ferry_plan_load_analyze(arr, first, fin, N, &l), FERRY_OK);
  assert_true(l.saturated);
  assert_true(fabs(l.queue_growth_rps - 0.5) < 0.05);
  assert_true(l.served_rps < 0.6);
  /* slow requests (60 s each) on enough servers: long-lived, nobody waits, stable */
  queue(N, 1.0, 60.0, 64, arr, first, fin);
  assert_int_equal(ferry_plan_load_analyze(arr, first, fin, N, &l), FERRY_OK);
  assert_false(l.saturated);
  /* unfinished requests count as waiting; a burst (all at once) is not a rate */
  for (int i = 0; i < N; i++) first[i] = fin[i] = i < N / 4 ? arr[i] + 1 : -1;
  assert_int_equal(ferry_plan_load_analyze(arr, first, fin, N, &l), FERRY_OK);
  assert_true(l.saturated);
  for (int i = 0; i < N; i++) arr[i] = 0;
  assert_int_equal(ferry_plan_load_analyze(arr, first, fin, N, &l), FERRY_OK);
  assert_false(l.saturated);
  assert_int_equal(ferry_plan_load_analyze(NULL, first, fin, N, &l), FERRY_ERR_INVALID);
}

/* ---- costs and the cheapest pick --------------------------------------------------------- */

static void test_costs(void **state) {
  (void)state;
  struct ferry_plan_cost c;
  /* 2 machines at $3/h serving 10 req/s of 100 output tokens: 1000 tok/s, $6/h */
  ferry_plan_cost(3.0, 2, 10.0, 100.0, &c);
  assert_true(fabs(c.usd_per_hour - 6.0) < 1e-12);
  assert_true(fabs(c.tokens_per_s - 1000.0) < 1e-9);
  assert_true(fabs(c.usd_per_mtok - 6.0 / (1000.0 * 3600) * 1e6) < 1e-9);
  assert_true(fabs(c.tokens_per_s_per_usd - 1000.0 / 6.0) < 1e-9);
  ferry_plan_cost(0, 1, 10.0, 100.0, &c); /* no price: no cost figures */
  assert_true(c.usd_per_hour == 0 && c.usd_per_mtok == 0 && c.tokens_per_s > 0);
  const struct ferry_plan_choice ch[] = {
      {.usd_per_hour = 1.0, .usd_per_mtok = 0.5, .eligible = 0}, /* cheapest, but misses the demand */
      {.usd_per_hour = 0, .usd_per_mtok = 0, .eligible = 1},     /* no price */
      {.usd_per_hour = 2.0, .usd_per_mtok = 0.9, .eligible = 1},
      {.usd_per_hour = 2.0, .usd_per_mtok = 0.7, .eligible = 1}, /* same price, cheaper per token */
      {.usd_per_hour = 5.0, .usd_per_mtok = 0.1, .eligible = 1},
  };
  assert_int_equal(ferry_plan_cheapest(ch, 5), 3);
  assert_int_equal(ferry_plan_cheapest(ch, 2), -1);
  /* variants of one machine (h100-pcie+link=...): the same price and price per token at the
   * demand; the one with the most headroom wins, wherever it is listed */
  const struct ferry_plan_choice same[] = {
      {.usd_per_hour = 2.0, .usd_per_mtok = 0.7, .max_rps = 0.46, .eligible = 1},
      {.usd_per_hour = 2.0, .usd_per_mtok = 0.7, .max_rps = 0.78, .eligible = 1},
      {.usd_per_hour = 2.0, .usd_per_mtok = 0.7, .max_rps = 0.78, .eligible = 1}, /* a tie: the first */
      {.usd_per_hour = 2.0, .usd_per_mtok = 0.7, .max_rps = 5.0, .eligible = 0},
  };
  assert_int_equal(ferry_plan_cheapest(same, 4), 1);
}

/* ---- ferry plan ---------------------------------------------------------------------------- */

static cJSON *plan_json(const char *args) {
  char *out = NULL;
  int rc = tu_run_ferry(args, &out);
  if (rc != 0) fail_msg("ferry %s: exit %d\n%s", args, rc, out ? out : "");
  /* the JSON document is what stdout holds; progress lines are off (--quiet) */
  cJSON *doc = cJSON_Parse(out);
  if (!doc) fail_msg("ferry %s: not JSON:\n%s", args, out);
  free(out);
  return doc;
}

static double num(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* Run `command` (a ferry sim line from the plan) at `scale` times its rate; the summary. */
static cJSON *sim_at(const char *command, double scale) {
  char args[4096];
  const char *rs = strstr(command, "--rate-scale ");
  assert_non_null(rs);
  const double x = strtod(rs + 13, NULL);
  const char *after = strchr(rs + 13, ' ');
  snprintf(args, sizeof args, "%.*s--rate-scale %.17g%s --quiet --format json", (int)(rs - (command + 6)),
           command + 6, x * scale, after ? after : "");
  char *out = NULL;
  int rc = tu_run_ferry(args, &out);
  if (rc != 0) fail_msg("ferry %s: exit %d\n%s", args, rc, out ? out : "");
  cJSON *doc = cJSON_Parse(out);
  free(out);
  assert_non_null(doc);
  return doc;
}

/* The id of the run recorded for a profile in DIR/study.db (the workers write them in any order). */
static int run_of(const char *dir, const char *hw) {
  char args[2100], *out = NULL;
  snprintf(args, sizeof args, "db list --db %s/study.db --format json", dir);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  cJSON *doc = cJSON_Parse(out);
  free(out);
  assert_non_null(doc);
  int id = -1;
  const cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(doc, "runs")) {
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(r, "hardware");
    if (cJSON_IsString(h) && !strcmp(h->valuestring, hw)) id = (int)num(r, "id");
  }
  cJSON_Delete(doc);
  assert_true(id > 0);
  return id;
}

static void test_plan_cli(void **state) {
  (void)state;
  /* a tiny model on three priced profiles, two batch limits and one format so it stays quick;
   * with --db the request slices stay (DB.plan/) for the commands the plan prints */
  char *dir = tu_mkdtemp("plan"), args[2048];
  snprintf(args, sizeof args,
           "plan --model tiny-moe --synthetic arrivals=poisson,n=60,prompt=48,output=24 "
           "--slo ttft_p99=40ms,tpot_p99=4ms --hw h100-pcie,t4,l4 --quant native --max-batch 4,8 "
           "--rate 200 -j 2 --verify 41 --quiet --format json --db %s/study.db",
           dir);
  cJSON *a = plan_json(args);
  snprintf(args + strlen(args), sizeof args - strlen(args), "-again");
  cJSON *b = plan_json(args);
  const cJSON *hws = cJSON_GetObjectItemCaseSensitive(a, "hardware"), *hwb = cJSON_GetObjectItemCaseSensitive(b, "hardware");
  assert_int_equal(cJSON_GetArraySize(hws), 3);
  const double tol = num(a, "tolerance");
  double best_price = INFINITY;
  const char *best = NULL;
  for (int i = 0; i < 3; i++) {
    const cJSON *h = cJSON_GetArrayItem(hws, i), *h2 = cJSON_GetArrayItem(hwb, i);
    const char *name = cJSON_GetObjectItemCaseSensitive(h, "hardware")->valuestring;
    const double max = num(h, "max_rps");
    /* deterministic: the same figures twice */
    assert_true(max == num(h2, "max_rps"));
    assert_true(num(h, "simulations") == num(h2, "simulations"));
    assert_true(max > 0);
    /* a brute-force scan of 41 rates from 0.5 to 1.5 times the answer (steps of 2.5 %) with
     * the same predicate: the search stopped within its tolerance of the scan's answer */
    const double brute = num(cJSON_GetObjectItemCaseSensitive(h, "verify"), "brute_force_rps");
    if (!(brute >= max * (1 - 1e-9) && brute <= max * (1 + tol)))
      fail_msg("%s: search %g req/s, brute force %g (tolerance %g)", name, max, brute, tol);
    /* the plan's point meets the SLO when `ferry sim` replays its command */
    const char *command = cJSON_GetObjectItemCaseSensitive(h, "command")->valuestring;
    cJSON *at = sim_at(command, 1.0);
    const cJSON *run = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(at, "runs"), 0);
    const double ttft = num(cJSON_GetObjectItemCaseSensitive(run, "ttft_ms"), "p99"),
                 tpot = num(cJSON_GetObjectItemCaseSensitive(run, "tpot_ms"), "p99");
    if (!(ttft <= 40 && tpot <= 4)) fail_msg("%s at %g req/s: ttft p99 %g, tpot p99 %g", name, max, ttft, tpot);
    cJSON_Delete(at);
    /* and its recorded run has the plan's latencies (db show's percentiles are the plan's) */
    char show[2200], *out = NULL;
    snprintf(show, sizeof show, "db show %d --db %s/study.db --format json", run_of(dir, name), dir);
    assert_int_equal(tu_run_ferry(show, &out), 0);
    cJSON *sh = cJSON_Parse(out);
    free(out);
    assert_non_null(sh);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(sh, "run"), "hardware")->valuestring, name);
    const double db_ttft = num(cJSON_GetObjectItemCaseSensitive(sh, "metrics"), "ttft_p99_ms");
    if (!(fabs(db_ttft - num(h, "ttft_p99_ms")) <= 1e-6 * db_ttft))
      fail_msg("%s: recorded ttft p99 %g, plan %g", name, db_ttft, num(h, "ttft_p99_ms"));
    cJSON_Delete(sh);
    /* the probes above the answer's tolerance all failed (the verify scan's probes between the
     * answer and its tolerance may pass: the search stops within it, as checked above) */
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(h, "probes")) {
      const char *kind = cJSON_GetObjectItemCaseSensitive(p, "kind")->valuestring;
      if (strcmp(kind, "probe")) continue;
      const int ok = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "feasible"));
      const char *cfg = cJSON_GetObjectItemCaseSensitive(p, "config")->valuestring;
      const char *best_cfg = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(h, "config"), "text")->valuestring;
      if (!strcmp(cfg, best_cfg) && num(p, "rps") > max * (1 + tol)) assert_false(ok);
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(h, "meets_demand")) && num(h, "price_per_hour") < best_price) {
      best_price = num(h, "price_per_hour");
      best = name;
    }
  }
  const cJSON *cheapest = cJSON_GetObjectItemCaseSensitive(a, "cheapest");
  if (best) assert_string_equal(cheapest->valuestring, best);
  else assert_true(cJSON_IsNull(cheapest));
  cJSON_Delete(a);
  cJSON_Delete(b);
  /* the study: one recorded run per profile, with the plan's facts, and its report section */
  char path[4200];
  snprintf(path, sizeof path, "db list --db %s/study.db --format json", dir);
  char *out = NULL;
  assert_int_equal(tu_run_ferry(path, &out), 0);
  assert_true(tu_contains(out, "\"hardware\": \"t4\""));
  free(out);
  snprintf(path, sizeof path, "report --db %s/study.db --out %s/report", dir, dir);
  assert_int_equal(tu_run_ferry(path, &out), 0);
  assert_true(tu_contains(out, " plan"));
  free(out);
  snprintf(path, sizeof path, "%s/report/tables/plan-1.csv", dir);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char csv[8192];
  size_t len = fread(csv, 1, sizeof csv - 1, f);
  fclose(f);
  csv[len] = '\0';
  int rows = 0;
  for (const char *c = csv; *c; c++) rows += *c == '\n';
  assert_int_equal(rows, 4); /* the header and three profiles */
  assert_true(tu_contains(csv, "h100-pcie") && tu_contains(csv, "t4,") && tu_contains(csv, "l4,"));
  snprintf(path, sizeof path, "%s/report/plots/plan-1-pareto.svg", dir);
  assert_true(access(path, R_OK) == 0);
  tu_rmtree(dir);
  free(dir);
}

/* --sensitivity: the cheapest pick at the demand with each figure of its profile lower. The SLO
 * leaves the t4 4 % of TPOT headroom; half its memory bandwidth (or half the default GEMV
 * efficiency) costs more than that, a figure the run never uses costs nothing, and the unsourced
 * one that breaks the SLO is named. */
static void test_plan_sensitivity(void **state) {
  (void)state;
  static const char *args = "plan --model tiny-moe --synthetic arrivals=poisson,n=60,prompt=48,output=24 "
                            "--slo ttft_p99=40ms,tpot_p99=0.83ms --hw t4,l4 --quant native --max-batch 4,8 --rate 200 "
                            "-j 2 --quiet --sensitivity 50";
  char json_args[1024];
  snprintf(json_args, sizeof json_args, "%s --format json", args);
  cJSON *doc = plan_json(json_args);
  const cJSON *cheapest = cJSON_GetObjectItemCaseSensitive(doc, "cheapest");
  assert_true(cJSON_IsString(cheapest));
  const cJSON *sens = cJSON_GetObjectItemCaseSensitive(doc, "sensitivity");
  assert_non_null(sens);
  assert_string_equal(cJSON_GetObjectItemCaseSensitive(sens, "hardware")->valuestring, cheapest->valuestring);
  assert_true(num(sens, "step_pct") == 50 && num(sens, "rps_per_machine") == 200);
  const cJSON *base = cJSON_GetObjectItemCaseSensitive(sens, "as_planned");
  assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(base, "meets_slo")));
  const double tpot = num(base, "tpot_p99_ms");
  assert_true(tpot > 0 && tpot <= 0.83);
  int seen = 0;
  const cJSON *f;
  cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(sens, "figures")) {
    const char *name = cJSON_GetObjectItemCaseSensitive(f, "figure")->valuestring;
    const int meets = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(f, "meets_slo"));
    if (!strcmp(name, "gpu.mem_bw_gbps") || !strcmp(name, "gpu.efficiency.gemv")) {
      seen++;
      assert_false(meets);
      assert_true(num(f, "tpot_p99_ms") > 0.83 && num(f, "slo_ratio") > 1);
      assert_true(tu_contains(cJSON_GetObjectItemCaseSensitive(f, "verdict")->valuestring, "tpot_p99"));
    }
    if (!strcmp(name, "gpu.efficiency.gemv")) assert_string_equal(cJSON_GetObjectItemCaseSensitive(f, "basis")->valuestring, "default");
    if (!strcmp(name, "disk.read_gbps")) {
      seen++;
      assert_true(meets && num(f, "tpot_p99_ms") == tpot && num(f, "ttft_p99_ms") == num(base, "ttft_p99_ms"));
    }
  }
  assert_int_equal(seen, 3);
  cJSON_Delete(doc);
  /* text: the table after the plan's, the verdict, and the default named on stderr */
  char *out = NULL;
  assert_int_equal(tu_run_ferry(args, &out), 0);
  assert_true(tu_contains(out, "sensitivity of the cheapest, t4"));
  assert_true(tu_contains(out, "2 figure(s) 50 % lower break the SLO at the demand"));
  assert_true(tu_contains(out, "the SLO breaks with gpu.efficiency.gemv 50 % lower, and that figure is a ferry default"));
  free(out);
  assert_int_equal(tu_run_ferry("plan --model tiny-dense --synthetic n=10 --slo ttft_p99=1s --sensitivity 80", &out), 2);
  free(out);
}

/* Saturation reported, never averaged into the latencies: a demand far above every profile's
 * capacity is met by none, and the probes above capacity say the queue grew. */
static void test_plan_saturation(void **state) {
  (void)state;
  cJSON *a = plan_json("plan --model tiny-dense --synthetic n=80,prompt=64,output=32 --slo ttft_p99=10s "
                       "--hw t4 --quant native --max-batch 4 --rate 1000000 -j 1 --quiet --format json");
  const cJSON *h = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(a, "hardware"), 0);
  assert_false(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(h, "meets_demand")));
  assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(a, "cheapest")));
  /* with a loose TTFT limit, what stops the rate is the queue growing */
  const double sat = num(h, "saturated_above_rps"), max = num(h, "max_rps");
  assert_true(sat > max && max > 0);
  int saturated = 0;
  const cJSON *p;
  cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(h, "probes")) saturated += cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "saturated"));
  assert_true(saturated > 0);
  cJSON_Delete(a);
}

/* The pruned search (candidates skipped by their bound, searches ended once beaten, the floor
 * check) gives the answers of the exhaustive one: a small catalogue where one profile meets the
 * SLO and two miss it clearly even when idle (a dense 8B model: the T4 and L4 stream or read
 * their weights too slowly for the TPOT limit). */
static void test_plan_pruned_exhaustive(void **state) {
  (void)state;
  const char *base = "plan --model llama-3-8b --synthetic arrivals=poisson,n=40,prompt=48,output=16 "
                     "--slo ttft_p99=200ms,tpot_p99=15ms --hw h100-pcie,t4,l4 --quant native,int8 --max-batch 4,8 "
                     "--rate 20 -j 2 --quiet --format json";
  char args[1024];
  cJSON *pruned = plan_json(base);
  snprintf(args, sizeof args, "%s --exhaustive", base);
  cJSON *full = plan_json(args);
  const cJSON *hp = cJSON_GetObjectItemCaseSensitive(pruned, "hardware"), *hf = cJSON_GetObjectItemCaseSensitive(full, "hardware");
  assert_int_equal(cJSON_GetArraySize(hp), 3);
  assert_int_equal(cJSON_GetArraySize(hf), 3);
  int feasible = 0, floor_verdicts = 0, prefix_verdicts = 0;
  for (int i = 0; i < 3; i++) {
    const cJSON *a = cJSON_GetArrayItem(hp, i), *b = cJSON_GetArrayItem(hf, i);
    const char *name = cJSON_GetObjectItemCaseSensitive(a, "hardware")->valuestring;
    assert_string_equal(name, cJSON_GetObjectItemCaseSensitive(b, "hardware")->valuestring);
    static const char *const same[] = {"max_rps", "ttft_p99_ms", "tpot_p99_ms", "usd_per_mtok"};
    for (size_t k = 0; k < sizeof same / sizeof same[0]; k++) {
      const double x = num(a, same[k]), y = num(b, same[k]);
      if (!(x == y || (isnan(x) && isnan(y)))) fail_msg("%s: %s %g pruned, %g exhaustive", name, same[k], x, y);
    }
    const cJSON *ca = cJSON_GetObjectItemCaseSensitive(a, "config"), *cb = cJSON_GetObjectItemCaseSensitive(b, "config");
    assert_int_equal(cJSON_IsNull(ca), cJSON_IsNull(cb));
    if (!cJSON_IsNull(ca))
      assert_string_equal(cJSON_GetObjectItemCaseSensitive(ca, "text")->valuestring,
                          cJSON_GetObjectItemCaseSensitive(cb, "text")->valuestring);
    assert_int_equal(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "meets_demand")),
                     cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(b, "meets_demand")));
    feasible += num(a, "max_rps") > 0;
    assert_true(num(a, "simulations") <= num(b, "simulations"));
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(a, "probes")) {
      const char *why = cJSON_GetObjectItemCaseSensitive(p, "why")->valuestring;
      const int verdict = tu_contains(why, "no rate meets the SLO") && tu_contains(why, "floor");
      floor_verdicts += verdict;
      prefix_verdicts += verdict && tu_contains(why, "lower bounds");
    }
  }
  /* the case is the one meant: a profile meets the SLO, the floor check ended some searches,
   * and pruning saved simulations */
  assert_int_equal(feasible, 1);
  assert_true(floor_verdicts > 0);
  assert_true(prefix_verdicts > 0); /* some from a prefix of the slice (plan_floor_prove) */
  assert_true(num(pruned, "simulations") < num(full, "simulations"));
  const cJSON *c1 = cJSON_GetObjectItemCaseSensitive(pruned, "cheapest"), *c2 = cJSON_GetObjectItemCaseSensitive(full, "cheapest");
  assert_true(cJSON_IsString(c1) && cJSON_IsString(c2));
  assert_string_equal(c1->valuestring, c2->valuestring);
  cJSON_Delete(pruned);
  cJSON_Delete(full);
}

/* Parallelism on a multi-GPU machine: a TPOT limit that one GPU cannot meet at any rate and
 * tensor parallel over two can. A two-layer model as wide as Llama-3-8B (only its config.json:
 * the simulator reads no weights) keeps decoding memory-bound and the simulations short. The
 * plan picks a tensor parallel configuration, its printed `ferry sim` command meets the SLO, and
 * the pruned search gives the exhaustive one's answer. */
static void test_plan_tensor_parallel(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("plan-tp"), path[4200], args[4600];
  snprintf(path, sizeof path, "%s/model", dir);
  assert_int_equal(mkdir(path, 0777), 0);
  snprintf(path, sizeof path, "%s/model/config.json", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 4096, "
        "\"intermediate_size\": 14336, \"num_hidden_layers\": 2, \"num_attention_heads\": 32, "
        "\"num_key_value_heads\": 8, \"vocab_size\": 4096, \"max_position_embeddings\": 8192, "
        "\"rms_norm_eps\": 1e-5, \"rope_theta\": 500000.0, \"torch_dtype\": \"bfloat16\"}\n",
        f);
  assert_int_equal(fclose(f), 0);
  snprintf(args, sizeof args,
           "plan --model %s/model --synthetic arrivals=poisson,n=40,prompt=48,output=16 --slo ttft_p99=200ms,tpot_p99=1.2ms "
           "--hw 4xl40s --quant native --max-batch 4,8 --max-gpus 4 --rate 20 -j 2 --quiet --format json",
           dir);
  const size_t base = strlen(args);
  snprintf(args + base, sizeof args - base, " --exhaustive");
  cJSON *full = plan_json(args);
  /* with --db the request slices stay, for the command the plan prints */
  snprintf(args + base, sizeof args - base, " --db %s/study.db", dir);
  cJSON *pruned = plan_json(args);
  const cJSON *h = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(pruned, "hardware"), 0),
              *hf = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(full, "hardware"), 0);
  const double max = num(h, "max_rps");
  assert_true(max > 0 && max == num(hf, "max_rps"));
  const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(h, "config");
  assert_string_equal(cJSON_GetObjectItemCaseSensitive(cfg, "parallel")->valuestring, "tp");
  assert_true(num(cfg, "gpus_per_replica") >= 2);
  assert_true(num(cfg, "gpus_per_replica") * num(cfg, "replicas") == 4);
  assert_string_equal(cJSON_GetObjectItemCaseSensitive(cfg, "text")->valuestring,
                      cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(hf, "config"), "text")->valuestring);
  /* one GPU per engine (four replicas) was searched and met the SLO at no rate */
  int one_gpu = 0;
  const cJSON *p;
  cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(h, "probes")) {
    const char *c = cJSON_GetObjectItemCaseSensitive(p, "config")->valuestring;
    if (tu_contains(c, ", tp ") || strcmp(cJSON_GetObjectItemCaseSensitive(p, "kind")->valuestring, "probe")) continue;
    assert_false(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "feasible")));
    assert_true(num(p, "replicas") == 4);
    one_gpu++;
  }
  assert_true(one_gpu > 0);
  /* the printed command is that configuration, and meets the SLO when replayed */
  const char *command = cJSON_GetObjectItemCaseSensitive(h, "command")->valuestring;
  assert_true(tu_contains(command, "--parallel tp"));
  if (num(cfg, "replicas") > 1) assert_true(tu_contains(command, "--router least-tokens"));
  cJSON *at = sim_at(command, 1.0);
  const cJSON *run = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(at, "runs"), 0);
  const double ttft = num(cJSON_GetObjectItemCaseSensitive(run, "ttft_ms"), "p99"),
               tpot = num(cJSON_GetObjectItemCaseSensitive(run, "tpot_ms"), "p99");
  if (!(ttft <= 200 && tpot <= 1.2)) fail_msg("at %g req/s: ttft p99 %g, tpot p99 %g", max, ttft, tpot);
  if (!(fabs(tpot - num(h, "tpot_p99_ms")) <= 1e-6 * tpot)) fail_msg("replayed tpot p99 %g, plan %g", tpot, num(h, "tpot_p99_ms"));
  cJSON_Delete(at);
  cJSON_Delete(pruned);
  cJSON_Delete(full);
  tu_rmtree(dir);
  free(dir);
}

/* An offload variant that only changes a prefetch depth the engine does not use (Mixtral on an
 * L4: attention resident, experts cached in device memory and homed in host memory, no
 * predictor) takes the simulations of the configuration without it: each point taken is the
 * point the exhaustive plan (which simulates every one) got for that configuration and rate,
 * and the answers are the same. */
static void test_plan_same_runs(void **state) {
  (void)state;
  const char *base = "plan --model mixtral-8x7b --synthetic arrivals=poisson,n=20,prompt=48,output=8 "
                     "--slo ttft_p99=8s,tpot_p99=3s --hw l4 --quant native --max-batch 4,8 --rate 1 -j 2 --quiet "
                     "--format json";
  char args[1024];
  cJSON *pruned = plan_json(base);
  snprintf(args, sizeof args, "%s --exhaustive", base);
  cJSON *full = plan_json(args);
  assert_true(num(pruned, "reused") > 0);
  assert_true(num(full, "reused") == 0);
  const cJSON *a = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(pruned, "hardware"), 0),
              *b = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(full, "hardware"), 0);
  assert_true(num(a, "max_rps") > 0);
  assert_true(num(a, "max_rps") == num(b, "max_rps"));
  assert_string_equal(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(a, "config"), "text")->valuestring,
                      cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(b, "config"), "text")->valuestring);
  int taken = 0, checked = 0;
  const cJSON *p, *q;
  cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(a, "probes")) {
    if (!tu_contains(cJSON_GetObjectItemCaseSensitive(p, "why")->valuestring, "not simulated")) continue;
    const char *cfg = cJSON_GetObjectItemCaseSensitive(p, "config")->valuestring;
    assert_true(tu_contains(cfg, "prefetch 2"));
    taken++;
    cJSON_ArrayForEach(q, cJSON_GetObjectItemCaseSensitive(b, "probes")) {
      if (strcmp(cJSON_GetObjectItemCaseSensitive(q, "config")->valuestring, cfg) != 0 ||
          strcmp(cJSON_GetObjectItemCaseSensitive(q, "kind")->valuestring,
                 cJSON_GetObjectItemCaseSensitive(p, "kind")->valuestring) != 0 ||
          num(q, "rps") != num(p, "rps"))
        continue;
      static const char *const same[] = {"ttft_p99_ms", "tpot_p99_ms", "e2e_p99_ms"};
      for (size_t k = 0; k < sizeof same / sizeof same[0]; k++) {
        const double x = num(p, same[k]), y = num(q, same[k]);
        if (!(x == y || (isnan(x) && isnan(y)))) fail_msg("%s at %g: %s %g taken, %g simulated", cfg, num(p, "rps"), same[k], x, y);
      }
      assert_int_equal(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "feasible")),
                       cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(q, "feasible")));
      checked++;
      break;
    }
  }
  /* the case is the one meant: bounds and probes were taken, and simulated in the exhaustive plan */
  assert_true(taken >= 3);
  assert_true(checked >= 3);
  cJSON_Delete(pruned);
  cJSON_Delete(full);
}

static void test_plan_usage(void **state) {
  (void)state;
  char *out = NULL;
  assert_int_equal(tu_run_ferry("plan --model tiny-dense --synthetic n=10 --slo ttft_p99=fast", &out), 2);
  assert_true(tu_contains(out, "--slo"));
  free(out);
  assert_int_equal(tu_run_ferry("plan --model tiny-dense --synthetic n=10", &out), 2);
  assert_true(tu_contains(out, "missing --slo"));
  free(out);
  assert_int_equal(tu_run_ferry("plan --model tiny-dense --slo ttft_p99=1s", &out), 2);
  free(out);
  assert_int_equal(tu_run_ferry("plan --model tiny-dense --synthetic n=10 --slo ttft_p99=1s --hw ddr4", &out), 2);
  assert_true(tu_contains(out, "not a GPU profile"));
  free(out);
  assert_int_equal(tu_run_ferry("plan --help", &out), 0);
  assert_true(tu_contains(out, "Usage: ferry plan"));
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_search_brackets), cmocka_unit_test(test_search_brute_force),
      cmocka_unit_test(test_search_floor_check), cmocka_unit_test(test_partial_sample_bounds),
      cmocka_unit_test(test_plan_pruned_exhaustive),
      cmocka_unit_test(test_saturation),      cmocka_unit_test(test_costs),
      cmocka_unit_test(test_plan_cli),        cmocka_unit_test(test_plan_saturation),
      cmocka_unit_test(test_plan_usage), cmocka_unit_test(test_plan_sensitivity),      cmocka_unit_test(test_plan_same_runs),
      cmocka_unit_test(test_plan_tensor_parallel),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
