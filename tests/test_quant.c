/* runtime/quant: format names and layouts, exact N-bit packing, quantize/dequantize error
 * bounds on normal and outlier-heavy tensors, NF4 table and double quantization, row-range
 * dequantization, mixed plans and the quality metrics. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/half.h"
#include "common/rng.h"
#include "ferry/gen.h"
#include "ferry/model.h"
#include "ferry/quant.h"
#include "ferry/quantize.h"
#include "runtime/quant/quant_impl.h"
#include "testutil.h"

static struct ferry_qspec spec_of(const char *name) {
  struct ferry_qspec s;
  assert_int_equal(ferry_quant_spec_parse(name, &s), FERRY_OK);
  return s;
}

static float *normal_matrix(int64_t n, uint64_t seed) {
  struct ferry_rng r;
  ferry__rng_seed(&r, seed);
  float *x = ferry_malloc((size_t)n * sizeof *x);
  assert_non_null(x);
  for (int64_t i = 0; i < n; i++) x[i] = (float)ferry__rng_normal(&r);
  return x;
}

/* A packed matrix in one blob, with its layout and views. */
struct packed {
  struct ferry_qlayout layout;
  void *blob;
  struct ferry_qview view;
};

static void pack(struct packed *p, const char *fmt, const float *src, int64_t rows, int64_t cols) {
  struct ferry_qspec s = spec_of(fmt);
  assert_int_equal(ferry_quant_layout(&s, rows, cols, &p->layout), FERRY_OK);
  p->blob = ferry_malloc(p->layout.blob_bytes);
  assert_non_null(p->blob);
  memset(p->blob, 0xa5, p->layout.blob_bytes); /* padding must be overwritten */
  struct ferry_qout out;
  ferry_quant_out_blob(&p->layout, p->blob, &out);
  assert_int_equal(ferry_quant_quantize(&s, src, rows, cols, &out), FERRY_OK);
  ferry_quant_view_blob(&p->layout, p->blob, &p->view);
}

static float *unpack_all(const struct packed *p) {
  size_t n = (size_t)(p->layout.rows * p->layout.cols);
  float *d = ferry_malloc(n * sizeof *d);
  assert_non_null(d);
  assert_int_equal(ferry_quant_dequantize_rows(&p->layout.spec, &p->view, p->layout.rows,
                                               p->layout.cols, 0, p->layout.rows, d),
                   FERRY_OK);
  return d;
}

static double roundtrip_error(const char *fmt, const float *src, int64_t rows, int64_t cols) {
  struct packed p;
  pack(&p, fmt, src, rows, cols);
  float *d = unpack_all(&p);
  double e = ferry_quant_error(src, d, (size_t)(rows * cols));
  ferry_free(d);
  ferry_free(p.blob);
  return e;
}

static void test_spec_names(void **state) {
  (void)state;
  const char *names[] = {"fp32", "fp16", "bf16", "int8", "int4-g32", "int4-g64", "int4-g128",
                         "nf4", "int3-g64", "int2-g64", "nf4-g128", "int2-g8"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    struct ferry_qspec s = spec_of(names[i]);
    char buf[FERRY_QSPEC_NAME_MAX];
    assert_string_equal(ferry_quant_spec_name(&s, buf, sizeof buf), names[i]);
    assert_int_equal(ferry_quant_spec_check(&s), FERRY_OK);
  }
  struct ferry_qspec s = spec_of("INT4-G64");
  assert_int_equal(s.format, FERRY_QFORMAT_INT4);
  assert_int_equal(s.group_size, 64);
  assert_int_equal(spec_of("nf4").group_size, FERRY_QUANT_NF4_BLOCK);
  const char *bad[] = {"int5-g64", "int4", "int4-g60", "int4-g0", "int4-g8192", "fp16-g64",
                       "int4-gx", "int4-g64x", "", "int3-", "nf4-64"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(ferry_quant_spec_parse(bad[i], &s), FERRY_ERR_INVALID);
    assert_true(strlen(ferry_last_error()) > 0);
  }
  assert_int_equal(ferry_quant_spec_parse("int5-g64", &s), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "unknown format 'int5-g64'"));
  assert_int_equal(ferry_quant_spec_parse("int4", &s), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "group size"));
  struct ferry_qspec wrong = {.format = FERRY_QFORMAT_INT8, .group_size = 64};
  assert_int_equal(ferry_quant_spec_check(&wrong), FERRY_ERR_INVALID);
  wrong = (struct ferry_qspec){.format = FERRY_QFORMAT_COUNT};
  assert_int_equal(ferry_quant_spec_check(&wrong), FERRY_ERR_INVALID);
}

static void expect_bytes(const char *fmt, int64_t rows, int64_t cols, uint64_t data, uint64_t scale) {
  struct ferry_qspec s = spec_of(fmt);
  uint64_t d = 0, sc = 0;
  assert_int_equal(ferry_quant_packed_bytes(&s, rows, cols, &d, &sc), data + scale);
  assert_int_equal(d, data);
  assert_int_equal(sc, scale);
}

static void test_packed_bytes(void **state) {
  (void)state;
  /* [3, 100]: groups of 64 give 2 per row (the second partial). */
  expect_bytes("fp32", 3, 100, 1200, 0);
  expect_bytes("fp16", 3, 100, 600, 0);
  expect_bytes("bf16", 3, 100, 600, 0);
  expect_bytes("int8", 3, 100, 300, 12);               /* + fp32 scale per row */
  expect_bytes("int4-g64", 3, 100, 3 * 50, 3 * 2 * 3); /* fp16 scale + u8 zero per group */
  expect_bytes("int3-g64", 3, 100, 3 * 38, 18);        /* ceil(300 bits / 8) per row */
  expect_bytes("int2-g64", 3, 100, 3 * 25, 18);
  expect_bytes("int4-g32", 3, 100, 150, 3 * 4 * 3);
  expect_bytes("nf4", 3, 100, 150, 6 + 4 + 4);         /* u8 absmax code, one level-2 block */
  expect_bytes("int3-g64", 1, 7, 3, 3);                /* 21 bits -> 3 bytes */
  /* [4096, 4096]: 4096*4096*... exactly, and int4-g128 costs 4 + 24/128 bits per weight. */
  expect_bytes("int4-g128", 4096, 4096, 4096ull * 2048, 4096ull * 32 * 3);
  /* nf4: 262144 blocks -> 1024 level-2 blocks of two fp32. */
  expect_bytes("nf4", 4096, 4096, 4096ull * 2048, 262144 + 1024 * 8);
  struct ferry_qspec s = spec_of("nf4");
  struct ferry_qlayout l;
  assert_int_equal(ferry_quant_layout(&s, 5, 130, &l), FERRY_OK);
  assert_string_equal(l.part[FERRY_QPART_DATA].suffix, "qweight");
  assert_int_equal(l.part[FERRY_QPART_DATA].dtype, FERRY_DTYPE_U8);
  assert_int_equal(l.part[FERRY_QPART_DATA].shape[1], 65);
  assert_string_equal(l.part[FERRY_QPART_SCALES].suffix, "absmax");
  assert_int_equal(l.part[FERRY_QPART_SCALES].dtype, FERRY_DTYPE_U8);
  assert_int_equal(l.part[FERRY_QPART_SCALES].shape[1], 3);
  assert_null(l.part[FERRY_QPART_ZEROS].suffix);
  assert_int_equal(l.part[FERRY_QPART_ZEROS].bytes, 0);
  uint64_t end = 0;
  for (int i = 0; i < FERRY_QPART_COUNT; i++) {
    if (!l.part[i].suffix) continue;
    assert_int_equal(l.part[i].offset % 64, 0);
    assert_true(l.part[i].offset >= end);
    end = l.part[i].offset + l.part[i].bytes;
  }
  assert_true(l.blob_bytes >= end);
  assert_int_equal(ferry_quant_layout(&s, 0, 10, &l), FERRY_ERR_INVALID);
  assert_int_equal(ferry_quant_layout(&s, 10, -1, &l), FERRY_ERR_INVALID);
  s = spec_of("fp32");
  assert_int_equal(ferry_quant_layout(&s, INT64_C(1) << 40, INT64_C(1) << 40, &l), FERRY_ERR_RANGE);
  assert_int_equal(ferry_quant_packed_bytes(&s, 0, 1, NULL, NULL), 0);
}

static void test_pack_bits(void **state) {
  (void)state;
  struct ferry_rng r;
  ferry__rng_seed(&r, 7);
  const int64_t lens[] = {1, 3, 7, 13, 63, 65, 101};
  uint8_t codes[101], back[101], packed[128];
  for (int bits = 1; bits <= 8; bits++) {
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
      int64_t n = lens[li];
      for (int64_t j = 0; j < n; j++) codes[j] = (uint8_t)ferry__rng_below(&r, 1u << bits);
      memset(packed, 0xff, sizeof packed);
      ferry__quant_pack_row(bits, codes, n, packed);
      size_t nbytes = (size_t)((n * bits + 7) / 8);
      assert_int_equal(packed[nbytes], 0xff); /* nothing written past the row */
      int pad = (int)(nbytes * 8 - (size_t)(n * bits));
      if (pad) assert_int_equal(packed[nbytes - 1] >> (8 - pad), 0); /* padding bits zero */
      ferry__quant_unpack_row(bits, packed, n, back);
      assert_memory_equal(codes, back, (size_t)n);
      /* Little-endian bit order: code 0 sits in the low bits of byte 0. */
      assert_int_equal(packed[0] & ((1u << bits) - 1u), codes[0]);
    }
  }
  /* One hand-checked 3-bit row: codes 1..8 (8 -> 0) = 0b000_111_110_101_100_011_010_001. */
  const uint8_t c3[8] = {1, 2, 3, 4, 5, 6, 7, 0};
  ferry__quant_pack_row(3, c3, 8, packed);
  assert_int_equal(packed[0], 0xd1);
  assert_int_equal(packed[1], 0x58);
  assert_int_equal(packed[2], 0x1f);
}

/* Matrices made of exactly representable values must survive quantize -> dequantize bit for
 * bit, and the stored codes must be the ones the values were built from. */
static void exact_intn(const char *fmt, int bits, int64_t g, int64_t rows, int64_t cols, uint64_t seed) {
  struct ferry_rng r;
  ferry__rng_seed(&r, seed);
  const unsigned qmax = (1u << bits) - 1;
  float *x = ferry_malloc((size_t)(rows * cols) * sizeof *x);
  uint8_t *codes = ferry_malloc((size_t)(rows * cols));
  assert_non_null(x);
  assert_non_null(codes);
  for (int64_t i = 0; i < rows; i++) {
    for (int64_t j0 = 0; j0 < cols; j0 += g) {
      int64_t j1 = j0 + g < cols ? j0 + g : cols;
      int z = (int)ferry__rng_below(&r, qmax + 1);
      float s = ldexpf(1.0f, (int)ferry__rng_below(&r, 9) - 6);
      for (int64_t j = j0; j < j1; j++) {
        unsigned c = j == j0 ? 0 : j == j0 + 1 ? qmax : (unsigned)ferry__rng_below(&r, qmax + 1);
        codes[i * cols + j] = (uint8_t)c;
        x[i * cols + j] = (float)((int)c - z) * s;
      }
    }
  }
  struct packed p;
  pack(&p, fmt, x, rows, cols);
  assert_int_equal(p.layout.row_bytes, (uint64_t)((cols * bits + 7) / 8));
  uint8_t *row_codes = ferry_malloc((size_t)cols);
  for (int64_t i = 0; i < rows; i++) {
    ferry__quant_unpack_row(bits, (const uint8_t *)p.view.part[FERRY_QPART_DATA] + i * p.layout.row_bytes,
                            cols, row_codes);
    assert_memory_equal(row_codes, codes + i * cols, (size_t)cols);
  }
  float *d = unpack_all(&p);
  assert_memory_equal(d, x, (size_t)(rows * cols) * sizeof *x);
  ferry_free(row_codes);
  ferry_free(d);
  ferry_free(p.blob);
  ferry_free(codes);
  ferry_free(x);
}

static void test_exact_roundtrip(void **state) {
  (void)state;
  /* Odd column counts: partial last groups (5 and 3 elements) and rows ending mid-byte. */
  exact_intn("int4-g8", 4, 8, 5, 13, 1);
  exact_intn("int3-g8", 3, 8, 5, 13, 2);
  exact_intn("int2-g8", 2, 8, 5, 13, 3);
  exact_intn("int4-g64", 4, 64, 7, 131, 4);
  exact_intn("int3-g64", 3, 64, 7, 131, 5);
  exact_intn("int2-g64", 2, 64, 7, 131, 6);
  exact_intn("int3-g128", 3, 128, 3, 389, 7);

  /* int8: k * 2^e with +-127 present in each row. */
  int64_t rows = 4, cols = 37;
  float x[4 * 37];
  struct ferry_rng r;
  ferry__rng_seed(&r, 9);
  for (int64_t i = 0; i < rows; i++) {
    float s = ldexpf(1.0f, (int)i - 2);
    for (int64_t j = 0; j < cols; j++)
      x[i * cols + j] = (float)(j == 0 ? 127 : j == 1 ? -127 : (int)ferry__rng_below(&r, 255) - 127) * s;
  }
  struct packed p;
  pack(&p, "int8", x, rows, cols);
  float *d = unpack_all(&p);
  assert_memory_equal(d, x, sizeof x);
  ferry_free(d);
  ferry_free(p.blob);

  /* nf4: levels times a common power-of-two absmax (so double quantization is exact). */
  cols = 131;
  float y[4 * 131];
  for (int64_t i = 0; i < rows * cols; i++)
    y[i] = ferry__nf4_levels[(i % cols) % 64 == 0 ? 0 : ferry__rng_below(&r, 16)] * 0.25f;
  pack(&p, "nf4", y, rows, cols);
  d = unpack_all(&p);
  assert_memory_equal(d, y, sizeof y);
  ferry_free(d);
  ferry_free(p.blob);

  /* fp16/bf16: values already on their grids. */
  float h[64];
  for (int i = 0; i < 64; i++) h[i] = ferry__f16_to_f32((uint16_t)ferry__rng_u64(&r) & 0x7bff);
  pack(&p, "fp16", h, 8, 8);
  d = unpack_all(&p);
  assert_memory_equal(d, h, sizeof h);
  ferry_free(d);
  ferry_free(p.blob);
  for (int i = 0; i < 64; i++) h[i] = ferry__bf16_to_f32((uint16_t)ferry__rng_u64(&r) & 0x7f7f);
  pack(&p, "bf16", h, 8, 8);
  d = unpack_all(&p);
  assert_memory_equal(d, h, sizeof h);
  ferry_free(d);
  ferry_free(p.blob);
}

/* Measured on 256 x 1024 N(0, 1) (seed 42): fp16 0.00021, bf16 0.0017, int8 0.0079,
 * int4-g32 0.079, int4-g64 0.088, int4-g128 0.095, nf4 0.092, int3-g64 0.176, int2-g64 0.356.
 * Bounds leave 14-25% margin. */
static const struct {
  const char *fmt;
  double bound;
} normal_bounds[] = {
    {"fp32", 0.0},      {"fp16", 0.0005},    {"bf16", 0.003},     {"int8", 0.01},
    {"int4-g32", 0.09}, {"int4-g64", 0.10},  {"int4-g128", 0.11}, {"nf4", 0.115},
    {"int3-g64", 0.21}, {"int2-g64", 0.42},
};

static void test_error_normal(void **state) {
  (void)state;
  const int64_t rows = 256, cols = 1024;
  float *x = normal_matrix(rows * cols, 42);
  double prev4 = 0.0;
  for (size_t i = 0; i < sizeof normal_bounds / sizeof normal_bounds[0]; i++) {
    double e = roundtrip_error(normal_bounds[i].fmt, x, rows, cols);
    print_message("  %-10s rel. Frobenius error %.5f (bound %.3f)\n", normal_bounds[i].fmt, e,
                  normal_bounds[i].bound);
    assert_true(e <= normal_bounds[i].bound);
    /* Larger groups never help: int4 error grows with the group size. */
    if (strncmp(normal_bounds[i].fmt, "int4", 4) == 0) {
      assert_true(e > prev4);
      prev4 = e;
    }
  }
  /* Fewer bits, more error. */
  assert_true(roundtrip_error("int2-g64", x, rows, cols) > roundtrip_error("int3-g64", x, rows, cols));
  assert_true(roundtrip_error("int3-g64", x, rows, cols) > roundtrip_error("int4-g64", x, rows, cols));
  ferry_free(x);
}

/* A few 100x values: a grouped format must keep the damage inside their groups (and int8
 * inside their rows), and reproduce the outliers themselves closely. */
static void test_error_outliers(void **state) {
  (void)state;
  const int64_t rows = 64, cols = 1024, n = rows * cols;
  float *x = normal_matrix(n, 43);
  const int64_t pos[] = {5 * cols + 17, 20 * cols + 500, 20 * cols + 1000, 63 * cols + 1023, 0};
  const size_t npos = sizeof pos / sizeof pos[0];
  for (size_t k = 0; k < npos; k++) x[pos[k]] = (k % 2 ? -100.0f : 100.0f);
  const char *fmts[] = {"int4-g64", "nf4", "int3-g64", "int2-g64", "int8"};
  float *clean_ref = ferry_malloc((size_t)n * sizeof(float)), *clean_rec = ferry_malloc((size_t)n * sizeof(float));
  for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
    struct packed p;
    pack(&p, fmts[f], x, rows, cols);
    float *d = unpack_all(&p);
    int64_t span = strcmp(fmts[f], "int8") == 0 ? cols : p.layout.spec.group_size;
    /* Elements whose group (row for int8) holds no outlier. */
    size_t m = 0;
    for (int64_t i = 0; i < n; i++) {
      int hit = 0;
      for (size_t k = 0; k < npos; k++) hit |= (i / span == pos[k] / span);
      if (hit) continue;
      clean_ref[m] = x[i];
      clean_rec[m] = d[i];
      m++;
    }
    double e_clean = ferry_quant_error(clean_ref, clean_rec, m);
    double e_all = ferry_quant_error(x, d, (size_t)n);
    double bound = 0.0;
    for (size_t i = 0; i < sizeof normal_bounds / sizeof normal_bounds[0]; i++)
      if (strcmp(normal_bounds[i].fmt, fmts[f]) == 0) bound = normal_bounds[i].bound;
    print_message("  %-9s clean groups %.5f, whole tensor %.5f\n", fmts[f], e_clean, e_all);
    assert_true(m >= (size_t)(n - (int64_t)npos * span));
    assert_true(e_clean <= bound);
    for (size_t k = 0; k < npos; k++) {
      double tol = 0.01 * 100.0; /* nf4: the absmax element is a level; only absmax error */
      enum ferry_qformat fmt = p.layout.spec.format;
      if (fmt == FERRY_QFORMAT_INT8)
        tol = 0.5001 * ferry__load_f32((const uint8_t *)p.view.part[FERRY_QPART_SCALES] + 4 * (pos[k] / cols));
      else if (fmt != FERRY_QFORMAT_NF4)
        tol = 0.5001 * ferry__f16_to_f32(ferry__load_u16((const uint8_t *)p.view.part[FERRY_QPART_SCALES] +
                                                         2 * (pos[k] / span)));
      assert_true(fabs((double)d[pos[k]] - x[pos[k]]) <= tol);
    }
    /* The outlier groups themselves are much worse than the clean ones. */
    double worst = 0.0;
    for (size_t k = 0; k < npos; k++) {
      int64_t g0 = pos[k] / span * span;
      float ref[1024], rec[1024];
      size_t c = 0;
      for (int64_t i = g0; i < g0 + span; i++) {
        if (i == pos[k]) continue;
        ref[c] = x[i];
        rec[c++] = d[i];
      }
      double e = ferry_quant_error(ref, rec, c);
      worst = e > worst ? e : worst;
    }
    assert_true(worst > 2.0 * e_clean);
    ferry_free(d);
    ferry_free(p.blob);
  }
  ferry_free(clean_ref);
  ferry_free(clean_rec);
  ferry_free(x);
}

/* Inverse of the standard normal CDF by bisection on erfc (QLoRA's norm.ppf). */
static double norm_ppf(double p) {
  double lo = -10.0, hi = 10.0;
  for (int i = 0; i < 200; i++) {
    double mid = 0.5 * (lo + hi);
    if (0.5 * erfc(-mid / sqrt(2.0)) < p) lo = mid;
    else hi = mid;
  }
  return 0.5 * (lo + hi);
}

static void test_nf4_table(void **state) {
  (void)state;
  /* bitsandbytes create_normal_map(offset=0.9677083, use_extra_value=True): 8 positive
   * quantiles from linspace(offset, 0.5, 9), 7 negative from linspace(offset, 0.5, 8), 0,
   * all divided by the largest. */
  const double offset = 0.9677083;
  double v[16];
  int n = 0;
  for (int i = 0; i < 7; i++) v[n++] = -norm_ppf(offset + (0.5 - offset) * i / 7.0);
  v[n++] = 0.0;
  for (int i = 7; i >= 0; i--) v[n++] = norm_ppf(offset + (0.5 - offset) * i / 8.0);
  double vmax = v[15];
  for (int i = 0; i < 16; i++) {
    double want = v[i] / vmax;
    /* sort: negatives were generated from the largest magnitude down */
    assert_true(fabs(ferry__nf4_levels[i] - want) < 2e-6);
  }
  assert_true(ferry__nf4_levels[0] == -1.0f);
  assert_true(ferry__nf4_levels[7] == 0.0f);
  assert_true(ferry__nf4_levels[15] == 1.0f);
  assert_true(ferry__nf4_levels[1] == -0.6961928009986877f);
  assert_true(ferry__nf4_levels[8] == 0.07958029955625534f);
  for (int i = 0; i < 15; i++) assert_true(ferry__nf4_levels[i] < ferry__nf4_levels[i + 1]);
}

/* Reconstruction error of every block's absmax after double quantization, relative to the
 * true absmax; blocks listed in skip (flat indices) are left out. */
static void absmax_errors(const float *x, int64_t rows, int64_t cols, const struct packed *p,
                          int64_t skip, double *worst, double *mean) {
  const int64_t gpr = p->layout.groups_per_row, nb = rows * gpr, g = p->layout.spec.group_size;
  const uint8_t *qa = p->view.part[FERRY_QPART_SCALES];
  const uint8_t *s2 = p->view.part[FERRY_QPART_SCALES2], *m2 = p->view.part[FERRY_QPART_OFFSETS2];
  double w = 0.0, sum = 0.0;
  int64_t cnt = 0;
  for (int64_t i = 0; i < nb; i++) {
    if (i == skip) continue;
    int64_t r = i / gpr, k = i % gpr;
    float a = 0.0f;
    for (int64_t j = k * g; j < k * g + g && j < cols; j++) a = fmaxf(a, fabsf(x[r * cols + j]));
    int64_t b2 = i / FERRY_QUANT_NF4_BLOCK2;
    float rec = ferry__nf4_absmax(qa[i], ferry__load_f32(s2 + 4 * b2), ferry__load_f32(m2 + 4 * b2));
    double e = fabs((double)rec - a) / a;
    w = e > w ? e : w;
    sum += e;
    cnt++;
  }
  *worst = w;
  *mean = sum / (double)cnt;
}

static void test_nf4_double_quant(void **state) {
  (void)state;
  /* The dynamic map: 256 ascending codes spanning [-1, 1] with 0 and 1 exact. */
  for (int i = 0; i < 255; i++) assert_true(ferry__dynamic_map[i] < ferry__dynamic_map[i + 1]);
  assert_true(ferry__dynamic_map[255] == 1.0f);
  assert_true(ferry__dynamic_map[0] > -1.0f && ferry__dynamic_map[0] < -0.99f);
  int zeros = 0;
  for (int i = 0; i < 256; i++) zeros += ferry__dynamic_map[i] == 0.0f;
  assert_int_equal(zeros, 1);

  /* 64 x 4160: 65 blocks per row, 4160 blocks, 17 level-2 blocks (the last partial). */
  const int64_t rows = 64, cols = 4160;
  float *x = normal_matrix(rows * cols, 44);
  struct packed p;
  pack(&p, "nf4", x, rows, cols);
  assert_int_equal(p.layout.groups_per_row, 65);
  assert_int_equal(p.layout.part[FERRY_QPART_SCALES2].shape[0], 17);
  double worst, mean;
  absmax_errors(x, rows, cols, &p, -1, &worst, &mean);
  print_message("  nf4 absmax after double quant: max rel. error %.5f, mean %.6f\n", worst, mean);
  assert_true(worst < 0.01);
  assert_true(mean < 0.003);
  /* Double quantization costs almost nothing in the weights themselves. */
  float *d = unpack_all(&p);
  assert_true(ferry_quant_error(x, d, (size_t)(rows * cols)) < 0.115);
  ferry_free(d);
  ferry_free(p.blob);

  /* A 100x outlier makes its block's absmax 40 times the others': the dynamic map's relative
   * precision keeps the other 255 absmax values of its level-2 block usable. */
  x[7 * cols + 100] = 100.0f; /* row 7, block 1 -> flat block 456, level-2 block 1 */
  pack(&p, "nf4", x, rows, cols);
  absmax_errors(x, rows, cols, &p, 7 * 65 + 1, &worst, &mean);
  print_message("  nf4 absmax with an outlier block: max rel. error %.5f, mean %.6f\n", worst, mean);
  assert_true(worst < 0.1); /* measured 0.078: a block whose deviation lands between codes */
  assert_true(mean < 0.003);
  ferry_free(p.blob);
  ferry_free(x);
}

static void test_dequant_rows(void **state) {
  (void)state;
  /* 100 x 131 nf4: 300 blocks, so row ranges cross a level-2 boundary (block 256, row 85). */
  const int64_t rows = 100, cols = 131;
  float *x = normal_matrix(rows * cols, 45);
  const char *fmts[] = {"fp32", "fp16", "bf16", "int8", "int4-g32", "int4-g64", "int3-g64",
                        "int2-g64", "nf4", "int3-g8"};
  const int64_t ranges[][2] = {{0, 100}, {5, 23}, {84, 87}, {99, 100}, {0, 1}, {50, 50}};
  float *part = ferry_malloc((size_t)(rows * cols + 1) * sizeof(float));
  for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
    struct packed p;
    pack(&p, fmts[f], x, rows, cols);
    float *full = unpack_all(&p);
    for (size_t k = 0; k < sizeof ranges / sizeof ranges[0]; k++) {
      int64_t b = ranges[k][0], e = ranges[k][1];
      size_t n = (size_t)((e - b) * cols);
      part[n] = 12345.0f; /* guard: nothing written past the range */
      assert_int_equal(ferry_quant_dequantize_rows(&p.layout.spec, &p.view, rows, cols, b, e, part),
                       FERRY_OK);
      assert_memory_equal(part, full + b * cols, n * sizeof(float));
      assert_true(part[n] == 12345.0f);
    }
    assert_int_equal(ferry_quant_dequantize_rows(&p.layout.spec, &p.view, rows, cols, 5, 101, part),
                     FERRY_ERR_INVALID);
    assert_int_equal(ferry_quant_dequantize_rows(&p.layout.spec, &p.view, rows, cols, 6, 5, part),
                     FERRY_ERR_INVALID);
    assert_int_equal(ferry_quant_dequantize_rows(&p.layout.spec, &p.view, rows, cols, -1, 5, part),
                     FERRY_ERR_INVALID);
    ferry_free(full);
    ferry_free(p.blob);
  }
  ferry_free(part);
  ferry_free(x);
}

/* The fast kernels against the definition: (code - zero) * scale from the reference unpacker;
 * fp16 (F16C or bit trick) against common/half.c for every half value. */
static void dequant_reference(void) {
  const int64_t rows = 9, cols = 200;
  float *x = normal_matrix(rows * cols, 46);
  const char *fmts[] = {"int4-g64", "int3-g64", "int2-g64", "int3-g16", "int2-g8", "int4-g128"};
  for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
    struct packed p;
    pack(&p, fmts[f], x, rows, cols);
    float *d = unpack_all(&p);
    int bits = ferry__quant_bits(p.layout.spec.format);
    int64_t g = p.layout.spec.group_size, gpr = p.layout.groups_per_row;
    const uint8_t *data = p.view.part[FERRY_QPART_DATA], *sc = p.view.part[FERRY_QPART_SCALES];
    const uint8_t *zp = p.view.part[FERRY_QPART_ZEROS];
    for (int64_t r = 0; r < rows; r++) {
      for (int64_t j = 0; j < cols; j++) {
        int64_t k = r * gpr + j / g;
        float s = ferry__f16_to_f32(ferry__load_u16(sc + 2 * k));
        int c = (int)ferry__quant_code_at(data + r * p.layout.row_bytes, bits, j);
        assert_true(d[r * cols + j] == (float)(c - zp[k]) * s);
      }
    }
    ferry_free(d);
    ferry_free(p.blob);
  }
  ferry_free(x);

  uint16_t *h = ferry_malloc(65536 * 2);
  float *out = ferry_malloc(65536 * sizeof(float));
  for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
  struct ferry_qspec s = spec_of("fp16");
  struct ferry_qview v = {.part = {h}};
  assert_int_equal(ferry_quant_dequantize_rows(&s, &v, 256, 256, 0, 256, out), FERRY_OK);
  for (uint32_t i = 0; i < 65536; i++) {
    float want = ferry__f16_to_f32((uint16_t)i);
    if (isnan(want)) assert_true(isnan(out[i]));
    else assert_int_equal(ferry__f32_bits(out[i]), ferry__f32_bits(want));
  }
  /* An odd-sized, unaligned source exercises the tail and unaligned loads. */
  uint8_t *raw = ferry_malloc(2 * 37 + 1);
  memcpy(raw + 1, h + 15000, 2 * 37);
  v.part[FERRY_QPART_DATA] = raw + 1;
  assert_int_equal(ferry_quant_dequantize_rows(&s, &v, 1, 37, 0, 1, out), FERRY_OK);
  for (int i = 0; i < 37; i++) assert_true(out[i] == ferry__f16_to_f32(h[15000 + i]));
  ferry_free(raw);
  ferry_free(out);
  ferry_free(h);
}

static void test_dequant_reference(void **state) {
  (void)state;
  dequant_reference();
  ferry__quant_set_simd(0);
  dequant_reference();
  ferry__quant_set_simd(1);
}

/* The SIMD kernels (where the CPU has them) and the portable loops agree bit for bit, on odd
 * shapes with partial groups and from unaligned part pointers. */
static void test_simd_matches_portable(void **state) {
  (void)state;
  const int64_t rows = 11, cols = 333;
  float *x = normal_matrix(rows * cols, 49);
  const char *fmts[] = {"fp16", "bf16", "int8", "int4-g32", "int4-g64", "int3-g64", "int3-g8",
                        "int2-g64", "int2-g16", "nf4", "nf4-g32"};
  float *a = ferry_malloc((size_t)(rows * cols) * sizeof(float));
  float *b = ferry_malloc((size_t)(rows * cols) * sizeof(float));
  for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
    struct packed p;
    pack(&p, fmts[f], x, rows, cols);
    /* Shift every part by one byte. */
    uint8_t *shifted = ferry_malloc(p.layout.blob_bytes + 1);
    memcpy(shifted + 1, p.blob, p.layout.blob_bytes);
    struct ferry_qview v;
    ferry_quant_view_blob(&p.layout, shifted + 1, &v);
    ferry__quant_set_simd(1);
    assert_int_equal(ferry_quant_dequantize_rows(&p.layout.spec, &v, rows, cols, 0, rows, a), FERRY_OK);
    ferry__quant_set_simd(0);
    assert_int_equal(ferry_quant_dequantize_rows(&p.layout.spec, &v, rows, cols, 0, rows, b), FERRY_OK);
    ferry__quant_set_simd(1);
    assert_memory_equal(a, b, (size_t)(rows * cols) * sizeof(float));
    ferry_free(shifted);
    ferry_free(p.blob);
  }
  ferry_free(a);
  ferry_free(b);
  ferry_free(x);
}

static void test_bad_input(void **state) {
  (void)state;
  float x[12] = {0};
  x[7] = NAN;
  struct packed p;
  struct ferry_qspec s = spec_of("int4-g8");
  assert_int_equal(ferry_quant_layout(&s, 2, 6, &p.layout), FERRY_OK);
  uint8_t blob[1024];
  struct ferry_qout out;
  ferry_quant_out_blob(&p.layout, blob, &out);
  assert_int_equal(ferry_quant_quantize(&s, x, 2, 6, &out), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "[1, 1]"));
  assert_true(tu_contains(ferry_last_error(), "NaN"));
  x[7] = INFINITY;
  assert_int_equal(ferry_quant_quantize(&s, x, 2, 6, &out), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "infinite"));
  x[7] = 1.0f;
  out.part[FERRY_QPART_ZEROS] = NULL;
  assert_int_equal(ferry_quant_quantize(&s, x, 2, 6, &out), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "zeros"));
  struct ferry_qview v = {.part = {blob}};
  float d[12];
  assert_int_equal(ferry_quant_dequantize_rows(&s, &v, 2, 6, 0, 2, d), FERRY_ERR_INVALID);
  assert_int_equal(ferry_quant_dequantize_rows(&s, NULL, 2, 6, 0, 2, d), FERRY_ERR_INVALID);
  /* All-zero input: scales 0, output exactly zero. */
  memset(x, 0, sizeof x);
  const char *fmts[] = {"int8", "int4-g8", "int3-g8", "int2-g8", "nf4-g8"};
  for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
    s = spec_of(fmts[f]);
    assert_int_equal(ferry_quant_layout(&s, 2, 6, &p.layout), FERRY_OK);
    assert_true(p.layout.blob_bytes <= sizeof blob);
    ferry_quant_out_blob(&p.layout, blob, &out);
    assert_int_equal(ferry_quant_quantize(&s, x, 2, 6, &out), FERRY_OK);
    ferry_quant_view_blob(&p.layout, blob, &v);
    for (int i = 0; i < 12; i++) d[i] = 1.0f;
    assert_int_equal(ferry_quant_dequantize_rows(&s, &v, 2, 6, 0, 2, d), FERRY_OK);
    for (int i = 0; i < 12; i++) assert_true(d[i] == 0.0f);
  }
}

static void test_plan(void **state) {
  (void)state;
  struct ferry_qplan plan;
  assert_int_equal(ferry_quant_plan_parse(
                       "attn=int4-g64,expert=int3-g64,shared=int8,head=fp16,embed=fp16,default=int8",
                       &plan),
                   FERRY_OK);
  struct ferry_qspec s;
  char buf[256], name[FERRY_QSPEC_NAME_MAX];
  const struct {
    const char *cls, *fmt;
  } want[] = {{"attn", "int4-g64"}, {"expert", "int3-g64"}, {"shared", "int8"},
              {"router", "int8"},   {"dense_ffn", "int8"},  {"embed", "fp16"},
              {"head", "fp16"},     {"norm", "fp32"}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    assert_int_equal(ferry_quant_plan_lookup(&plan, want[i].cls, &s), FERRY_OK);
    assert_string_equal(ferry_quant_spec_name(&s, name, sizeof name), want[i].fmt);
  }
  assert_string_equal(ferry_quant_plan_format(&plan, buf, sizeof buf),
                      "attn=int4-g64,expert=int3-g64,shared=int8,router=int8,dense_ffn=int8,"
                      "embed=fp16,head=fp16,norm=fp32");
  struct ferry_qplan again;
  assert_int_equal(ferry_quant_plan_parse(buf, &again), FERRY_OK);
  assert_memory_equal(&plan, &again, sizeof plan);

  /* Order does not matter; spaces are ignored; unset classes are fp16. */
  assert_int_equal(ferry_quant_plan_parse(" default = nf4 , router=fp32,norm=bf16", &plan), FERRY_OK);
  assert_int_equal(plan.spec[FERRY_QCLASS_ATTN].format, FERRY_QFORMAT_NF4);
  assert_int_equal(plan.spec[FERRY_QCLASS_ROUTER].format, FERRY_QFORMAT_FP32);
  assert_int_equal(plan.spec[FERRY_QCLASS_NORM].format, FERRY_QFORMAT_BF16);
  assert_int_equal(ferry_quant_plan_parse("attn=int8", &plan), FERRY_OK);
  assert_int_equal(plan.spec[FERRY_QCLASS_EXPERT].format, FERRY_QFORMAT_FP16);
  assert_int_equal(plan.spec[FERRY_QCLASS_NORM].format, FERRY_QFORMAT_FP32);
  assert_int_equal(ferry_quant_plan_parse("int4-g128", &plan), FERRY_OK);
  assert_int_equal(plan.spec[FERRY_QCLASS_HEAD].group_size, 128);
  assert_int_equal(plan.spec[FERRY_QCLASS_NORM].format, FERRY_QFORMAT_FP32);
  assert_int_equal(ferry_quant_plan_parse("default=fp16", &plan), FERRY_OK);
  assert_int_equal(plan.spec[FERRY_QCLASS_NORM].format, FERRY_QFORMAT_FP16);

  /* Errors name what is wrong and where. */
  assert_int_equal(ferry_quant_plan_parse("attn=int4-g64,atn=int8", &plan), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "unknown tensor class 'atn' at offset 14"));
  assert_true(tu_contains(ferry_last_error(), "dense_ffn"));
  assert_int_equal(ferry_quant_plan_parse("attn=int5", &plan), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "unknown format 'int5' for class 'attn'"));
  assert_int_equal(ferry_quant_plan_parse("attn=int8,attn=int4-g64", &plan), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "given twice"));
  assert_int_equal(ferry_quant_plan_parse("norm=int8", &plan), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "norms stay"));
  assert_int_equal(ferry_quant_plan_parse("attn=int8,,expert=int8", &plan), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "empty entry at offset 10"));
  assert_int_equal(ferry_quant_plan_parse("attn=int8,int4-g64", &plan), FERRY_ERR_INVALID);
  assert_int_equal(ferry_quant_plan_parse("", &plan), FERRY_ERR_INVALID);
  assert_int_equal(ferry_quant_plan_lookup(&plan, "mlp", &s), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "'mlp'"));

  enum ferry_qclass c;
  assert_int_equal(ferry_quant_class_parse("Dense_FFN", &c), FERRY_OK);
  assert_int_equal(c, FERRY_QCLASS_DENSE_FFN);
  assert_string_equal(ferry_quant_class_name(FERRY_QCLASS_SHARED), "shared");
  assert_string_equal(ferry_quant_class_name(FERRY_QCLASS_COUNT), "?");
  assert_int_equal(ferry_quant_class_of_role(FERRY_ROLE_ATTN_K), FERRY_QCLASS_ATTN);
  assert_int_equal(ferry_quant_class_of_role(FERRY_ROLE_EXPERT_DOWN), FERRY_QCLASS_EXPERT);
  assert_int_equal(ferry_quant_class_of_role(FERRY_ROLE_SHARED_UP), FERRY_QCLASS_SHARED);
  assert_int_equal(ferry_quant_class_of_role(FERRY_ROLE_ROUTER), FERRY_QCLASS_ROUTER);
  assert_int_equal(ferry_quant_class_of_role(FERRY_ROLE_FFN_GATE), FERRY_QCLASS_DENSE_FFN);
  assert_int_equal(ferry_quant_class_of_role(FERRY_ROLE_POS_EMBED), FERRY_QCLASS_EMBED);
  assert_int_equal(ferry_quant_class_of_role(FERRY_ROLE_LM_HEAD), FERRY_QCLASS_HEAD);
  assert_int_equal(ferry_quant_class_of_role(FERRY_ROLE_ATTN_Q_BIAS), FERRY_QCLASS_NORM);
  assert_int_equal(ferry_quant_class_of_role(FERRY_ROLE_FINAL_NORM), FERRY_QCLASS_NORM);
  assert_int_equal(ferry_quant_class_of_role(FERRY_ROLE_ATTN_QKV), FERRY_QCLASS_ATTN);
  assert_int_equal(ferry_quant_class_of_role(FERRY_ROLE_MLA_KV_B), FERRY_QCLASS_ATTN);
  assert_int_equal(ferry_quant_class_of_role(FERRY_ROLE_EXPERT_GATE_UP), FERRY_QCLASS_EXPERT);
  assert_int_equal(ferry_quant_class_of_role(FERRY_ROLE_EXPERT_GATE_UP_BIAS), FERRY_QCLASS_NORM);
  struct ferry_qspec i8 = spec_of("int8");
  ferry_quant_plan_init(&plan, &i8);
  assert_int_equal(plan.spec[FERRY_QCLASS_EMBED].format, FERRY_QFORMAT_INT8);
  assert_int_equal(plan.spec[FERRY_QCLASS_NORM].format, FERRY_QFORMAT_FP32);
}

/* Every 2-D weight of every catalogue model belongs to a class a plan can quantize: one left in
 * the norm class (which stays fp32 under a low-bit plan) is what priced gpt-oss's fused expert
 * gate/up, BLOOM's fused query_key_value and DeepSeek's latent-attention projections as fp32
 * under --quant int4-g64. The router and the shared expert's gate are 2-D on purpose (router). */
static void test_every_weight_has_a_class(void **state) {
  (void)state;
  size_t presets = ferry_model_preset_count(), checked = 0;
  for (size_t i = 0; i < presets; i++) {
    ferry_model *m = NULL;
    assert_int_equal(ferry_model_open(&m, ferry_model_preset_name(i)), FERRY_OK);
    for (size_t t = 0; t < ferry_model_tensor_count(m); t++) {
      const struct ferry_tensor_desc *d = ferry_model_tensor(m, t);
      if (d->ndim != 2) continue;
      if (ferry_quant_class_of_role(d->role) == FERRY_QCLASS_NORM)
        fail_msg("%s: 2-D tensor %s (role %d) falls in the norm class", ferry_model_preset_name(i), d->name,
                 (int)d->role);
      checked++;
    }
    ferry_model_close(m);
  }
  assert_true(checked > 1000);
}

/* The same weights on the host executor: the fused query_key_value of GPT-NeoX and BLOOM and
 * DeepSeek-V2's latent-attention projections are quantized by an int8 plan (before, they stayed
 * fp32 as norms), and the model still computes logits close to fp32's, not equal to them. A model
 * whose experts are one fused tensor is refused with a message that says so (the writer used to
 * fail on the second expert's "declared twice"). */
static void quantized_logits(const char *model_dir, struct tu_logit_log *log) {
  static const struct ferry_engine_request reqs[] = {{.id = 0, .prompt_tokens = 5, .output_tokens = 4},
                                                     {.id = 1, .prompt_tokens = 9, .output_tokens = 3}};
  struct ferry_engine_config c = {.max_batch = 2, .max_step_tokens = 16, .max_seq_tokens = 16, .seed = 9,
                                  .greedy = 1, .resident_all = 1, .on_logits = tu_on_logits, .logits_user = log};
  tu_run_host(model_dir, &c, reqs, 2, NULL, NULL);
}

static void test_fused_attention_quantized(void **state) {
  (void)state;
  char *dir = tu_mkdtemp("qfused");
  struct ferry_gen_options go = {.dtype = FERRY_DTYPE_F32, .seed = 5};
  static const char *const families[] = {"gpt_neox", "bloom", "deepseek_v2"};
  struct ferry_qplan plan;
  assert_int_equal(ferry_quant_plan_parse("int8", &plan), FERRY_OK);
  for (int f = 0; f < 3; f++) {
    char *model = tu_gen_tiny(dir, families[f], &go), qdir[512];
    snprintf(qdir, sizeof qdir, "%s/%s-q8", dir, families[f]);
    struct ferry_quantize_report rep;
    assert_int_equal(ferry_model_quantize(model, qdir, &plan, NULL, &rep), FERRY_OK);
    ferry_model *m = NULL;
    assert_int_equal(ferry_model_open(&m, model), FERRY_OK);
    int64_t attn = 0;
    for (size_t t = 0; t < ferry_model_tensor_count(m); t++) {
      const struct ferry_tensor_desc *d = ferry_model_tensor(m, t);
      attn += d->ndim == 2 && ferry_quant_class_of_role(d->role) == FERRY_QCLASS_ATTN;
    }
    ferry_model_close(m);
    if (rep.cls[FERRY_QCLASS_ATTN].tensors != attn || attn < 4)
      fail_msg("%s: %lld attention tensors quantized of %lld", families[f],
               (long long)rep.cls[FERRY_QCLASS_ATTN].tensors, (long long)attn);
    assert_true(rep.cls[FERRY_QCLASS_ATTN].bytes_after * 3 < rep.cls[FERRY_QCLASS_ATTN].bytes_before);
    struct tu_logit_log ref = {0}, got = {0};
    quantized_logits(model, &ref);
    quantized_logits(qdir, &got);
    assert_true(ref.n > 0);
    assert_int_equal(got.n, ref.n);
    double dot = 0, na = 0, nb = 0;
    int differ = 0;
    for (size_t i = 0; i < ref.n; i++) {
      dot += (double)ref.v[i] * got.v[i];
      na += (double)ref.v[i] * ref.v[i];
      nb += (double)got.v[i] * got.v[i];
      differ |= ref.v[i] != got.v[i];
    }
    assert_true(differ);
    if (!(1 - dot / sqrt(na * nb) < 1e-3)) fail_msg("%s: int8 logits %.2e from fp32's", families[f], 1 - dot / sqrt(na * nb));
    free(ref.v);
    free(got.v);
    free(model);
  }
  char *fused = tu_gen_tiny(dir, "llama4", &go), qdir[512];
  snprintf(qdir, sizeof qdir, "%s/llama4-q8", dir);
  assert_int_equal(ferry_model_quantize(fused, qdir, &plan, NULL, NULL), FERRY_ERR_UNSUPPORTED);
  assert_true(tu_contains(ferry_last_error(), "fused expert tensors is not supported"));
  free(fused);
  tu_rmtree(dir);
  free(dir);
}

static void test_metrics(void **state) {
  (void)state;
  float a[4] = {3, 4, 0, 0}, b[4] = {3, 4, 0, 0}, c[4] = {0, 0, 0, 0}, d[4] = {-3, -4, 0, 0};
  assert_true(ferry_quant_error(a, b, 4) == 0.0);
  b[0] = 0.0f; /* error 3 over norm 5 */
  assert_true(fabs(ferry_quant_error(a, b, 4) - 0.6) < 1e-12);
  assert_true(ferry_quant_error(c, c, 4) == 0.0);
  assert_true(isinf(ferry_quant_error(c, a, 4)));
  assert_true(fabs(ferry_quant_cosine(a, a, 4) - 1.0) < 1e-12);
  assert_true(fabs(ferry_quant_cosine(a, d, 4) + 1.0) < 1e-12);
  assert_true(fabs(ferry_quant_cosine(a, b, 4) - 0.8) < 1e-12); /* 16 / (5 * 4) */
  assert_true(ferry_quant_cosine(a, c, 4) == 0.0);
  assert_true(ferry_quant_cosine(c, c, 4) == 1.0);

  float p[3] = {1.0f, 2.0f, 3.0f}, q[3] = {1.0f, 2.0f, 3.0f};
  assert_true(fabs(ferry_quant_kl_logits(p, q, 3)) < 1e-15);
  /* Shift invariance and no overflow with huge logits. */
  float p2[3] = {1001.0f, 1002.0f, 1003.0f}, q2[3] = {3001.0f, 3002.0f, 3004.0f};
  float q1[3] = {1.0f, 2.0f, 4.0f};
  double k1 = ferry_quant_kl_logits(p, q1, 3), k2 = ferry_quant_kl_logits(p2, q2, 3);
  assert_true(isfinite(k2));
  assert_true(fabs(k1 - k2) < 1e-12);
  /* Closed form for two classes: p = softmax(0, 0) = (1/2, 1/2), q = softmax(0, ln 3) = (1/4, 3/4). */
  float r2[2] = {0.0f, 0.0f}, q3[2] = {0.0f, (float)log(3.0)};
  double want = 0.5 * log(0.5 / 0.25) + 0.5 * log(0.5 / 0.75);
  assert_true(fabs(ferry_quant_kl_logits(r2, q3, 2) - want) < 1e-7);
  assert_true(ferry_quant_kl_logits(q3, r2, 2) > 0.0);
  /* A token the reference rules out contributes nothing; one the quantized model rules out
   * while the reference does not makes the divergence infinite. */
  float r3[2] = {0.0f, -INFINITY}, q4[2] = {0.0f, 5.0f};
  assert_true(ferry_quant_kl_logits(r3, q4, 2) > 0.0);
  assert_true(isinf(ferry_quant_kl_logits(q4, r3, 2)));
  float bad[2] = {0.0f, NAN};
  assert_true(isnan(ferry_quant_kl_logits(bad, r2, 2)));
  /* Int4 logits stay close: a quantized matrix-vector product against the original one. */
  const int64_t rows = 512, cols = 256;
  float *w = normal_matrix(rows * cols, 47), *v = normal_matrix(cols, 48);
  struct packed pk;
  pack(&pk, "int4-g64", w, rows, cols);
  float *wq = unpack_all(&pk);
  float *l_ref = ferry_malloc(rows * sizeof(float)), *l_q = ferry_malloc(rows * sizeof(float));
  for (int64_t r = 0; r < rows; r++) {
    double s1 = 0.0, s2 = 0.0;
    for (int64_t j = 0; j < cols; j++) {
      s1 += (double)w[r * cols + j] * v[j];
      s2 += (double)wq[r * cols + j] * v[j];
    }
    l_ref[r] = (float)(s1 / 4.0);
    l_q[r] = (float)(s2 / 4.0);
  }
  double cos = ferry_quant_cosine(l_ref, l_q, (size_t)rows), kl = ferry_quant_kl_logits(l_ref, l_q, (size_t)rows);
  print_message("  int4-g64 logits: cosine %.6f, KL %.6f nats\n", cos, kl);
  assert_true(cos > 0.99);
  assert_true(kl > 0.0 && kl < 0.05);
  ferry_free(l_ref);
  ferry_free(l_q);
  ferry_free(wq);
  ferry_free(pk.blob);
  ferry_free(w);
  ferry_free(v);
}

/* Quantizing splits rows (and NF4's second-level runs) over threads: the bytes must be the
 * same for any thread count, including splits that cut NF4 runs across rows. */
static void test_threads_same_bytes(void **state) {
  (void)state;
  const char *fmts[] = {"int8", "int4-g64", "int3-g32", "int2-g64", "nf4"};
  const int64_t rows = 301, cols = 200; /* odd, so chunks end mid-run */
  float *x = normal_matrix(rows * cols, 99);
  const char *saved = getenv("FERRY_THREADS");
  char *keep = saved ? strdup(saved) : NULL;
  for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
    struct packed one, many;
    setenv("FERRY_THREADS", "1", 1);
    pack(&one, fmts[f], x, rows, cols);
    setenv("FERRY_THREADS", "7", 1);
    pack(&many, fmts[f], x, rows, cols);
    assert_int_equal(one.layout.blob_bytes, many.layout.blob_bytes);
    assert_memory_equal(one.blob, many.blob, one.layout.blob_bytes);
    ferry_free(one.blob);
    ferry_free(many.blob);
  }
  if (keep) setenv("FERRY_THREADS", keep, 1);
  else unsetenv("FERRY_THREADS");
  free(keep);
  ferry_free(x);
}

/* ---- formats of published checkpoints ------------------------------------------------------- */

/* Small matrices packed by hand from each tool's documented layout, expanded by ferry. */
static void test_published_formats(void **state) {
  (void)state;
  const int64_t n = 8, k = 16; /* out, in */
  float got[8 * 16];
  /* GPTQ, group 8: code(i, o) = (i + o) % 16, zero(g, o) = 3 + g (stored minus one), scale 0.5
   * for group 0 and 0.25 for group 1; g_idx puts input rows alternately in the groups */
  {
    uint32_t qw[2 * 8] = {0}, qz[2] = {0}, gidx[16];
    uint16_t sc[2 * 8];
    for (int64_t i = 0; i < k; i++) {
      gidx[i] = (uint32_t)(i % 2);
      for (int64_t o = 0; o < n; o++) qw[(i / 8) * n + o] |= (uint32_t)((i + o) % 16) << (4 * (i % 8));
    }
    for (int g = 0; g < 2; g++)
      for (int64_t o = 0; o < n; o++) {
        qz[g] |= (uint32_t)(3 + g - 1) << (4 * o);
        sc[g * n + o] = ferry__f32_to_f16(g ? 0.25f : 0.5f);
      }
    struct ferry_qspec sp = spec_of("gptq4-g8");
    struct ferry_qview v = {{qw, sc, qz, gidx, NULL}};
    assert_int_equal(ferry_quant_dequantize_rows(&sp, &v, n, k, 0, n, got), FERRY_OK);
    for (int64_t o = 0; o < n; o++)
      for (int64_t i = 0; i < k; i++) {
        const int g = (int)(i % 2);
        assert_true(got[o * k + i] == (g ? 0.25f : 0.5f) * (float)((i + o) % 16 - (3 + g)));
      }
  }
  /* AWQ GEMM, group 16: output column 8c + [0,2,4,6,1,3,5,7][j] lives in nibble j */
  {
    static const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    uint32_t qw[16] = {0}, qz[1] = {0};
    uint16_t sc[8];
    for (int64_t i = 0; i < k; i++)
      for (int j = 0; j < 8; j++) qw[i] |= (uint32_t)((i * 3 + order[j]) % 16) << (4 * j);
    for (int j = 0; j < 8; j++) qz[0] |= (uint32_t)(order[j] + 2) << (4 * j);
    for (int64_t o = 0; o < n; o++) sc[o] = ferry__f32_to_f16(0.125f * (float)(o + 1));
    struct ferry_qspec sp = spec_of("awq4-g16");
    struct ferry_qview v = {{qw, sc, qz, NULL, NULL}};
    assert_int_equal(ferry_quant_dequantize_rows(&sp, &v, n, k, 2, n, got), FERRY_OK); /* rows 2.. */
    for (int64_t o = 2; o < n; o++)
      for (int64_t i = 0; i < k; i++)
        assert_true(got[(o - 2) * k + i] == 0.125f * (float)(o + 1) * (float)((i * 3 + o) % 16 - (o + 2)));
  }
  /* compressed-tensors symmetric int4 (codes stored + 8), bf16 scales per group of 8 */
  {
    uint32_t wp[8 * 2] = {0};
    uint16_t sc[8 * 2];
    int64_t shape[2] = {n, k};
    for (int64_t o = 0; o < n; o++) {
      for (int64_t i = 0; i < k; i++) wp[o * 2 + i / 8] |= (uint32_t)((i + 2 * o) % 16) << (4 * (i % 8));
      for (int g = 0; g < 2; g++) sc[o * 2 + g] = ferry__f32_to_bf16(g ? -2.0f : 0.5f);
    }
    struct ferry_qspec sp = spec_of("ct4-g8");
    struct ferry_qview v = {{wp, sc, NULL, NULL, shape}};
    assert_int_equal(ferry_quant_dequantize_rows(&sp, &v, n, k, 0, n, got), FERRY_OK);
    for (int64_t o = 0; o < n; o++)
      for (int64_t i = 0; i < k; i++)
        assert_true(got[o * k + i] == (i >= 8 ? -2.0f : 0.5f) * (float)((i + 2 * o) % 16 - 8));
  }
  /* MXFP4: byte 0x71 is e2m1 codes 1 (0.5) then 7 (6.0); scale byte 128 is 2^1 */
  {
    uint8_t blocks[2 * 16], scales[2] = {128, 125};
    memset(blocks, 0x71, sizeof blocks);
    blocks[16] = 0xF9; /* -0.5 then -6.0 */
    struct ferry_qspec sp = spec_of("mxfp4");
    struct ferry_qview v = {{blocks, scales, NULL, NULL, NULL}};
    float row[2 * 32];
    assert_int_equal(ferry_quant_dequantize_rows(&sp, &v, 2, 32, 0, 2, row), FERRY_OK);
    assert_true(row[0] == 1.0f && row[1] == 12.0f && row[31] == 12.0f);
    assert_true(row[32] == -0.125f && row[33] == -1.5f && row[34] == 0.125f); /* 2^(125 - 127) */
  }
  /* fp8 e4m3 with one fp32 scale per 128 x 128 block: 0x38 = 1, 0x7E = 448, 0xB8 = -1, 0x01 = 2^-9 */
  {
    uint8_t w[4] = {0x38, 0x7E, 0xB8, 0x01};
    float sinv = 0.5f;
    struct ferry_qspec sp = spec_of("fp8b");
    struct ferry_qview v = {{w, &sinv, NULL, NULL, NULL}};
    float row[4];
    assert_int_equal(ferry_quant_dequantize_rows(&sp, &v, 1, 4, 0, 1, row), FERRY_OK);
    assert_true(row[0] == 0.5f && row[1] == 224.0f && row[2] == -0.5f && row[3] == ldexpf(1.0f, -10));
  }
}

/* The layouts of published formats: the parts their tools write, and ferry never quantizes into
 * them. */
static void test_published_layouts(void **state) {
  (void)state;
  struct ferry_qlayout lay;
  struct ferry_qspec sp = spec_of("gptq4-g128");
  assert_int_equal(ferry_quant_layout(&sp, 4096, 11008, &lay), FERRY_OK);
  assert_string_equal(lay.part[FERRY_QPART_DATA].suffix, "qweight");
  assert_int_equal(lay.part[FERRY_QPART_DATA].shape[0], 11008 / 8);
  assert_int_equal(lay.part[FERRY_QPART_DATA].shape[1], 4096);
  assert_string_equal(lay.part[FERRY_QPART_SCALES2].suffix, "g_idx");
  sp = spec_of("mxfp4");
  assert_int_equal(ferry_quant_layout(&sp, 5760, 2880, &lay), FERRY_OK);
  assert_int_equal(lay.part[FERRY_QPART_DATA].ndim, 3);
  assert_int_equal(lay.total_bytes, 5760u * 2880u / 2u + 5760u * 90u);
  assert_int_equal(ferry_quant_layout(&sp, 64, 48, &lay), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "multiple of 32"));
  float src[8 * 16] = {0};
  uint8_t blob[4096];
  struct ferry_qout qo = {{blob, blob, blob, blob, blob}};
  sp = spec_of("awq4-g16");
  assert_int_equal(ferry_quant_quantize(&sp, src, 8, 16, &qo), FERRY_ERR_UNSUPPORTED);
  assert_true(tu_contains(ferry_last_error(), "published"));
}

/* The bytes the model accounts per tensor quantized as published are the format's layout. */
static void test_published_bytes_agree(void **state) {
  (void)state;
  const struct {
    const char *preset, *spec;
  } cases[] = {{"deepseek-v3", "fp8b"}, {"gpt-oss-120b", "mxfp4"}};
  for (size_t c = 0; c < 2; c++) {
    ferry_model *m = NULL;
    assert_int_equal(ferry_model_open(&m, cases[c].preset), FERRY_OK);
    struct ferry_qspec sp = spec_of(cases[c].spec);
    size_t checked = 0;
    for (size_t i = 0; i < ferry_model_tensor_count(m); i++) {
      const struct ferry_tensor_desc *t = ferry_model_tensor(m, i);
      if (!t->quantized) continue;
      assert_int_equal(t->bytes, ferry_quant_packed_bytes(&sp, t->shape[0], t->shape[1], NULL, NULL));
      checked++;
    }
    assert_true(checked > 100);
    ferry_model_close(m);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_threads_same_bytes),
      cmocka_unit_test(test_spec_names),       cmocka_unit_test(test_packed_bytes),
      cmocka_unit_test(test_pack_bits),        cmocka_unit_test(test_exact_roundtrip),
      cmocka_unit_test(test_error_normal),     cmocka_unit_test(test_error_outliers),
      cmocka_unit_test(test_nf4_table),        cmocka_unit_test(test_nf4_double_quant),
      cmocka_unit_test(test_dequant_rows),     cmocka_unit_test(test_dequant_reference),
      cmocka_unit_test(test_simd_matches_portable),
      cmocka_unit_test(test_bad_input),        cmocka_unit_test(test_plan),
      cmocka_unit_test(test_metrics),          cmocka_unit_test(test_every_weight_has_a_class),
      cmocka_unit_test(test_fused_attention_quantized),
      cmocka_unit_test(test_published_formats),
      cmocka_unit_test(test_published_layouts), cmocka_unit_test(test_published_bytes_agree),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
