/* Shared by the Hugging Face config.json reader files: the reader state and the typed field
 * accessors that name the file and field in their errors and apply transformers' defaults. */
#ifndef FERRY_MODEL_HF_IMPL_H
#define FERRY_MODEL_HF_IMPL_H

#include "common/json.h"
#include "runtime/model/model_impl.h"

struct reader {
  const char *what;   /* file name for messages */
  const cJSON *root;  /* the text model's object: the file, or its "text_config" */
  const cJSON *top;   /* the file's object (dtype, quantization live there in multimodal files) */
};

/* Integer field with a default (absent or null) and a range; required fields have no default. */
ferry_status ferry__hf_int(const struct reader *r, const char *key, int required, int64_t def, int64_t lo, int64_t hi,
                           int64_t *out);
/* Integer field where null means 0 and absence means def. */
ferry_status ferry__hf_int_or_null(const struct reader *r, const char *key, int64_t def, int64_t hi, int64_t *out);
/* Positive number with a default. */
ferry_status ferry__hf_positive(const struct reader *r, const char *key, double def, double *out);
/* Number >= 0 where null means 0 and absence means def. */
ferry_status ferry__hf_num_or_null(const struct reader *r, const char *key, double def, double *out);
ferry_status ferry__hf_bool(const struct reader *r, const char *key, int def, int *out);
ferry_status ferry__hf_str(const struct reader *r, const char *key, const char *def, const char **out);
/* FERRY_ERR_UNSUPPORTED naming the file, field and why. */
ferry_status ferry__hf_unsupported(const struct reader *r, const char *field, const char *detail);

/* rope_theta and rope scaling from rope_scaling / rope_parameters (hf_rope.c). `layer_type`
 * picks the entry of a per-layer-type rope_parameters ("full_attention", ...), NULL for the
 * flat forms. theta_def applies when no rope_theta is given anywhere. */
ferry_status ferry__hf_read_rope(const struct reader *r, const char *layer_type, double theta_def, double *theta,
                                 struct ferry_rope_scaling *out);
/* quantization_config (hf_rope.c). */
ferry_status ferry__hf_read_quant(const struct reader *r, struct ferry_model_config *c);
/* The family-specific fields (hf_families.c). */
ferry_status ferry__hf_read_family(const struct reader *r, struct ferry_model_config *c);
/* Parameters of a multimodal checkpoint's vision tower and projector from its vision_config. */
ferry_status ferry__hf_vision_params(const struct reader *r, const cJSON *vision, enum ferry_family f,
                                     int64_t text_hidden, int64_t *out);
/* Parse a whole config.json object (or its text part) into c. file names the model when the
 * config has no _name_or_path. */
ferry_status ferry__hf_read_root(const struct reader *r, const char *file, struct ferry_model_config *c);

#define TRY(expr)                             \
  do {                                        \
    ferry_status st_ = (expr);                \
    if (st_ != FERRY_OK) return st_;          \
  } while (0)

#endif /* FERRY_MODEL_HF_IMPL_H */
