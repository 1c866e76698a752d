/* Test helpers: temporary folders, data paths and running the ferry command. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "ferry/engine.h"
#include "ferry/exec.h"
#include "ferry/gen.h"
#include "ferry/hw.h"
#include "ferry/model.h"
#include "ferry/store.h"
#include "testutil.h"

char *tu_mkdtemp(const char *tag) {
  const char *base = getenv("TMPDIR");
  if (!base || !*base) base = "/tmp";
  size_t n = strlen(base) + strlen(tag) + 32;
  char *path = malloc(n);
  assert_non_null(path);
  snprintf(path, n, "%s/ferry-%s-XXXXXX", base, tag);
  assert_non_null(mkdtemp(path));
  return path;
}

void tu_rmtree(const char *path) {
  if (path) ferry__rm_rf(path);
}

static char *join(const char *env, const char *fallback, const char *name) {
  const char *base = getenv(env);
  if (!base) base = fallback;
  if (!base) return NULL;
  size_t n = strlen(base) + strlen(name) + 2;
  char *p = malloc(n);
  assert_non_null(p);
  snprintf(p, n, "%s/%s", base, name);
  return p;
}

char *tu_data_path(const char *name) { return join("FERRY_TEST_DATA", "tests/data", name); }

char *tu_shared_path(const char *name) {
  char *p = join("FERRY_SHARED", "../shared", name);
  if (p && access(p, R_OK) != 0) {
    free(p);
    return NULL;
  }
  return p;
}

int tu_run_ferry(const char *args, char **output) {
  const char *bin = getenv("FERRY_BIN");
  if (!bin) bin = "build/ferry";
  size_t n = strlen(bin) + strlen(args) + 16;
  char *cmd = malloc(n);
  assert_non_null(cmd);
  snprintf(cmd, n, "%s %s 2>&1", bin, args);
  FILE *p = popen(cmd, "r");
  free(cmd);
  if (!p) return -1;
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  assert_non_null(buf);
  size_t got;
  while ((got = fread(buf + len, 1, cap - len - 1, p)) > 0) {
    len += got;
    if (cap - len < 2) {
      cap *= 2;
      buf = realloc(buf, cap);
      assert_non_null(buf);
    }
  }
  buf[len] = '\0';
  int status = pclose(p);
  if (output)
    *output = buf;
  else
    free(buf);
  if (status == -1) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void tu_write_file(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, len, f), len);
  assert_int_equal(fclose(f), 0);
}

int tu_contains(const char *text, const char *needle) { return text && strstr(text, needle) != NULL; }

char *tu_plan_text(ferry_model *m, ferry_store *s, const struct ferry_engine_config *c) {
  char *text = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&text, &len);
  assert_non_null(out);
  const ferry_status st = ferry_engine_plan_only(m, s, c, out);
  fclose(out);
  if (st != FERRY_OK) fail_msg("plan refused: %s", ferry_last_error());
  return text;
}

void tu_check_schema(const cJSON *doc, const char *name) {
  if (system("/usr/bin/python3 -c 'import jsonschema' >/dev/null 2>&1") != 0)
    fail_msg("python3-jsonschema is missing (make deps installs it): cannot check %s", name);
  char *dir = tu_mkdtemp("schema"), path[600], schema[600], cmd[2000];
  snprintf(path, sizeof path, "%s/%s.json", dir, name);
  char *text = cJSON_Print(doc);
  assert_non_null(text);
  tu_write_file(path, text, strlen(text));
  cJSON_free(text);
  const char *src = getenv("FERRY_SOURCE_DIR");
  snprintf(schema, sizeof schema, "%s/docs/schemas/%s.schema.json", src ? src : ".", name);
  snprintf(cmd, sizeof cmd,
           "/usr/bin/python3 -c 'import json,sys,jsonschema; jsonschema.validate(json.load(open(sys.argv[1])), "
           "json.load(open(sys.argv[2])))' '%s' '%s'",
           path, schema);
  const int rc = system(cmd);
  tu_rmtree(dir);
  free(dir);
  if (rc != 0) fail_msg("the %s document does not match %s", name, schema);
}

void tu_on_logits(void *user, int64_t req, int32_t tok, const int32_t *tokens, int32_t n_tokens, const float *l,
                  int64_t vocab) {
  (void)req;
  (void)tok;
  (void)tokens;
  (void)n_tokens;
  struct tu_logit_log *g = user;
  if (g->n + (size_t)vocab > g->cap) {
    g->cap = (g->cap + (size_t)vocab) * 2;
    g->v = realloc(g->v, g->cap * sizeof *g->v);
    assert_non_null(g->v);
  }
  memcpy(g->v + g->n, l, (size_t)vocab * sizeof *l);
  g->n += (size_t)vocab;
}

int tu_run_ferryf(char **output, const char *fmt, ...) {
  char args[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  return tu_run_ferry(args, output);
}

char *tu_gen_model(const char *dir, const char *preset, const char *name, const struct ferry_gen_options *options) {
  ferry_model *m = NULL;
  assert_int_equal(ferry_model_open(&m, preset), FERRY_OK);
  size_t n = strlen(dir) + strlen(name) + 2;
  char *out = malloc(n);
  assert_non_null(out);
  snprintf(out, n, "%s/%s", dir, name);
  assert_int_equal(ferry_model_generate(m, options, out, NULL), FERRY_OK);
  ferry_model_close(m);
  return out;
}

char *tu_gen_tiny(const char *dir, const char *name, const struct ferry_gen_options *options) {
  char rel[128];
  snprintf(rel, sizeof rel, "configs/tiny/%s", name);
  char *preset = tu_data_path(rel);
  char *out = tu_gen_model(dir, preset, name, options);
  free(preset);
  return out;
}

void tu_run_host(const char *model_dir, const struct ferry_engine_config *c, const struct ferry_engine_request *reqs,
                 int64_t n, void (*inspect)(struct ferry_engine *engine, void *user), void *user) {
  ferry_model *m = NULL;
  ferry_store *s = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  assert_int_equal(ferry_model_open(&m, model_dir), FERRY_OK);
  assert_int_equal(ferry_store_open(&s, model_dir), FERRY_OK);
  assert_int_equal(ferry_exec_create_host(&ex, &(struct ferry_exec_config){.device_budget_bytes = c->device_budget_bytes,
                                                                             .compute_threads = 1}),
                   FERRY_OK);
  if (ferry_engine_create(&e, m, s, ex, c) != FERRY_OK) fail_msg("engine_create: %s", ferry_last_error());
  if (ferry_engine_run(e, reqs, n, &(struct ferry_run_options){.as_fast_as_possible = 1}) != FERRY_OK)
    fail_msg("engine_run: %s", ferry_last_error());
  if (inspect) inspect(e, user);
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_store_close(s);
  ferry_model_close(m);
}

uint64_t tu_min_device_budget(const char *model_dir, const struct ferry_engine_config *c) {
  ferry_model *m = NULL;
  ferry_store *st = NULL;
  uint64_t dev = 0, host = 0;
  if (ferry_model_open(&m, model_dir) != FERRY_OK || ferry_store_open(&st, model_dir) != FERRY_OK)
    fail_msg("%s: %s", model_dir, ferry_last_error());
  if (ferry_engine_min_budgets(m, st, c, &dev, &host) != FERRY_OK) fail_msg("min budgets: %s", ferry_last_error());
  ferry_store_close(st);
  ferry_model_close(m);
  return dev;
}

const struct ferry_engine_request *tu_kv_sim_requests(void) {
  static const struct ferry_engine_request reqs[TU_KV_SIM_N] = {
      {.id = 0, .prompt_tokens = 100, .output_tokens = 3},
      {.id = 1, .prompt_tokens = 300, .output_tokens = 6},
      {.id = 2, .prompt_tokens = 40, .output_tokens = 3},
  };
  return reqs;
}

const struct tu_seq_step tu_kv_sim_schedule[TU_KV_SIM_STEPS][2] = {
    {{100, 0}, {300, 0}}, /* A and B prefill */
    {{1, 100}, {1, 300}}, /* both decode */
    {{1, 101}, {1, 301}}, /* A's last token */
    {{1, 302}, {40, 0}},  /* B decodes beside C's prompt */
    {{1, 303}, {1, 40}},  {{1, 304}, {1, 41}}, /* C's last */
};

ferry_status tu_sim_serve(const struct tu_sim_setup *setup, const struct ferry_engine_config *c,
                          const struct ferry_engine_request *req, int64_t n, struct tu_sim_result *r) {
  ferry_hw *hw = NULL;
  ferry_model *m = NULL;
  ferry_exec *ex = NULL;
  ferry_engine *e = NULL;
  if (ferry_hw_open(&hw, setup->hw) != FERRY_OK || (setup->runtime && ferry_hw_set_runtime(hw, setup->runtime) != FERRY_OK) ||
      ferry_model_open(&m, "llama-2-7b") != FERRY_OK || ferry_exec_create_sim(&ex, hw, &setup->exec) != FERRY_OK)
    fail_msg("tu_sim_serve: %s", ferry_last_error());
  if (setup->sink) ferry_exec_set_sink(ex, setup->sink, setup->sink_user);
  ferry_status st = ferry_engine_create(&e, m, NULL, ex, c);
  if (st == FERRY_OK) {
    assert_int_equal(ferry_exec_sim_stats(ex, &r->loaded), FERRY_OK);
    st = ferry_engine_run(e, req, n, &(struct ferry_run_options){.as_fast_as_possible = 1});
  }
  if (st == FERRY_OK) {
    ferry_engine_summary(e, &r->sum);
    const struct ferry_step_metrics *sm = ferry_engine_step_metrics(e, &r->steps);
    assert_true(r->steps <= TU_SIM_MAX_STEPS);
    memcpy(r->sm, sm, (size_t)r->steps * sizeof *sm);
    assert_int_equal(ferry_exec_sim_stats(ex, &r->stats), FERRY_OK);
  }
  ferry_engine_destroy(e);
  ferry_exec_destroy(ex);
  ferry_model_close(m);
  ferry_hw_close(hw);
  return st;
}
