/* common/metrics.c: one definition of each latency metric. The percentile is linear
 * interpolation between closest ranks, TPOT excludes the first token, a request counts once
 * complete; and `ferry sim`'s summary, `ferry db show` and `ferry report` print the same
 * percentiles for one run, to the digits each prints (they used nearest rank in the engine and
 * interpolation in the database readers, so a P99 differed). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/metrics.h"
#include "testutil.h"

static void test_percentile_definition(void **state) {
  (void)state;
  double v[100];
  for (int i = 0; i < 100; i++) v[99 - i] = (double)(i + 1); /* 100 .. 1: sorted by the distribution */
  struct ferry__dist d;
  ferry__dist_compute(v, 100, &d);
  assert_int_equal(d.count, 100);
  assert_true(fabs(d.mean - 50.5) < 1e-12);
  assert_true(fabs(d.p50 - 50.5) < 1e-12); /* rank 49.5: between 50 and 51 */
  assert_true(fabs(d.p90 - 90.1) < 1e-12); /* rank 89.1 */
  assert_true(fabs(d.p99 - 99.01) < 1e-12);
  assert_true(d.max == 100);
  double one = 7;
  ferry__dist_compute(&one, 1, &d);
  assert_true(d.p50 == 7 && d.p99 == 7 && d.max == 7);
  ferry__dist_compute(NULL, 0, &d);
  assert_int_equal(d.count, 0);
}

static void test_request_latency(void **state) {
  (void)state;
  struct ferry__request_latency l;
  assert_true(ferry__request_latency(100, 300, 1300, 11, &l));
  assert_true(l.ttft_ns == 200 && l.e2e_ns == 1200 && l.has_tpot && l.tpot_ns == 100); /* 10 tokens after the first */
  assert_true(ferry__request_latency(0, 50, 50, 1, &l));
  assert_false(l.has_tpot); /* one token: no time per output token */
  assert_false(ferry__request_latency(0, 50, -1, 4, &l)); /* never finished */
  assert_false(ferry__request_latency(0, -1, -1, 4, &l));
  /* hostile times cannot overflow */
  assert_true(ferry__request_latency(INT64_MIN, INT64_MAX, INT64_MAX, 2, &l));
  assert_true(l.ttft_ns > 1e19);
  assert_true(ferry__throughput_tok_s(100, 0, 2000000000) == 50);
  assert_true(ferry__throughput_tok_s(100, 5, 5) == 0);
}

/* A printed figure and how far it may be from what was printed (half its last digit), in ns. */
struct figure {
  double ns, half_ns;
};

static struct figure figure_of(const char *number, double unit_ns) {
  const char *dot = strchr(number, '.');
  int decimals = 0;
  if (dot)
    while (dot[1 + decimals] >= '0' && dot[1 + decimals] <= '9') decimals++;
  return (struct figure){strtod(number, NULL) * unit_ns, 0.5 * pow(10, -decimals) * unit_ns};
}

static double unit_ns(const char *unit) {
  return !strcmp(unit, "s") ? 1e9 : !strcmp(unit, "ms") ? 1e6 : !strcmp(unit, "us") ? 1e3 : 1;
}

static int agree(struct figure a, struct figure b) { return fabs(a.ns - b.ns) <= a.half_ns + b.half_ns + 1e-6; }

/* "TTFT  1.25 ms  1.18 ms  1.38 ms  1.49 ms  1.50 ms" of the run's summary: mean p50 p90 p99 max */
static void run_row(const char *out, const char *name, struct figure f[5]) {
  char head[16];
  snprintf(head, sizeof head, "\n%s ", name);
  const char *p = strstr(out, head);
  assert_non_null(p);
  p += strlen(head);
  for (int i = 0; i < 5; i++) {
    char num[32], unit[8];
    int used = 0;
    assert_int_equal(sscanf(p, " %31s %7s%n", num, unit, &used), 2);
    f[i] = figure_of(num, unit_ns(unit));
    p += used;
  }
}

/* "  TTFT    mean      1.247  p50      1.176  p90      1.380  p99      1.485  ms" of db show */
static void db_row(const char *out, const char *name, struct figure f[4]) {
  char head[16];
  snprintf(head, sizeof head, "  %s ", name);
  const char *p = strstr(out, head);
  assert_non_null(p);
  char n[4][32];
  assert_int_equal(sscanf(p + strlen(head), " mean %31s p50 %31s p90 %31s p99 %31s", n[0], n[1], n[2], n[3]), 4);
  for (int i = 0; i < 4; i++) f[i] = figure_of(n[i], 1e6);
}

/* The fields of the report's runs.csv row of run r1 (quoted fields may hold commas). */
static int csv_fields(const char *line, char fields[24][96]) {
  int n = 0, quoted = 0;
  size_t k = 0;
  for (const char *p = line; *p && *p != '\n' && n < 24; p++) {
    if (*p == '"') quoted = !quoted;
    else if (*p == ',' && !quoted) {
      fields[n++][k] = '\0';
      k = 0;
    } else if (k + 1 < sizeof fields[0]) {
      fields[n][k++] = *p;
    }
  }
  if (n < 24) fields[n++][k] = '\0';
  return n;
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  char *text = calloc(1, 1 << 20);
  size_t got = fread(text, 1, (1 << 20) - 1, f);
  text[got] = '\0';
  fclose(f);
  return text;
}

static void test_outputs_agree(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("metrics"), args[1024], *run = NULL, *show = NULL;
  /* seven requests: few enough that the percentile definitions differ in the printed digits */
  snprintf(args, sizeof args,
           "sim --model tiny-moe --hw h100-pcie --synthetic rate=20,n=7,prompt=32,output=9 --device-budget 8MiB "
           "--db '%s/m.db' --quiet",
           dir);
  if (tu_run_ferry(args, &run) != 0) fail_msg("ferry %s: %s", args, run);
  snprintf(args, sizeof args, "db show --db '%s/m.db' 1", dir);
  if (tu_run_ferry(args, &show) != 0) fail_msg("ferry %s: %s", args, show);
  snprintf(args, sizeof args, "report --db '%s/m.db' --out '%s/rep' --quiet", dir, dir);
  char *rep_out = NULL;
  if (tu_run_ferry(args, &rep_out) != 0) fail_msg("ferry %s: %s", args, rep_out);
  free(rep_out);
  char path[1024];
  snprintf(path, sizeof path, "%s/rep/tables/runs.csv", dir);
  char *csv = slurp(path), header[24][96], row[24][96];
  const int nh = csv_fields(csv, header);
  const char *r1 = strstr(csv, "\nr1,");
  assert_non_null(r1);
  assert_int_equal(csv_fields(r1 + 1, row), nh);
  static const char *const names[3] = {"TTFT", "TPOT", "e2e"};
  for (int m = 0; m < 3; m++) {
    struct figure r[5], d[4];
    run_row(run, names[m], r);
    db_row(show, names[m], d);
    for (int i = 0; i < 4; i++) /* mean, P50, P90, P99 */
      if (!agree(r[i], d[i]))
        fail_msg("%s column %d: run %.0f ns, db show %.0f ns\n%s\n%s", names[m], i, r[i].ns, d[i].ns, run, show);
    for (int q = 0; q < 2; q++) { /* the report's P50 and P99 columns */
      char col[32];
      snprintf(col, sizeof col, "%s P%s (ms)", names[m], q ? "99" : "50");
      int c = 0;
      while (c < nh && strcmp(header[c], col)) c++;
      assert_true(c < nh);
      const struct figure rep = figure_of(row[c], 1e6), mine = r[q ? 3 : 1];
      if (!agree(rep, mine) || !agree(rep, d[q ? 3 : 1]))
        fail_msg("%s: report %s ms, run %.0f ns, db show %.0f ns", col, row[c], mine.ns, d[q ? 3 : 1].ns);
    }
  }
  free(csv);
  free(run);
  free(show);
  tu_rmtree(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_percentile_definition),
      cmocka_unit_test(test_request_latency),
      cmocka_unit_test(test_outputs_agree),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
