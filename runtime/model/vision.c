/* Parameter count of the vision towers that ship inside multimodal checkpoints (Gemma 3's
 * SigLIP, Llama 4's encoder), written from their transformers modules, so a model's total
 * matches its publisher's figure even though ferry runs only the text decoder. */
#include <stdio.h>

#include "runtime/model/model_impl.h"

uint64_t ferry__vision_params(const struct ferry_vision_config *v, int64_t text_hidden) {
  if (v->kind == FERRY_VISION_NONE) return 0;
  const uint64_t h = (uint64_t)v->hidden, i = (uint64_t)v->intermediate, p = (uint64_t)v->patch;
  const uint64_t side = v->patch ? (uint64_t)(v->image / v->patch) : 0, ch = (uint64_t)v->channels;
  /* an encoder layer: q, k, v, o with biases, fc1/fc2 with biases, two LayerNorms */
  const uint64_t layer = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 4 * h;
  uint64_t n = (uint64_t)v->layers * layer;
  if (v->kind == FERRY_VISION_SIGLIP) {
    n += ch * p * p * h + h;     /* patch embedding (conv with bias) */
    n += side * side * h;        /* position embedding */
    n += 2 * h;                  /* post LayerNorm */
    n += h * (uint64_t)text_hidden + h; /* mm_input_projection_weight, mm_soft_emb_norm */
  } else {
    n += ch * p * p * h;         /* unfold convolution (no bias) */
    n += h + (side * side + 1) * h; /* class embedding, positional embedding */
    n += 4 * h;                  /* LayerNorms pre and post */
    n += i * (uint64_t)v->projector_in + (uint64_t)v->projector_out * (uint64_t)v->projector_out; /* adapter MLP */
    n += (uint64_t)v->output_dim * (uint64_t)text_hidden; /* multi_modal_projector */
  }
  return n;
}

int ferry__vision_check(const struct ferry_vision_config *v, char *msg, size_t msg_len) {
  if (v->kind == FERRY_VISION_NONE) return 0;
  const int64_t f[] = {v->hidden, v->intermediate, v->layers, v->heads, v->patch, v->image, v->channels};
  for (size_t k = 0; k < sizeof f / sizeof f[0]; k++)
    if (f[k] < 1 || f[k] > (1 << 20)) {
      snprintf(msg, msg_len, "vision tower field %zu = %lld out of range", k, (long long)f[k]);
      return 1;
    }
  if (v->kind != FERRY_VISION_SIGLIP && v->kind != FERRY_VISION_LLAMA4) {
    snprintf(msg, msg_len, "vision.kind = %d is unknown", (int)v->kind);
    return 1;
  }
  if (v->kind == FERRY_VISION_LLAMA4 && (v->output_dim < 1 || v->projector_in < 1 || v->projector_out < 1 ||
                                         v->output_dim > (1 << 20) || v->projector_in > (1 << 20) ||
                                         v->projector_out > (1 << 20))) {
    snprintf(msg, msg_len, "Llama 4 vision projector dimensions out of range");
    return 1;
  }
  return 0;
}
