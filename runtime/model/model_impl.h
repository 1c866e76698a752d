/* Internal pieces of the model module shared by its files: the handle's layout, the preset
 * table lookup and the Hugging Face config.json reader. Not part of the public API. */
#ifndef FERRY_MODEL_IMPL_H
#define FERRY_MODEL_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "ferry/model.h"

/* Upper bounds a configuration must respect; they keep every product in the layout and the
 * accounting far from uint64 overflow and the tensor list a sane size. */
#define FERRY__MODEL_MAX_LAYERS 4096
#define FERRY__MODEL_MAX_DIM (1 << 20)      /* hidden, intermediate, head_dim x heads */
#define FERRY__MODEL_MAX_HEADS 4096
#define FERRY__MODEL_MAX_VOCAB (1 << 24)
#define FERRY__MODEL_MAX_POSITION (1 << 26)
#define FERRY__MODEL_MAX_EXPERTS 4096
#define FERRY__MODEL_MAX_TENSORS (1 << 18) /* DeepSeek-V3 needs ~45k */

/* Tensor naming schemes. */
enum ferry__names {
  FERRY__NAMES_LLAMA, /* model.layers.N.self_attn.q_proj ... (and every family shaped like it) */
  FERRY__NAMES_OPT,   /* model.decoder.layers.N ... */
  FERRY__NAMES_NEOX,  /* gpt_neox.layers.N.attention.query_key_value ... */
  FERRY__NAMES_BLOOM, /* h.N.self_attention.query_key_value ... */
  FERRY__NAMES_GPTJ   /* transformer.h.N.attn.q_proj ... */
};

struct ferry_family_traits {
  const char *model_type;   /* Hugging Face model_type */
  const char *architecture; /* architectures[0] of its config.json */
  enum ferry__names names;
  int moe;                  /* has routed experts */
};

/* The family's row (NULL for an unknown value), the number of families, and their names as
 * one comma-separated list for messages. */
const struct ferry_family_traits *ferry__family(enum ferry_family f);
int ferry__family_count(void);
void ferry__family_list(char *buf, size_t len);

/* Whether layer l of a configuration has routed experts. */
int ferry__layer_is_moe(const struct ferry_model_config *c, int64_t l);
/* Whether layer l is windowed (sliding) / chunked / rotated. */
int64_t ferry__layer_window(const struct ferry_model_config *c, int64_t l);
int64_t ferry__layer_chunk(const struct ferry_model_config *c, int64_t l);
int ferry__layer_rope(const struct ferry_model_config *c, int64_t l);
/* Bytes of an [rows, cols] weight in the checkpoint's quantized format. */
uint64_t ferry__quant_bytes(const struct ferry_ckpt_quant_config *q, int64_t rows, int64_t cols);

/* Upper bound on the tensors of a configuration's layout. */
size_t ferry__model_tensor_cap(const struct ferry_model_config *c);
/* Parameters of a vision tower and its projector into a text model of `text_hidden`, and a
 * range check of its fields (message into msg, non-zero on failure). */
uint64_t ferry__vision_params(const struct ferry_vision_config *v, int64_t text_hidden);
int ferry__vision_check(const struct ferry_vision_config *v, char *msg, size_t msg_len);
/* Builds the tensor layout of m->cfg into m (layout.c). */
ferry_status ferry__model_build_layout(ferry_model *m);

struct ferry_model {
  struct ferry_model_config cfg;
  struct ferry_tensor_desc *tensors; /* file order */
  size_t n_tensors;
  size_t *by_name;                   /* tensor indices sorted by name, for bsearch */
  size_t *layer_first;               /* per layer: first tensor of the dense part */
  size_t *layer_count;               /* per layer: tensors in the dense part */
  size_t *expert_first;              /* per layer * n_experts: first tensor of the expert */
  size_t expert_tensors;             /* tensors per routed expert */
  uint64_t *layer_all, *layer_dense; /* per layer: parameters with all experts / dense part */
  struct ferry_model_accounting acc;
  double matmul_params_active;
};

/* Check a configuration; on failure writes a sentence (no file prefix) into msg and returns
 * non-zero. Shared by ferry_model_create (FERRY_ERR_INVALID) and the config.json reader
 * (FERRY_ERR_FORMAT, prefixed with the file). */
int ferry__model_config_check(const struct ferry_model_config *cfg, char *msg, size_t msg_len);

/* Preset lookup by catalogue name or Hugging Face id, ignoring case: the configuration, or
 * NULL. Borrowed. */
const struct ferry_model_config *ferry__model_preset_find(const char *name);

/* Read a Hugging Face config.json into cfg. Errors name path and field. */
ferry_status ferry__model_read_hf_config(const char *path, struct ferry_model_config *cfg);

/* The KV format a model of this dtype uses by default (kv_format.c). */
enum ferry_kv_format ferry__kv_format_default(enum ferry_dtype model_dtype);

#endif /* FERRY_MODEL_IMPL_H */
