/* The canonical configuration of a run: every option of the table (run_options.h) that changes
 * what a run measures, as a JSON object with sorted keys, and its hash. `ferry run`/`ferry sim`
 * store both in the result database; `ferry sweep` computes the same hash to skip runs that are
 * already complete, so the bytes written here are a compatibility promise: options with
 * CFG_GIVEN appear only when they differ from their default, and the hashes of configurations
 * written before they existed stay the same. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/run_common.h"
#include "common/alloc.h"
#include "common/json.h"

static int emit(enum run_cfg cfg, int differs) { return cfg == CFG_ALWAYS || (cfg == CFG_GIVEN && differs); }

/* One writer per value type: add `key` to o when the option's cfg says so. */
static void json_FLAG(cJSON *o, const char *key, enum run_cfg cfg, int v, int def) {
  if (emit(cfg, v != def)) cJSON_AddBoolToObject(o, key, v);
}
static void json_FLAG01(cJSON *o, const char *key, enum run_cfg cfg, int v, int def) {
  if (emit(cfg, v != def)) cJSON_AddNumberToObject(o, key, v);
}
static void json_INT(cJSON *o, const char *key, enum run_cfg cfg, int64_t v, int64_t def) {
  if (emit(cfg, v != def)) cJSON_AddNumberToObject(o, key, (double)v);
}
static void json_SIZE(cJSON *o, const char *key, enum run_cfg cfg, uint64_t v, uint64_t def) {
  if (emit(cfg, v != def)) cJSON_AddNumberToObject(o, key, (double)v);
}
static void json_REAL(cJSON *o, const char *key, enum run_cfg cfg, double v, double def) {
  if (emit(cfg, v != def)) cJSON_AddNumberToObject(o, key, v);
}
static void json_TEXT(cJSON *o, const char *key, enum run_cfg cfg, const char *v, const char *def) {
  /* an absent text (no --hw, no --predictor) is left out either way */
  if (v && emit(cfg, !def || strcmp(v, def))) cJSON_AddStringToObject(o, key, v);
}

static void add_option(cJSON *o, const struct run_args *a, enum run_opt id) {
  switch (id) {
#define JSON_(field, name, type, metavar, modes, section, cfg, key, def, ...) \
  case RUN_OPT_##field:                                                      \
    if (cfg != CFG_NO) json_##type(o, key, cfg, a->field, def);              \
    break;
    FERRY_RUN_OPTIONS(JSON_)
#undef JSON_
    case RUN_OPT_COUNT: break;
  }
}

/* Keys are sorted (cJSON keeps insertion order), with one exception kept for the hashes of
 * every configuration written so far: fill_budget was added right after pin_last. */
static const char *order_key(const char *key) { return strcmp(key, "fill_budget") ? key : "pin_last~"; }

static int cmp_rows(const void *x, const void *y) {
  const enum run_opt a = *(const enum run_opt *)x, b = *(const enum run_opt *)y;
  return strcmp(order_key(run_option(a)->key), order_key(run_option(b)->key));
}

char *run_config_json(const struct run_args *a) {
  ferry__json_init();
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  enum run_opt order[RUN_OPT_COUNT];
  for (int i = 0; i < RUN_OPT_COUNT; i++) order[i] = (enum run_opt)i;
  qsort(order, RUN_OPT_COUNT, sizeof order[0], cmp_rows);
  for (int i = 0; i < RUN_OPT_COUNT; i++) add_option(o, a, order[i]);
  char *text = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  return text;
}

void run_config_hash(const char *config_json, char out[17]) {
  uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a 64 */
  for (const unsigned char *p = (const unsigned char *)config_json; *p; p++) {
    h ^= *p;
    h *= 0x100000001b3ULL;
  }
  snprintf(out, 17, "%016llx", (unsigned long long)h);
}
