/* common/: status table, size parsing, half conversions, RNG determinism, allocation hook. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/checked.h"
#include "common/error.h"
#include "common/half.h"
#include "common/json.h"
#include "common/rng.h"
#include "common/sha256.h"
#include "common/units.h"
#include "ferry/dtype.h"
#include "testutil.h"

static void test_status_names(void **state) {
  (void)state;
  assert_string_equal(ferry_status_name(FERRY_OK), "FERRY_OK");
  assert_string_equal(ferry_status_name(FERRY_ERR_FORMAT), "FERRY_ERR_FORMAT");
  assert_string_equal(ferry_strerror(FERRY_ERR_BUDGET), "memory budget exceeded");
  assert_string_equal(ferry_strerror((ferry_status)-999), "unknown status");
  struct ferry_err e;
  ferry__err_clear(&e);
  assert_int_equal(ferry__err_set(&e, FERRY_ERR_IO, "%s: offset %d", "f.bin", 42), FERRY_ERR_IO);
  assert_string_equal(e.msg, "f.bin: offset 42");
  assert_string_equal(ferry_last_error(), "f.bin: offset 42");
}

static void test_parse_size(void **state) {
  (void)state;
  uint64_t v;
  assert_int_equal(ferry__parse_size("4096", &v), FERRY_OK);
  assert_int_equal(v, 4096);
  assert_int_equal(ferry__parse_size("512M", &v), FERRY_OK);
  assert_int_equal(v, 512ull << 20);
  assert_int_equal(ferry__parse_size("2GiB", &v), FERRY_OK);
  assert_int_equal(v, 2ull << 30);
  assert_int_equal(ferry__parse_size("1.5G", &v), FERRY_OK);
  assert_int_equal(v, 3ull << 29);
  assert_int_equal(ferry__parse_size("3GB", &v), FERRY_OK);
  assert_int_equal(v, 3000000000ull);
  assert_int_equal(ferry__parse_size("12X", &v), FERRY_ERR_INVALID);
  assert_int_equal(ferry__parse_size("-1", &v), FERRY_ERR_INVALID);
  assert_int_equal(ferry__parse_size("", &v), FERRY_ERR_INVALID);
  assert_int_equal(ferry__parse_size("99999999T", &v), FERRY_ERR_RANGE);
  /* under one byte is an error, never 0 = "unlimited" */
  assert_int_equal(ferry__parse_size("1.5", &v), FERRY_OK);
  assert_int_equal(v, 1);
  const char *tiny[] = {"0", "0.5", "0K", "0.0001K", "0GiB", "1e-300G"};
  for (size_t i = 0; i < sizeof tiny / sizeof tiny[0]; i++) {
    v = 12345;
    assert_int_equal(ferry__parse_size(tiny[i], &v), FERRY_ERR_INVALID);
    assert_true(strstr(ferry_last_error(), "less than one byte") != NULL);
    assert_int_equal(v, 12345);
  }
}

/* User seconds become int64 ns through one helper: past the clock is an error, not a
 * wrapped negative time (1e300 s used to become a negative window start). */
static void test_seconds_to_ns(void **state) {
  (void)state;
  int64_t ns = -1, a = -1, b = -1;
  assert_int_equal(ferry__seconds_to_ns(1.5, &ns), FERRY_OK);
  assert_int_equal(ns, 1500000000);
  assert_int_equal(ferry__seconds_to_ns(9223372036.0, &ns), FERRY_OK);
  assert_true(ns > 0);
  const double bad[] = {1e300, 9223372037.0, -1.0, INFINITY, NAN};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ns = 7;
    assert_int_equal(ferry__seconds_to_ns(bad[i], &ns), FERRY_ERR_RANGE);
    assert_int_equal(ns, 7);
  }
  assert_int_equal(ferry__parse_seconds_ns("1e300", &ns), FERRY_ERR_RANGE);
  assert_true(strstr(ferry_last_error(), "'1e300' s is outside") != NULL);
  assert_int_equal(ferry__parse_seconds_ns("1e999", &ns), FERRY_ERR_RANGE);
  assert_int_equal(ferry__parse_seconds_ns("12s", &ns), FERRY_ERR_INVALID);
  assert_int_equal(ferry__parse_window_ns("10:30.5", &a, &b), FERRY_OK);
  assert_int_equal(a, 10000000000LL);
  assert_int_equal(b, 30500000000LL);
  assert_int_equal(ferry__parse_window_ns("600:", &a, &b), FERRY_OK);
  assert_int_equal(a, 600000000000LL);
  assert_int_equal(b, 0);
  assert_int_equal(ferry__parse_window_ns(":60", &a, &b), FERRY_OK);
  assert_int_equal(a, 0);
  assert_int_equal(b, 60000000000LL);
  a = b = 5;
  assert_int_equal(ferry__parse_window_ns("1e300:", &a, &b), FERRY_ERR_RANGE);
  assert_int_equal(a, 5);
  assert_int_equal(ferry__parse_window_ns("0:1e300", &a, &b), FERRY_ERR_RANGE);
  assert_int_equal(ferry__parse_window_ns("5:2", &a, &b), FERRY_ERR_INVALID);
  assert_int_equal(ferry__parse_window_ns(":", &a, &b), FERRY_ERR_INVALID);
  assert_int_equal(ferry__parse_window_ns("5", &a, &b), FERRY_ERR_INVALID);
  assert_int_equal(ferry__parse_window_ns("1:2:3", &a, &b), FERRY_ERR_INVALID);
  assert_int_equal(a, 5);
  assert_int_equal(ferry__scale_ns(1000, 2.5, &ns), FERRY_OK);
  assert_int_equal(ns, 2500);
  assert_int_equal(ferry__scale_ns(1000000000000LL, 1e9, &ns), FERRY_ERR_RANGE);
}

static void test_half_roundtrip(void **state) {
  (void)state;
  /* Every finite half converts to float and back exactly. */
  for (uint32_t h = 0; h < 0x10000; h++) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue; /* NaN payloads */
    float f = ferry__f16_to_f32((uint16_t)h);
    assert_int_equal(ferry__f32_to_f16(f), h);
  }
  assert_true(ferry__f16_to_f32(ferry__f32_to_f16(1.0f)) == 1.0f);
  assert_int_equal(ferry__f32_to_f16(65520.0f), 0x7c00); /* rounds to inf */
  assert_int_equal(ferry__f32_to_f16(1.0f + 1.0f / 2048), 0x3c00); /* tie to even */
  assert_int_equal(ferry__f32_to_bf16(1.0f), 0x3f80);
  assert_true(ferry__bf16_to_f32(0x3f80) == 1.0f);
}

static void test_rng_deterministic(void **state) {
  (void)state;
  struct ferry_rng a, b;
  ferry__rng_seed(&a, 42);
  ferry__rng_seed(&b, 42);
  for (int i = 0; i < 1000; i++) assert_int_equal(ferry__rng_u64(&a), ferry__rng_u64(&b));
  ferry__rng_seed(&a, 1);
  double sum = 0, sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; i++) {
    double x = ferry__rng_normal(&a);
    sum += x;
    sq += x * x;
  }
  assert_true(fabs(sum / n) < 0.01);
  assert_true(fabs(sq / n - 1.0) < 0.02);
  double g = 0;
  for (int i = 0; i < n; i++) g += ferry__rng_gamma(&a, 0.5, 2.0);
  assert_true(fabs(g / n - 1.0) < 0.02); /* mean = shape * scale */
  for (int i = 0; i < 1000; i++) assert_true(ferry__rng_below(&a, 7) < 7);
}

static void test_alloc_fault_injection(void **state) {
  (void)state;
  ferry_alloc_fail_after(2);
  void *a = ferry_malloc(8), *b = ferry_malloc(8), *c = ferry_malloc(8), *d = ferry_malloc(8);
  assert_non_null(a);
  assert_non_null(b);
  assert_null(c);
  assert_non_null(d);
  ferry_free(a);
  ferry_free(b);
  ferry_free(d);
  ferry_free(NULL);
}

static void test_json_strict(void **state) {
  (void)state;
  cJSON *j = NULL;
  const char *ok = "{\"a\": 3, \"b\": 2.5, \"c\": \"x\"}  \n";
  assert_int_equal(ferry__json_parse(ok, strlen(ok), "t.json", &j, NULL), FERRY_OK);
  int64_t i;
  double d;
  assert_int_equal(ferry__json_i64(j, "a", 0, &i, "t.json", NULL), FERRY_OK);
  assert_int_equal(i, 3);
  assert_int_equal(ferry__json_i64(j, "b", 0, &i, "t.json", NULL), FERRY_ERR_FORMAT);
  assert_true(tu_contains(ferry_last_error(), "\"b\""));
  assert_int_equal(ferry__json_f64(j, "b", 0, &d, "t.json", NULL), FERRY_OK);
  assert_int_equal(ferry__json_i64(j, "zz", 1, &i, "t.json", NULL), FERRY_ERR_NOT_FOUND);
  assert_int_equal(ferry__json_i64(j, "zz", 0, &i, "t.json", NULL), FERRY_ERR_FORMAT);
  cJSON_Delete(j);
  const char *trailing = "{\"a\":1} x";
  assert_int_equal(ferry__json_parse(trailing, strlen(trailing), "t.json", &j, NULL), FERRY_ERR_FORMAT);
  assert_true(tu_contains(ferry_last_error(), "byte 8"));
}

/* Numbers written by ferry__json_add_number() read back to the same double, where cJSON's own
 * printer keeps 15 digits of some values and loses their last bits; short ones stay short. */
static void test_json_exact_numbers(void **state) {
  (void)state;
  ferry__json_init();
  const double values[] = {9.2222222222222227e+59, 0.1 + 0.2, 13.840532, 1.0 / 3.0, 24.006, 5e-324, -0.0,
                           1.7976931348623157e308, 9007199254740993.0, 123456789012345678.0};
  int cjson_lossy = 0;
  for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
    cJSON *o = cJSON_CreateObject();
    assert_non_null(o);
    assert_non_null(ferry__json_add_number(o, "v", values[i]));
    assert_non_null(cJSON_AddNumberToObject(o, "plain", values[i]));
    char *text = cJSON_PrintUnformatted(o);
    assert_non_null(text);
    cJSON *back = NULL;
    struct ferry_err err;
    assert_int_equal(ferry__json_parse(text, strlen(text), "test", &back, &err), FERRY_OK);
    const double v = cJSON_GetObjectItemCaseSensitive(back, "v")->valuedouble;
    if (memcmp(&v, &values[i], sizeof v)) fail_msg("%.17g wrote as %s", values[i], text);
    cjson_lossy += cJSON_GetObjectItemCaseSensitive(back, "plain")->valuedouble != values[i];
    cJSON_Delete(back);
    cJSON_free(text);
    cJSON_Delete(o);
  }
  assert_true(cjson_lossy > 0); /* what the helper is for: cJSON alone loses some of them */
  cJSON *o = cJSON_CreateObject();
  assert_non_null(ferry__json_add_number(o, "v", 24.006));
  char *text = cJSON_PrintUnformatted(o);
  assert_string_equal(text, "{\"v\":24.006}");
  cJSON_free(text);
  assert_non_null(ferry__json_add_number(o, "nan", NAN));
  text = cJSON_PrintUnformatted(o);
  assert_string_equal(text, "{\"v\":24.006,\"nan\":null}");
  cJSON_free(text);
  cJSON_Delete(o);
}

static void test_dtype_names(void **state) {
  (void)state;
  enum ferry_dtype d;
  assert_int_equal(ferry_dtype_parse("BF16", &d), FERRY_OK);
  assert_int_equal(d, FERRY_DTYPE_BF16);
  assert_int_equal(ferry_dtype_parse("bfloat16", &d), FERRY_OK);
  assert_int_equal(d, FERRY_DTYPE_BF16);
  assert_int_equal(ferry_dtype_parse("fp16", &d), FERRY_OK);
  assert_int_equal(d, FERRY_DTYPE_F16);
  assert_int_equal(ferry_dtype_parse("F17", &d), FERRY_ERR_INVALID);
  assert_int_equal(ferry_dtype_size(FERRY_DTYPE_F64), 8);
  assert_string_equal(ferry_dtype_st_name(FERRY_DTYPE_I8), "I8");
}

/* Arithmetic on untrusted numbers saturates instead of overflowing (UBSan would stop here). */
static void test_checked_arithmetic(void **state) {
  (void)state;
  assert_true(ferry__sat_add_i64(INT64_MAX, 1) == INT64_MAX);
  assert_true(ferry__sat_add_i64(INT64_MIN, -1) == INT64_MIN);
  assert_true(ferry__sat_add_i64(40, 2) == 42);
  assert_true(ferry__sat_sub_i64(INT64_MAX, INT64_MIN) == INT64_MAX);
  assert_true(ferry__sat_sub_i64(INT64_MIN, INT64_MAX) == INT64_MIN);
  assert_true(ferry__sat_sub_i64(5, 7) == -2);
  assert_true(ferry__span(INT64_MIN, INT64_MAX) > 1.8e19);
  assert_true(ferry__span(10, 4) == -6.0);
  assert_true(ferry__f64_to_i64(1e300) == INT64_MAX);
  assert_true(ferry__f64_to_i64(-1e300) == INT64_MIN);
  assert_true(ferry__f64_to_i64(NAN) == 0);
  assert_true(ferry__f64_to_i64(-3.9) == -3);
  assert_true(ferry__f64_to_u64(-1) == 0);
  assert_true(ferry__f64_to_u64(1e30) == UINT64_MAX);
  assert_true(ferry__f64_to_u64(7.5) == 7);
  assert_true(ferry__f64_to_index(1e30, 4000) == 4000);
  assert_true(ferry__f64_to_index(-1, 4000) == 0);
  assert_true(ferry__finite_or(INFINITY, 3) == 3);
  assert_true(ferry__finite_or(2, 3) == 2);
}

/* FIPS 180-4 test vectors (and its one-million-'a' message fed in uneven pieces). */
static void test_sha256(void **state) {
  (void)state;
  static const struct {
    const char *msg, *hex;
  } v[] = {{"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
           {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
           {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"}};
  char hex[65];
  struct ferry__sha256 s;
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
    ferry__sha256_init(&s);
    ferry__sha256_update(&s, v[i].msg, strlen(v[i].msg));
    ferry__sha256_hex(&s, hex);
    assert_string_equal(hex, v[i].hex);
  }
  char a[997];
  memset(a, 'a', sizeof a);
  ferry__sha256_init(&s);
  for (size_t left = 1000000; left;) {
    size_t n = left < sizeof a ? left : sizeof a;
    ferry__sha256_update(&s, a, n);
    left -= n;
  }
  ferry__sha256_hex(&s, hex);
  assert_string_equal(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_status_names),      cmocka_unit_test(test_parse_size), cmocka_unit_test(test_seconds_to_ns),
      cmocka_unit_test(test_half_roundtrip),    cmocka_unit_test(test_rng_deterministic),
      cmocka_unit_test(test_alloc_fault_injection), cmocka_unit_test(test_json_strict),
      cmocka_unit_test(test_json_exact_numbers),
      cmocka_unit_test(test_dtype_names),       cmocka_unit_test(test_checked_arithmetic),
      cmocka_unit_test(test_sha256),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
