/* MLP predictor weights as safetensors: what `ferry predictor train` writes and every user of
 * mlp3 / mlp7 reads (the engine through ferry_prefetcher, `ferry predictor eval`, a program).
 * Fp32 standardisation; weights in fp32, fp16 or int8 with fp32 per-row scales. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/error.h"
#include "common/half.h"
#include "common/units.h"
#include "ferry/prefetch.h"
#include "ferry/store.h"


struct tensor_spec {
  const char *name;
  float *data;
  int64_t rows, cols; /* cols 0: a vector of `rows` */
  int quantizable;    /* weights: stored in the chosen dtype; else fp32 (int8) or fp16 */
};

static void mlp_tensors(const struct ferry_mlp *m, struct tensor_spec t[8]) {
  int64_t O = (int64_t)m->n_layers * m->n_experts;
  t[0] = (struct tensor_spec){"in_mean", m->in_mean, m->n_in, 0, 0};
  t[1] = (struct tensor_spec){"in_scale", m->in_scale, m->n_in, 0, 0};
  t[2] = (struct tensor_spec){"w1", m->w1, FERRY_MLP_H1, m->n_in, 1};
  t[3] = (struct tensor_spec){"b1", m->b1, FERRY_MLP_H1, 0, 2};
  t[4] = (struct tensor_spec){"w2", m->w2, FERRY_MLP_H2, FERRY_MLP_H1, 1};
  t[5] = (struct tensor_spec){"b2", m->b2, FERRY_MLP_H2, 0, 2};
  t[6] = (struct tensor_spec){"w3", m->w3, O, FERRY_MLP_H2, 1};
  t[7] = (struct tensor_spec){"b3", m->b3, O, 0, 2};
}

/* Storage dtype of tensor t: standardisation always fp32; biases fp16 with fp16 weights. */
static enum ferry_dtype tensor_dtype(const struct tensor_spec *t, enum ferry_dtype dtype) {
  if (!t->quantizable) return FERRY_DTYPE_F32;
  if (dtype == FERRY_DTYPE_I8) return t->quantizable == 1 ? FERRY_DTYPE_I8 : FERRY_DTYPE_F32;
  return dtype;
}

static ferry_status write_tensor(ferry_store_writer *w, const struct tensor_spec *t, enum ferry_dtype dt,
                                 int scales_pass) {
  int64_t n = t->rows * (t->cols ? t->cols : 1);
  ferry_status st = FERRY_OK;
  if (scales_pass) { /* int8 row scales */
    for (int64_t r = 0; r < t->rows && st == FERRY_OK; r++) {
      float mx = 0;
      for (int64_t c = 0; c < t->cols; c++) mx = fabsf(t->data[r * t->cols + c]) > mx ? fabsf(t->data[r * t->cols + c]) : mx;
      float scale = mx / 127.0f;
      st = ferry_store_writer_write(w, &scale, sizeof scale);
    }
    return st;
  }
  for (int64_t i = 0; i < n && st == FERRY_OK; i++) {
    float v = t->data[i];
    if (dt == FERRY_DTYPE_F32) {
      st = ferry_store_writer_write(w, &v, 4);
    } else if (dt == FERRY_DTYPE_F16) {
      uint16_t h = ferry__f32_to_f16(v);
      st = ferry_store_writer_write(w, &h, 2);
    } else {
      int64_t r = i / t->cols;
      float mx = 0;
      for (int64_t c = 0; c < t->cols; c++) mx = fabsf(t->data[r * t->cols + c]) > mx ? fabsf(t->data[r * t->cols + c]) : mx;
      float q = mx > 0 ? nearbyintf(v / (mx / 127.0f)) : 0;
      int8_t b = (int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
      st = ferry_store_writer_write(w, &b, 1);
    }
  }
  return st;
}

ferry_status ferry_mlp_save(const struct ferry_mlp *m, enum ferry_dtype dtype, int32_t top_k, const char *out) {
  if (!m || !out) return ferry__fail(FERRY_ERR_INVALID, "ferry_mlp_save: NULL argument");
  if (dtype != FERRY_DTYPE_F32 && dtype != FERRY_DTYPE_F16 && dtype != FERRY_DTYPE_I8)
    return ferry__fail(FERRY_ERR_UNSUPPORTED, "%s: MLP weights in %s are not supported (fp32, fp16 or int8)", out,
                       ferry_dtype_name(dtype));
  char *dir = ferry__asprintf("%s.XXXXXX", out);
  if (!dir) return ferry__fail(FERRY_ERR_NOMEM, "%s: out of memory", out);
  if (!mkdtemp(dir)) {
    ferry_free(dir);
    return ferry__fail(FERRY_ERR_IO, "%s: cannot create a temporary folder beside it: %s", out, strerror(errno));
  }
  struct tensor_spec t[8];
  mlp_tensors(m, t);
  ferry_store_writer *w = NULL;
  ferry_status st = ferry_store_writer_create(&w, dir, 0);
  char num[32];
  if (st == FERRY_OK) st = ferry_store_writer_set_metadata(w, "ferry.predictor", ferry_predictor_kind_name(m->variant));
  if (st == FERRY_OK) st = ferry_store_writer_set_metadata(w, "ferry.dtype", ferry_dtype_name(dtype));
  snprintf(num, sizeof num, "%d", m->n_layers);
  if (st == FERRY_OK) st = ferry_store_writer_set_metadata(w, "ferry.n_layers", num);
  snprintf(num, sizeof num, "%d", m->n_experts);
  if (st == FERRY_OK) st = ferry_store_writer_set_metadata(w, "ferry.n_experts", num);
  snprintf(num, sizeof num, "%d", top_k);
  if (st == FERRY_OK) st = ferry_store_writer_set_metadata(w, "ferry.top_k", num);
  for (int i = 0; i < 8 && st == FERRY_OK; i++) {
    enum ferry_dtype dt = tensor_dtype(&t[i], dtype);
    int64_t shape[2] = {t[i].rows, t[i].cols};
    st = ferry_store_writer_add(w, t[i].name, dt, t[i].cols ? 2 : 1, shape);
    if (st == FERRY_OK && dt == FERRY_DTYPE_I8) {
      char name[32];
      snprintf(name, sizeof name, "%s_scale", t[i].name);
      st = ferry_store_writer_add(w, name, FERRY_DTYPE_F32, 1, shape);
    }
  }
  for (int i = 0; i < 8 && st == FERRY_OK; i++) {
    enum ferry_dtype dt = tensor_dtype(&t[i], dtype);
    st = write_tensor(w, &t[i], dt, 0);
    if (st == FERRY_OK && dt == FERRY_DTYPE_I8) st = write_tensor(w, &t[i], dt, 1);
  }
  if (st == FERRY_OK) st = ferry_store_writer_finish(w);
  if (st != FERRY_OK) {
    st = ferry__fail(st, "%s: %s", out, w ? ferry_store_writer_errmsg(w) : ferry_last_error());
  } else {
    char *file = ferry__asprintf("%s/model.safetensors", dir);
    if (!file || rename(file, out) != 0)
      st = ferry__fail(FERRY_ERR_IO, "%s: cannot move the written file into place: %s", out, strerror(errno));
    ferry_free(file);
  }
  ferry_store_writer_free(w);
  char *f = ferry__asprintf("%s/model.safetensors", dir);
  if (f) unlink(f);
  ferry_free(f);
  rmdir(dir);
  ferry_free(dir);
  return st;
}

static int meta_int(ferry_store *s, const char *key, int64_t *out) {
  const char *v = ferry_store_metadata(s, key);
  return v && ferry__parse_i64(v, out) == FERRY_OK ? 0 : -1;
}

ferry_status ferry_mlp_load(const char *path, enum ferry_predictor_kind variant_kind, int32_t n_layers, int32_t n_experts,
                            struct ferry_mlp *m, enum ferry_dtype *file_dtype) {
  if (!path || !m) return ferry__fail(FERRY_ERR_INVALID, "ferry_mlp_load: NULL argument");
  memset(m, 0, sizeof *m);
  enum ferry_dtype dtype_unused;
  if (!file_dtype) file_dtype = &dtype_unused;
  ferry_store *s;
  ferry_status st = ferry_store_open(&s, path);
  if (st != FERRY_OK) return st;
  const enum ferry_predictor_kind want = variant_kind;
  const char *variant = ferry_store_metadata(s, "ferry.predictor");
  int64_t L = 0, E = 0;
  float *buf = NULL;
  if (!variant || strcmp(variant, ferry_predictor_kind_name(want)) || meta_int(s, "ferry.n_layers", &L) ||
      meta_int(s, "ferry.n_experts", &E)) {
    st = ferry__fail(FERRY_ERR_FORMAT, "%s: not a %s predictor (metadata ferry.predictor is %s)", path,
                     ferry_predictor_kind_name(want), variant ? variant : "absent");
    goto out_close;
  }
  if (L != n_layers || E > n_experts) {
    st = ferry__fail(FERRY_ERR_FORMAT, "%s: trained for %" PRId64 " layers x %" PRId64 " experts, expected %d x %d", path,
                     L, E, n_layers, n_experts);
    goto out_close;
  }
  if ((st = ferry_mlp_init(m, want, (int32_t)L, (int32_t)E, 0)) != FERRY_OK) goto out_close;
  const char *dts = ferry_store_metadata(s, "ferry.dtype");
  struct tensor_spec t[8];
  mlp_tensors(m, t);
  for (int i = 0; i < 8; i++) {
    const struct ferry_store_tensor *ti = ferry_store_find(s, t[i].name);
    int64_t n = t[i].rows * (t[i].cols ? t[i].cols : 1);
    int ndim = t[i].cols ? 2 : 1;
    if (!ti || ti->ndim != ndim || ti->shape[0] != t[i].rows || (ndim == 2 && ti->shape[1] != t[i].cols) ||
        (ti->dtype != FERRY_DTYPE_F32 && ti->dtype != FERRY_DTYPE_F16 && ti->dtype != FERRY_DTYPE_I8) ||
        ti->nbytes != (uint64_t)n * ferry_dtype_size(ti->dtype)) {
      st = ferry__fail(FERRY_ERR_FORMAT, "%s: tensor %s missing or not %s[%" PRId64 "%s] in fp32, fp16 or int8", path,
                       t[i].name, "float", t[i].rows, ndim == 2 ? ", ..." : "");
      goto out_free;
    }
    if (i == 2) {
      /* the weights' storage type is w1's; metadata that says otherwise (or names no type the
       * writer stores) is refused rather than reported */
      enum ferry_dtype said;
      *file_dtype = ti->dtype;
      if (dts && (ferry_dtype_parse(dts, &said) != FERRY_OK || said != ti->dtype)) {
        st = ferry__fail(FERRY_ERR_FORMAT, "%s: metadata ferry.dtype is %s but the weights (w1) are stored as %s", path,
                         dts, ferry_dtype_name(ti->dtype));
        goto out_free;
      }
    }
    buf = ferry__realloc(buf, (size_t)ti->nbytes + 4);
    if (!buf || (st = ferry_store_read_tensor(s, ti, buf, ti->nbytes + 4)) != FERRY_OK) {
      st = ferry__fail(buf ? st : FERRY_ERR_NOMEM, "%s: %s", path, buf ? ferry_store_errmsg(s) : "out of memory");
      goto out_free;
    }
    if (ti->dtype == FERRY_DTYPE_F32) {
      memcpy(t[i].data, buf, (size_t)n * 4);
    } else if (ti->dtype == FERRY_DTYPE_F16) {
      ferry__f16_to_f32_n((const uint16_t *)buf, t[i].data, (size_t)n);
    } else {
      char name[32];
      snprintf(name, sizeof name, "%s_scale", t[i].name);
      const struct ferry_store_tensor *sc = ferry_store_find(s, name);
      if (ndim != 2 || !sc || sc->dtype != FERRY_DTYPE_F32 || sc->ndim != 1 || sc->shape[0] != t[i].rows) {
        st = ferry__fail(FERRY_ERR_FORMAT, "%s: int8 tensor %s needs an fp32 %s[%" PRId64 "]", path, t[i].name, name,
                         t[i].rows);
        goto out_free;
      }
      float *scales = ferry__calloc((size_t)t[i].rows, sizeof *scales);
      if (!scales || (st = ferry_store_read_tensor(s, sc, scales, sc->nbytes)) != FERRY_OK) {
        st = ferry__fail(scales ? st : FERRY_ERR_NOMEM, "%s: %s", path, scales ? ferry_store_errmsg(s) : "out of memory");
        ferry_free(scales);
        goto out_free;
      }
      const int8_t *q = (const int8_t *)buf;
      for (int64_t j = 0; j < n; j++) t[i].data[j] = (float)q[j] * scales[j / t[i].cols];
      ferry_free(scales);
    }
  }
  st = FERRY_OK;
out_free:
  ferry_free(buf);
  if (st != FERRY_OK) ferry_mlp_free(m);
out_close:
  ferry_store_close(s);
  return st;
}

