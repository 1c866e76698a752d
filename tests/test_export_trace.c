/* `ferry db export-trace` for Perfetto on a simulated run that streams every layer from disk:
 * tracks named compute / H2D / D2H / disk, flows from each disk read to its copy and from each
 * copy to the kernel that consumed it (later, on the right track, same layer), one request
 * span per request holding its prefill and decode, counters of memory, batch and KV use within
 * the capacity the run recorded, and step and time windows that keep only what overlaps them. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fsutil.h"
#include "testutil.h"

static char *dir;
static char db[512];

static int setup(void **state) {
  (void)state;
  dir = tu_mkdtemp("trace");
  snprintf(db, sizeof db, "%s/t.db", dir);
  char args[1024], *out;
  snprintf(args, sizeof args,
           "sim --model tiny-dense --hw l4 --synthetic rate=1000,n=6,prompt=32,output=8 --device-budget 6MiB "
           "--home disk --db '%s' --quiet",
           db);
  if (tu_run_ferry(args, &out) != 0) fail_msg("ferry %s:\n%s", args, out);
  free(out);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tu_rmtree(dir);
  free(dir);
  return 0;
}

static cJSON *export(int want_rc, const char *extra) {
  char path[700], args[1600], *out;
  snprintf(path, sizeof path, "%s/trace.json", dir);
  snprintf(args, sizeof args, "db export-trace --run 1 --out '%s' --db '%s' %s", path, db, extra);
  int rc = tu_run_ferry(args, &out);
  if (rc != want_rc) fail_msg("ferry %s: exit %d\n%s", args, rc, out);
  free(out);
  if (rc) return NULL;
  char *text;
  size_t len;
  assert_int_equal(ferry__read_file(path, 64 << 20, &text, &len, NULL), FERRY_OK);
  cJSON *j = cJSON_ParseWithLength(text, len);
  free(text);
  assert_non_null(j);
  return j;
}

static const char *str(const cJSON *e, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, k);
  return cJSON_IsString(v) ? v->valuestring : "";
}

static double num(const cJSON *e, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, k);
  return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* The tid of the track named `name` (-1 if none). */
static int track(const cJSON *events, const char *name) {
  const cJSON *e;
  cJSON_ArrayForEach(e, events) {
    if (strcmp(str(e, "ph"), "M") || strcmp(str(e, "name"), "thread_name")) continue;
    if (!strcmp(str(cJSON_GetObjectItem(e, "args"), "name"), name)) return (int)num(e, "tid");
  }
  return -1;
}

static void test_whole_run(void **state) {
  (void)state;
  cJSON *j = export(0, "");
  const cJSON *ev = cJSON_GetObjectItem(j, "traceEvents"), *e;
  const int compute = track(ev, "compute"), h2d = track(ev, "H2D"), disk = track(ev, "disk");
  assert_true(compute >= 0 && h2d >= 0 && disk >= 0);
  cJSON_ArrayForEach(e, ev) {
    if (!strcmp(str(e, "name"), "thread_name")) assert_null(strstr(str(cJSON_GetObjectItem(e, "args"), "name"), "queue"));
  }
  /* flows: every start has its finish, later, from a fetch to its consumer */
  int starts = 0, weights = 0, reads = 0;
  cJSON_ArrayForEach(e, ev) {
    if (strcmp(str(e, "ph"), "s")) continue;
    starts++;
    const double id = num(e, "id");
    const cJSON *f = NULL, *x;
    cJSON_ArrayForEach(x, ev) {
      if (!strcmp(str(x, "ph"), "f") && num(x, "id") == id) f = x;
    }
    assert_non_null(f);
    assert_true(num(f, "ts") >= num(e, "ts"));
    assert_string_equal(str(f, "bp"), "e");
    if (!strncmp(str(e, "name"), "weights L", 9)) {
      weights++;
      assert_int_equal((int)num(e, "tid"), h2d);
      assert_int_equal((int)num(f, "tid"), compute);
    } else if (!strncmp(str(e, "name"), "disk read L", 11)) {
      reads++;
      assert_int_equal((int)num(e, "tid"), disk);
      assert_int_equal((int)num(f, "tid"), h2d);
    }
  }
  assert_true(weights > 8 && reads > 8); /* every layer streams, every step */
  assert_int_equal(starts, weights + reads);
  /* requests: 6, each a span holding prefill and decode */
  int begins = 0, ends = 0, spans = 0;
  double kv_max = 0, batch_max = 0;
  int disk_cat = 0;
  cJSON_ArrayForEach(e, ev) {
    const char *ph = str(e, "ph");
    if (!strcmp(ph, "b")) {
      begins++;
      assert_int_equal((int)num(e, "pid"), 2);
      spans += !strncmp(str(e, "name"), "request ", 8);
    }
    ends += !strcmp(ph, "e");
    if (!strcmp(ph, "C") && !strcmp(str(e, "name"), "KV cache (tokens)")) {
      const double v = num(cJSON_GetObjectItem(e, "args"), "tokens");
      kv_max = v > kv_max ? v : kv_max;
    }
    if (!strcmp(ph, "C") && !strcmp(str(e, "name"), "batch (sequences)")) {
      const double v = num(cJSON_GetObjectItem(e, "args"), "sequences");
      batch_max = v > batch_max ? v : batch_max;
    }
    if (!strcmp(ph, "X") && !strcmp(str(e, "cat"), "disk")) {
      disk_cat++;
      assert_string_equal(str(cJSON_GetObjectItem(e, "args"), "copyKind"), "Disk-to-Host (ferry 100)");
    }
  }
  assert_int_equal(spans, 6);
  assert_int_equal(begins, 18);
  assert_int_equal(ends, 18);
  assert_true(disk_cat > 0);
  /* 6 sequences of at most 40 tokens in a cache of 8 x 40 */
  assert_true(batch_max == 6);
  assert_true(kv_max > 6 * 32 && kv_max <= 6 * 40);
  cJSON_Delete(j);
}

static void test_windows(void **state) {
  (void)state;
  cJSON *all = export(0, "");
  const int n_all = cJSON_GetArraySize(cJSON_GetObjectItem(all, "traceEvents"));
  cJSON_Delete(all);
  cJSON *j = export(0, "--steps 2:3");
  const cJSON *other = cJSON_GetObjectItem(j, "otherData"), *e;
  const double t0 = num(other, "t0_ns"), w0 = num(other, "window_start_ns"), w1 = num(other, "window_end_ns");
  assert_true(w0 > t0 && w1 > w0);
  const cJSON *ev = cJSON_GetObjectItem(j, "traceEvents");
  assert_true(cJSON_GetArraySize(ev) < n_all / 2);
  int x = 0;
  cJSON_ArrayForEach(e, ev) {
    if (strcmp(str(e, "ph"), "X")) continue;
    x++;
    const double start = t0 + num(e, "ts") * 1000, end = start + num(e, "dur") * 1000;
    assert_true(end >= w0 - 1 && start <= w1 + 1); /* overlaps, to the rounding of microseconds */
  }
  assert_true(x > 10);
  cJSON_Delete(j);
  /* a time window, open at its end */
  j = export(0, "--time 0.001:");
  assert_true(num(cJSON_GetObjectItem(j, "otherData"), "window_start_ns") > 0);
  cJSON_Delete(j);
  /* steps the run does not have, and malformed windows */
  export(1, "--steps 900:901");
  export(2, "--steps x:2");
  export(2, "--steps 5:2");
  export(2, "--time 5:2");
}

/* The database describes itself as nsys exports do. */
static void test_export_schema_rows(void **state) {
  (void)state;
  char args[800], *out;
  snprintf(args, sizeof args, "db list --db '%s'", db);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  free(out);
  snprintf(args, sizeof args, "sqlite3 '%s' \"SELECT value FROM META_DATA_EXPORT WHERE runId IS NULL AND "
                              "name = 'EXPORT_SCHEMA_VERSION'\" > '%s/v.txt'", db, dir);
  if (system(args) != 0) return; /* no sqlite3 shell */
  char path[700], *text;
  size_t len;
  snprintf(path, sizeof path, "%s/v.txt", dir);
  assert_int_equal(ferry__read_file(path, 1024, &text, &len, NULL), FERRY_OK);
  assert_string_equal(text, "3\n");
  free(text);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_whole_run),
      cmocka_unit_test(test_windows),
      cmocka_unit_test(test_export_schema_rows),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
