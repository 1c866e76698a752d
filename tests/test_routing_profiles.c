/* Every routing profile against the published statistics it is calibrated to: the targets of
 * tests/data/routing/targets.json (value within its relative tolerance, or inside the band of a
 * figure read by eye), each measured by ferry_routing_stats_compute on the profile's routing at
 * the model's shape; and a gate-weight spread far from degenerate. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "ferry/routing.h"
#include "testutil.h"

static cJSON *targets;

/* Measured routing per (profile, extra spec), so each is generated once. */
static struct cached {
  char key[96];
  ferry_routing *trace;
  struct ferry_routing_stats stats;
} cache[8];

static int setup(void **state) {
  (void)state;
  char *p = tu_data_path("routing/targets.json");
  struct ferry_err err = {0};
  ferry_status st = ferry__json_load(p, 1 << 20, &targets, &err);
  if (st != FERRY_OK) fprintf(stderr, "%s\n", err.msg);
  free(p);
  return st == FERRY_OK ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof cache / sizeof *cache; i++) {
    ferry_routing_stats_free(&cache[i].stats);
    ferry_routing_free(cache[i].trace);
  }
  cJSON_Delete(targets);
  return 0;
}

/* The statistics of a profile's routing, with an optional spec applied after the profile. */
static void generate(const char *profile, const char *extra, ferry_routing **trace, struct ferry_routing_stats *s) {
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(targets, "profiles"), profile);
  assert_non_null(p);
  struct ferry_routing_synth_config c = {.seed = 7};
  assert_int_equal(ferry_routing_profile_apply(profile, &c), FERRY_OK);
  c.n_layers = cJSON_GetObjectItemCaseSensitive(p, "layers")->valueint;
  c.n_experts = cJSON_GetObjectItemCaseSensitive(p, "experts")->valueint;
  c.top_k = cJSON_GetObjectItemCaseSensitive(p, "top_k")->valueint;
  int32_t L, E, K;
  assert_int_equal(ferry_routing_profile_shape(profile, &L, &E, &K), FERRY_OK);
  assert_true(L == c.n_layers && E == c.n_experts && K == c.top_k); /* the file and the code agree */
  if (extra) assert_int_equal(ferry_routing_synth_parse(extra, &c), FERRY_OK);
  ferry_routing_synth *sy = NULL;
  assert_int_equal(ferry_routing_synth_create(&sy, &c), FERRY_OK);
  assert_int_equal(ferry_routing_synth_trace(sy, cJSON_GetObjectItemCaseSensitive(p, "requests")->valueint,
                                             cJSON_GetObjectItemCaseSensitive(p, "tokens")->valueint, trace),
                   FERRY_OK);
  ferry_routing_synth_free(sy);
  assert_int_equal(ferry_routing_stats_compute(*trace, s), FERRY_OK);
}

/* The cached measurement of (profile, extra); borrowed. */
static const struct cached *measure(const char *profile, const char *extra) {
  char key[96];
  snprintf(key, sizeof key, "%s/%s", profile, extra ? extra : "");
  size_t i = 0;
  for (; i < sizeof cache / sizeof *cache && cache[i].trace; i++)
    if (!strcmp(cache[i].key, key)) return &cache[i];
  assert_true(i < sizeof cache / sizeof *cache);
  snprintf(cache[i].key, sizeof cache[i].key, "%s", key);
  generate(profile, extra, &cache[i].trace, &cache[i].stats);
  return &cache[i];
}

/* One statistic of a layer (or the mean over layers: layer < 0). */
static double statistic(const ferry_routing *r, const struct ferry_routing_stats *s, const char *name, int layer) {
  const double E = ferry_routing_n_experts(r), K = ferry_routing_top_k(r);
  double sum = 0;
  int n = 0;
  for (int l = layer < 0 ? 0 : layer; l < (layer < 0 ? s->n_layers : layer + 1); l++) {
    const struct ferry_routing_layer_stats *ls = &s->layers[l];
    double v = NAN;
    if (!strcmp(name, "first_repeat")) v = ls->first_repeat;
    else if (!strcmp(name, "any_repeat")) v = ls->any_repeat;
    else if (!strcmp(name, "busiest_share")) v = ls->busiest_share;
    else if (!strcmp(name, "busiest_rel_load")) v = ls->busiest_share * E;
    else if (!strcmp(name, "entropy_norm")) v = ls->entropy_norm;
    else if (!strcmp(name, "coact_max")) v = ls->coact_max;
    else if (!strcmp(name, "request_spec_max")) v = ls->request_spec_max;
    else if (!strcmp(name, "request_rel_load_max")) v = ls->request_spec_max * E / K;
    else fail_msg("targets.json names an unknown statistic '%s'", name);
    if (isnan(v)) continue;
    sum += v;
    n++;
  }
  return n ? sum / n : NAN;
}

static void test_targets(void **state) {
  (void)state;
  const cJSON *list = cJSON_GetObjectItemCaseSensitive(targets, "targets");
  assert_true(cJSON_GetArraySize(list) >= 10);
  int checked = 0, failed = 0;
  const cJSON *t;
  cJSON_ArrayForEach(t, list) {
    const char *profile = cJSON_GetObjectItemCaseSensitive(t, "profile")->valuestring;
    const char *name = cJSON_GetObjectItemCaseSensitive(t, "statistic")->valuestring;
    const cJSON *lj = cJSON_GetObjectItemCaseSensitive(t, "layer"), *synth = cJSON_GetObjectItemCaseSensitive(t, "synth");
    const cJSON *value = cJSON_GetObjectItemCaseSensitive(t, "value"), *tol = cJSON_GetObjectItemCaseSensitive(t, "tolerance");
    const cJSON *lo = cJSON_GetObjectItemCaseSensitive(t, "min"), *hi = cJSON_GetObjectItemCaseSensitive(t, "max");
    assert_non_null(cJSON_GetObjectItemCaseSensitive(t, "source"));
    assert_non_null(cJSON_GetObjectItemCaseSensitive(t, "where"));
    const struct cached *m = measure(profile, cJSON_IsString(synth) ? synth->valuestring : NULL);
    const int layer = cJSON_IsNumber(lj) ? lj->valueint : -1;
    const double got = statistic(m->trace, &m->stats, name, layer);
    int ok;
    char want[64];
    if (cJSON_IsNumber(value)) {
      ok = fabs(got - value->valuedouble) <= tol->valuedouble * value->valuedouble;
      snprintf(want, sizeof want, "%.4f +-%.0f%%", value->valuedouble, 100 * tol->valuedouble);
    } else {
      ok = got >= lo->valuedouble && got <= hi->valuedouble;
      snprintf(want, sizeof want, "[%.4g, %.4g]", lo->valuedouble, hi->valuedouble);
    }
    char where[16] = "mean";
    if (layer >= 0) snprintf(where, sizeof where, "%d", layer);
    fprintf(stderr, "%-9s %-21s layer %-4s %-18s measured %.4f %s\n", profile, name, where, want, got,
            ok ? "ok" : "OUT OF RANGE");
    failed += !ok;
    checked++;
  }
  assert_int_equal(failed, 0);
  assert_true(checked >= 10);
}

/* Every profile is named in the file, and its gate weights are spread as a trained router's
 * are, not degenerate: the top-1 share stays well below 0.998 and above equal weights. */
static void test_profiles_listed_and_gates(void **state) {
  (void)state;
  const cJSON *profiles = cJSON_GetObjectItemCaseSensitive(targets, "profiles");
  size_t n = 0;
  for (const char *name; (name = ferry_routing_profile_name(n)); n++) {
    assert_non_null(cJSON_GetObjectItemCaseSensitive(profiles, name));
    if (!strcmp(name, "uniform")) continue;
    const struct cached *m = measure(name, NULL);
    const double k = ferry_routing_top_k(m->trace);
    assert_true(m->stats.gate_top1_mean < 0.9);
    assert_true(m->stats.gate_top1_mean > 1.0 / k + 0.05);
    assert_true(m->stats.layers[0].gate_top1_p90 - m->stats.layers[0].gate_top1_p10 > 0.1);
  }
  assert_int_equal(n, 4);
  struct ferry_routing_synth_config c = {0};
  assert_int_equal(ferry_routing_profile_apply("switch", &c), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "mixtral, olmoe, deepseek or uniform"));
  assert_int_equal(ferry_routing_synth_parse("profile=olmoe,coact=0.1", &c), FERRY_OK);
  assert_string_equal(c.profile, "olmoe");
  assert_true(c.coact == 0.1 && c.domains == 8);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_targets), cmocka_unit_test(test_profiles_listed_and_gates)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
