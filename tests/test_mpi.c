/* `ferry sweep` and `ferry plan` under `mpirun --oversubscribe -np 2`: the sweep shares its
 * combinations out over the ranks, each writes its own database and rank 0 merges them, giving
 * the same complete runs (configurations, sweep keys and figures) as the sweep without MPI, and
 * a second run resumes with nothing to do; the plan sends simulations to the other rank and
 * prints the same figures. Skipped where the build has no MPI module or mpirun is missing
 * (the sanitizer build never has one). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "testutil.h"

static int have_mpi(void) {
  const char *bin = getenv("FERRY_BIN");
  if (!bin) return 0;
  char module[4096];
  snprintf(module, sizeof module, "%s", bin);
  char *slash = strrchr(module, '/');
  if (!slash) return 0;
  snprintf(slash + 1, sizeof module - (size_t)(slash + 1 - module), "ferry_mpi.so");
  return access(module, R_OK) == 0 && system("command -v mpirun >/dev/null 2>&1") == 0;
}

/* `mpirun -np 2 ferry ARGS`: the exit status, stdout and stderr in *out. */
static int run_mpi(const char *args, char **out) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "mpirun --allow-run-as-root --oversubscribe -np 2 %s %s 2>&1", getenv("FERRY_BIN"), args);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t cap = 1 << 16, len = 0, got;
  char *buf = malloc(cap);
  while ((got = fread(buf + len, 1, cap - len - 1, p)) > 0) {
    len += got;
    if (cap - len < 2) buf = realloc(buf, cap *= 2);
  }
  buf[len] = '\0';
  int status = pclose(p);
  *out = buf;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static cJSON *json_of(const char *args) {
  char *out = NULL;
  int rc = tu_run_ferry(args, &out);
  if (rc != 0) fail_msg("ferry %s: exit %d\n%s", args, rc, out);
  cJSON *doc = cJSON_Parse(out);
  if (!doc) fail_msg("ferry %s: not JSON:\n%s", args, out);
  free(out);
  return doc;
}

/* "config_hash sweep_key ttft_p99 tpot_p99 throughput steps\n" per complete run, sorted. */
static char *runs_text(const char *db) {
  char args[2048];
  snprintf(args, sizeof args, "db list --db %s --format json", db);
  cJSON *list = json_of(args);
  char *lines[64];
  int n = 0;
  const cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(list, "runs")) {
    if (strcmp(cJSON_GetObjectItemCaseSensitive(r, "status")->valuestring, "complete")) continue;
    const int id = (int)cJSON_GetObjectItemCaseSensitive(r, "id")->valuedouble;
    snprintf(args, sizeof args, "db show %d --db %s --format json", id, db);
    cJSON *show = json_of(args);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(show, "metrics");
    char *line = malloc(512);
    snprintf(line, 512, "%s %.9g %.9g %.9g %.0f\n", cJSON_GetObjectItemCaseSensitive(r, "config_hash")->valuestring,
             cJSON_GetObjectItemCaseSensitive(m, "ttft_p99_ms")->valuedouble,
             cJSON_GetObjectItemCaseSensitive(m, "tpot_p99_ms")->valuedouble,
             cJSON_GetObjectItemCaseSensitive(m, "throughput_tok_s")->valuedouble,
             cJSON_GetObjectItemCaseSensitive(m, "steps")->valuedouble);
    cJSON_Delete(show);
    assert_true(n < 64);
    lines[n++] = line;
  }
  cJSON_Delete(list);
  /* sorted by configuration: the ranks finish in any order */
  for (int i = 1; i < n; i++)
    for (int k = i; k > 0 && strcmp(lines[k - 1], lines[k]) > 0; k--) {
      char *t = lines[k];
      lines[k] = lines[k - 1];
      lines[k - 1] = t;
    }
  char *all = calloc(1, 64 * 512 + 1);
  for (int i = 0; i < n; i++) {
    strcat(all, lines[i]);
    free(lines[i]);
  }
  return all;
}

static void test_sweep(void **state) {
  (void)state;
  if (!have_mpi()) skip();
  char *dir = tu_mkdtemp("mpi"), spec[4096], args[8192], *out = NULL;
  snprintf(spec, sizeof spec, "%s/spec.json", dir);
  const char *text = "{\"executor\": [\"sim\"], \"hw\": [\"h100-pcie\", \"t4\"], \"model\": [\"tiny-moe\"],"
                     " \"synthetic\": [\"rate=20,n=8,prompt=16,output=4\"], \"max_batch\": [2, 4],"
                     " \"expert_cache\": [\"lru\", \"lfu\"], \"device_budget\": [\"8MiB\"]}";
  tu_write_file(spec, text, strlen(text));
  snprintf(args, sizeof args, "sweep --spec %s --db %s/one.db -j 2 --quiet", spec, dir);
  assert_int_equal(tu_run_ferry(args, &out), 0);
  free(out);
  snprintf(args, sizeof args, "sweep --spec %s --db %s/two.db -j 1", spec, dir);
  int rc = run_mpi(args, &out);
  if (rc != 0) fail_msg("mpirun ferry %s: exit %d\n%s", args, rc, out);
  assert_true(tu_contains(out, "rank 1 of 2"));
  assert_true(tu_contains(out, "merged rank 1's 4 run(s)"));
  assert_true(tu_contains(out, "8 ran, 0 failed"));
  free(out);
  char path[4200];
  snprintf(path, sizeof path, "%s/one.db", dir);
  char *a = runs_text(path);
  snprintf(path, sizeof path, "%s/two.db", dir);
  char *b = runs_text(path);
  assert_int_equal((int)(strlen(a) > 0), 1);
  if (strcmp(a, b)) fail_msg("the MPI sweep's runs differ:\n%s---\n%s", a, b);
  /* eight complete runs, one per combination (the merge kept the sweep keys) */
  int lines = 0;
  for (const char *c = b; *c; c++) lines += *c == '\n';
  assert_int_equal(lines, 8);
  free(a);
  /* resumed: nothing left to run, nothing added */
  rc = run_mpi(args, &out);
  if (rc != 0) fail_msg("mpirun ferry %s (again): exit %d\n%s", args, rc, out);
  assert_true(tu_contains(out, "8 already complete, 0 ran"));
  free(out);
  char *c = runs_text(path);
  assert_string_equal(b, c);
  free(b);
  free(c);
  tu_rmtree(dir);
  free(dir);
}

static void test_plan(void **state) {
  (void)state;
  if (!have_mpi()) skip();
  const char *args = "plan --model tiny-moe --synthetic arrivals=poisson,n=60,prompt=48,output=24 "
                     "--slo ttft_p99=40ms,tpot_p99=4ms --hw h100-pcie,t4,l4 --quant native --max-batch 4,8 "
                     "--rate 200 -j 1 --quiet --format json";
  cJSON *a = json_of(args);
  char *out = NULL;
  int rc = run_mpi(args, &out);
  if (rc != 0) fail_msg("mpirun ferry %s: exit %d\n%s", args, rc, out);
  cJSON *b = cJSON_Parse(out);
  if (!b) fail_msg("not JSON:\n%s", out);
  free(out);
  const cJSON *ha = cJSON_GetObjectItemCaseSensitive(a, "hardware"), *hb = cJSON_GetObjectItemCaseSensitive(b, "hardware");
  assert_int_equal(cJSON_GetArraySize(ha), cJSON_GetArraySize(hb));
  for (int i = 0; i < cJSON_GetArraySize(ha); i++) {
    const cJSON *x = cJSON_GetArrayItem(ha, i), *y = cJSON_GetArrayItem(hb, i);
    assert_true(cJSON_GetObjectItemCaseSensitive(x, "max_rps")->valuedouble ==
                cJSON_GetObjectItemCaseSensitive(y, "max_rps")->valuedouble);
    assert_true(cJSON_GetObjectItemCaseSensitive(x, "simulations")->valuedouble ==
                cJSON_GetObjectItemCaseSensitive(y, "simulations")->valuedouble);
  }
  assert_string_equal(cJSON_GetObjectItemCaseSensitive(a, "cheapest")->valuestring,
                      cJSON_GetObjectItemCaseSensitive(b, "cheapest")->valuestring);
  cJSON_Delete(a);
  cJSON_Delete(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_sweep), cmocka_unit_test(test_plan)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
