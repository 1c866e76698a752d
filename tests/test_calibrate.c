/* The cost fit of `ferry calibrate`: exact recovery of both model forms from noiseless data,
 * the total-time scaling on noisy data (the simulated sum of durations equals the measured
 * one), and the degenerate cases; a failed probe releases what it took. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/calibrate.h"
#include "ferry/hw.h"
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_recovers_sum_form),
      cmocka_unit_test(test_recovers_roofline_form),
      cmocka_unit_test(test_noisy_total_preserved),
      cmocka_unit_test(test_degenerate),
      cmocka_unit_test(test_failed_probe),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
