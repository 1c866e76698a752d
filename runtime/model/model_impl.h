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
#define FERRY__MODEL_MAX_TENSORS (1 << 18) /* DeepSeek-V3 needs ~47k */

struct ferry_model {
  struct ferry_model_config cfg;
  struct ferry_tensor_desc *tensors; /* file order */
  size_t n_tensors;
  size_t *by_name;                   /* tensor indices sorted by name, for bsearch */
  size_t *layer_first;               /* per layer: first tensor of the dense part */
  size_t *layer_count;               /* per layer: tensors in the dense part */
  size_t *expert_first;              /* per layer * n_experts: first tensor of the expert */
  size_t expert_tensors;             /* tensors per routed expert (3) */
  struct ferry_model_accounting acc;
  double matmul_params_active;
};

/* Check a configuration; on failure writes a sentence (no file prefix) into msg and returns
 * non-zero. Shared by ferry_model_create (FERRY_ERR_INVALID) and the config.json reader
 * (FERRY_ERR_FORMAT, prefixed with the file). */
int ferry__model_config_check(const struct ferry_model_config *cfg, char *msg, size_t msg_len);

/* Preset lookup: the configuration of the preset called name, or NULL. Borrowed. */
const struct ferry_model_config *ferry__model_preset_find(const char *name);

/* Read a Hugging Face config.json into cfg. Errors name path and field. */
ferry_status ferry__model_read_hf_config(const char *path, struct ferry_model_config *cfg);

/* The KV format a model of this dtype uses by default (kv_format.c). */
enum ferry_kv_format ferry__kv_format_default(enum ferry_dtype model_dtype);

#endif /* FERRY_MODEL_IMPL_H */
