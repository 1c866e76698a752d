/* Quantizing a model folder: read each weight (any float dtype), pack 2-D weights in the plan's
 * format for their class, keep norms and biases as they are, and write parts and metadata with
 * the safetensors writer, tensors in the model's file order so layers and experts stay
 * contiguous. The reading and writing goes through the store module (a departure from the
 * module table, which has quant use only model: quantizing is a file-to-file operation). */
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/fsutil.h"
#include "common/half.h"
#include "common/json.h"
#include "ferry/model.h"
#include "ferry/quantize.h"
#include "ferry/store.h"

static ferry_status read_f32(ferry_store *s, const struct ferry_store_tensor *t, void *raw, float *out, uint64_t n) {
  ferry_status st = ferry_store_read_tensor(s, t, raw, t->nbytes);
  if (st != FERRY_OK) return ferry__fail(st, "%s", ferry_store_errmsg(s));
  switch (t->dtype) {
    case FERRY_DTYPE_F32: memcpy(out, raw, n * 4); break;
    case FERRY_DTYPE_F16: ferry__f16_to_f32_n(raw, out, n); break;
    case FERRY_DTYPE_BF16: ferry__bf16_to_f32_n(raw, out, n); break;
    default:
      return ferry__fail(FERRY_ERR_UNSUPPORTED, "%s: tensor %s has dtype %s (expected F32, F16 or BF16)",
                         ferry_store_file_path(s, t->file), t->name, ferry_dtype_st_name(t->dtype));
  }
  return FERRY_OK;
}

/* Name prefix of a weight ("a.b.weight" -> "a.b"). */
static void prefix_of(const char *name, char *out, size_t size) {
  size_t n = strlen(name);
  if (n > 7 && !strcmp(name + n - 7, ".weight")) n -= 7;
  if (n >= size) n = size - 1;
  memcpy(out, name, n);
  out[n] = '\0';
}

ferry_status ferry_model_quantize(const char *in_dir, const char *out_dir, const struct ferry_qplan *plan,
                                  FILE *progress, struct ferry_quantize_report *report) {
  ferry_model *m = NULL;
  ferry_store *in = NULL;
  ferry_store_writer *w = NULL;
  struct ferry_quantize_report rep;
  memset(&rep, 0, sizeof rep);
  char *tmp = NULL, *cfg_in = NULL, *cfg_out = NULL, *cfg_text = NULL, *meta = NULL;
  void *raw = NULL, *blob = NULL;
  float *f = NULL, *back = NULL;
  struct ferry_qspec *specs = NULL;
  cJSON *map = NULL;
  ferry_status st;
  if ((st = ferry_model_open(&m, in_dir)) || (st = ferry_store_open(&in, in_dir))) goto out;
  /* A fused [experts, ...] checkpoint tensor (gpt-oss, Llama 4) is one tensor in the file and
   * one slice per expert in the model: the writer would declare it once per expert. */
  for (size_t i = 0; i < ferry_model_tensor_count(m); i++) {
    const struct ferry_tensor_desc *t = ferry_model_tensor(m, i);
    if (t->slice < 0) continue;
    st = ferry__fail(FERRY_ERR_UNSUPPORTED,
                     "%s: %s holds every expert's weights in one tensor ([%d experts, ...]); quantizing fused "
                     "expert tensors is not supported (models with a tensor per expert are)",
                     in_dir, t->name, (int)t->n_slices);
    goto out;
  }
  if (ferry__is_dir(out_dir) && rmdir(out_dir) != 0) {
    st = ferry__fail(FERRY_ERR_EXISTS, "%s: exists and is not empty", out_dir);
    goto out;
  }
  tmp = ferry__asprintf("%s.ferry-tmp-%ld", out_dir, (long)getpid());
  if (!tmp) goto nomem;
  ferry__rm_rf(tmp);
  if ((st = ferry__mkdir_p(tmp, NULL))) goto out;
  const size_t n = ferry_model_tensor_count(m);
  specs = ferry__calloc(n, sizeof *specs);
  ferry__json_init();
  map = cJSON_CreateObject();
  if (!specs || !map) goto nomem;
  uint64_t largest = 0, largest_blob = 0;
  /* decide every tensor's format first: the writer wants all tensors declared up front */
  if ((st = ferry_store_writer_create(&w, tmp, 2ull << 30))) goto out;
  for (size_t i = 0; i < n; i++) {
    const struct ferry_tensor_desc *t = ferry_model_tensor(m, i);
    const struct ferry_store_tensor *s = ferry_store_find(in, t->name);
    if (!s) {
      st = ferry__fail(FERRY_ERR_FORMAT, "%s: tensor %s is missing", in_dir, t->name);
      goto out;
    }
    if (s->nbytes > largest) largest = s->nbytes;
    enum ferry_qclass cls = ferry_quant_class_of_role(t->role);
    struct ferry_qspec spec = plan->spec[cls];
    int quantized = t->ndim == 2 && spec.format != FERRY_QFORMAT_FP32 && spec.format != FERRY_QFORMAT_FP16 &&
                    spec.format != FERRY_QFORMAT_BF16;
    specs[i] = spec;
    if (!quantized) {
      enum ferry_dtype dt = spec.format == FERRY_QFORMAT_FP16   ? FERRY_DTYPE_F16
                            : spec.format == FERRY_QFORMAT_BF16 ? FERRY_DTYPE_BF16
                                                                : FERRY_DTYPE_F32;
      if (t->ndim != 2) dt = s->dtype; /* norms and biases keep their dtype */
      specs[i].format = dt == FERRY_DTYPE_F16 ? FERRY_QFORMAT_FP16 : dt == FERRY_DTYPE_BF16 ? FERRY_QFORMAT_BF16 : FERRY_QFORMAT_FP32;
      specs[i].group_size = 0;
      if ((st = ferry_store_writer_add(w, t->name, dt, t->ndim, t->shape))) goto out_writer;
      continue;
    }
    struct ferry_qlayout lay;
    if ((st = ferry_quant_layout(&spec, t->shape[0], t->shape[1], &lay))) goto out;
    if (lay.blob_bytes > largest_blob) largest_blob = lay.blob_bytes;
    char prefix[96], name[128], spec_name[32];
    prefix_of(t->name, prefix, sizeof prefix);
    for (int p = 0; p < FERRY_QPART_COUNT; p++) {
      if (!lay.part[p].suffix) continue;
      snprintf(name, sizeof name, "%s.%s", prefix, lay.part[p].suffix);
      if ((st = ferry_store_writer_add(w, name, lay.part[p].dtype, lay.part[p].ndim, lay.part[p].shape))) goto out_writer;
    }
    ferry_quant_spec_name(&spec, spec_name, sizeof spec_name);
    if (!cJSON_AddStringToObject(map, t->name, spec_name)) goto nomem;
  }
  char plan_text[256];
  meta = cJSON_PrintUnformatted(map);
  if (!meta) goto nomem;
  if ((st = ferry_store_writer_set_metadata(w, "format", "pt")) ||
      (st = ferry_store_writer_set_metadata(w, "ferry.quant", meta)) ||
      (st = ferry_store_writer_set_metadata(w, "ferry.quant.plan", ferry_quant_plan_format(plan, plan_text, sizeof plan_text))))
    goto out_writer;
  raw = ferry_malloc(largest ? largest : 1);
  f = ferry_malloc((largest / 2 + 1) * sizeof(float));
  back = ferry_malloc((largest / 2 + 1) * sizeof(float));
  blob = ferry__aligned_alloc(64, largest_blob ? largest_blob : 64);
  if (!raw || !f || !back || !blob) goto nomem;
  for (size_t i = 0; i < n; i++) {
    const struct ferry_tensor_desc *t = ferry_model_tensor(m, i);
    const struct ferry_store_tensor *s = ferry_store_find(in, t->name);
    const uint64_t numel = t->numel;
    enum ferry_qclass cls = ferry_quant_class_of_role(t->role);
    struct ferry_quantize_class_report *cr = &rep.cls[cls];
    if ((st = read_f32(in, s, raw, f, numel))) goto out_writer;
    cr->tensors++;
    cr->bytes_before += s->nbytes;
    rep.bytes_before += s->nbytes;
    const struct ferry_qspec *spec = &specs[i];
    if (spec->format == FERRY_QFORMAT_FP32 || spec->format == FERRY_QFORMAT_FP16 || spec->format == FERRY_QFORMAT_BF16) {
      size_t es = spec->format == FERRY_QFORMAT_FP32 ? 4 : 2;
      const void *out_bytes = f;
      if (spec->format == FERRY_QFORMAT_FP16)
        for (uint64_t j = 0; j < numel; j++) ((uint16_t *)raw)[j] = ferry__f32_to_f16(f[j]);
      else if (spec->format == FERRY_QFORMAT_BF16)
        for (uint64_t j = 0; j < numel; j++) ((uint16_t *)raw)[j] = ferry__f32_to_bf16(f[j]);
      if (es == 2) out_bytes = raw;
      if ((st = ferry_store_writer_write(w, out_bytes, numel * es))) goto out_writer;
      cr->bytes_after += numel * es;
      rep.bytes_after += numel * es;
      continue;
    }
    struct ferry_qlayout lay;
    ferry_quant_layout(spec, t->shape[0], t->shape[1], &lay);
    struct ferry_qout qo;
    ferry_quant_out_blob(&lay, blob, &qo);
    if ((st = ferry_quant_quantize(spec, f, t->shape[0], t->shape[1], &qo))) {
      st = ferry__fail(st, "%s: %s", t->name, ferry_last_error());
      goto out_writer;
    }
    struct ferry_qview qv;
    ferry_quant_view_blob(&lay, blob, &qv);
    if ((st = ferry_quant_dequantize_rows(spec, &qv, t->shape[0], t->shape[1], 0, t->shape[0], back))) goto out_writer;
    double err = ferry_quant_error(f, back, numel);
    if (err > cr->max_rel_error) cr->max_rel_error = err;
    cr->mean_rel_error += err;
    for (int p = 0; p < FERRY_QPART_COUNT; p++) {
      if (!lay.part[p].suffix) continue;
      if ((st = ferry_store_writer_write(w, (const char *)blob + lay.part[p].offset, lay.part[p].bytes))) goto out_writer;
    }
    cr->bytes_after += lay.total_bytes;
    rep.bytes_after += lay.total_bytes;
    if (progress && t->expert <= 0 && t->role != FERRY_ROLE_EXPERT_UP && t->role != FERRY_ROLE_EXPERT_DOWN)
      fprintf(progress, "\rferry: quantized %zu of %zu tensors", i + 1, n);
  }
  if (progress) fputc('\n', progress);
  for (int c = 0; c < FERRY_QCLASS_COUNT; c++)
    if (rep.cls[c].tensors) rep.cls[c].mean_rel_error /= (double)rep.cls[c].tensors;
  if ((st = ferry_store_writer_finish(w))) goto out_writer;
  cfg_in = ferry__path_join(in_dir, "config.json");
  cfg_out = ferry__path_join(tmp, "config.json");
  if (!cfg_in || !cfg_out) goto nomem;
  size_t len = 0;
  if ((st = ferry__read_file(cfg_in, 1u << 20, &cfg_text, &len, NULL)) ||
      (st = ferry__write_file_atomic(cfg_out, cfg_text, len, NULL)))
    goto out_writer;
  if (rename(tmp, out_dir) != 0) {
    st = ferry__fail(FERRY_ERR_IO, "%s: cannot move the quantized model into place", out_dir);
    goto out_writer;
  }
  if (report) *report = rep;
  goto out_writer;
nomem:
  st = ferry__fail(FERRY_ERR_NOMEM, "quantize: out of memory");
out_writer:
out:
  ferry_store_writer_free(w);
  if (st != FERRY_OK && tmp) ferry__rm_rf(tmp);
  cJSON_Delete(map);
  ferry_free(meta);
  ferry_free(specs);
  ferry_free(raw);
  ferry_free(f);
  ferry_free(back);
  ferry_free(blob);
  ferry_free(cfg_in);
  ferry_free(cfg_out);
  ferry_free(cfg_text);
  ferry_free(tmp);
  ferry_store_close(in);
  ferry_model_close(m);
  return st;
}
