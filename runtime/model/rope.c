/* RoPE of each layer and its frequencies, written from transformers' rope initialisation
 * functions (default, linear, dynamic NTK, YaRN, Llama 3, LongRoPE), so every executor rotates
 * with the numbers the checkpoint was trained with; and the attention softmax scale. */
#include <math.h>
#include <string.h>

#include "runtime/model/model_impl.h"

ferry_status ferry_model_layer_rope(const ferry_model *model, int64_t layer, struct ferry_rope_params *out) {
  if (!model || !out) return FERRY_ERR_INVALID;
  const struct ferry_model_config *c = &model->cfg;
  if (layer < 0 || layer >= c->n_layers)
    return ferry__fail(FERRY_ERR_RANGE, "model %s: layer %lld out of range", c->name, (long long)layer);
  if (!ferry__layer_rope(c, layer)) return FERRY_ERR_NOT_FOUND;
  memset(out, 0, sizeof *out);
  out->theta = c->rope_theta;
  out->dim = c->kv_lora_rank ? c->qk_rope_dim : c->rotary_dim ? c->rotary_dim : c->head_dim;
  out->interleaved = c->rope_interleaved;
  out->max_position = c->max_position;
  out->scaling = c->rope_scaling;
  /* Gemma 3's windowed layers rotate with their own base and without the global scaling. */
  if (c->family == FERRY_FAMILY_GEMMA3 && ferry__layer_window(c, layer) > 0) {
    if (c->rope_local_theta > 0) out->theta = c->rope_local_theta;
    memset(&out->scaling, 0, sizeof out->scaling);
  }
  return FERRY_OK;
}

static double yarn_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

static double correction_dim(double rotations, double dim, double base, double max_pos) {
  return dim * log(max_pos / (rotations * 2 * M_PI)) / (2 * log(base));
}

void ferry_rope_inv_freq(const struct ferry_rope_params *rope, int64_t seq_len, double *inv_freq, double *attn_factor) {
  const struct ferry_rope_scaling *s = &rope->scaling;
  const int64_t dim = rope->dim, half = dim / 2;
  double base = rope->theta, factor = s->factor > 0 ? s->factor : 1.0;
  *attn_factor = 1.0;
  if (s->type == FERRY_ROPE_DYNAMIC) {
    const double max_pos = (double)(s->original_max_position ? s->original_max_position : rope->max_position);
    const double len = (double)seq_len > max_pos ? (double)seq_len : max_pos;
    base = base * pow(factor * len / max_pos - (factor - 1), (double)dim / (double)(dim - 2));
  }
  for (int64_t i = 0; i < half; i++) inv_freq[i] = 1.0 / pow(base, (double)(2 * i) / (double)dim);
  switch (s->type) {
    case FERRY_ROPE_DEFAULT:
    case FERRY_ROPE_DYNAMIC: break;
    case FERRY_ROPE_LINEAR:
      for (int64_t i = 0; i < half; i++) inv_freq[i] /= factor;
      break;
    case FERRY_ROPE_LLAMA3: {
      const double old = (double)s->original_max_position;
      const double low_wl = old / s->low_freq_factor, high_wl = old / s->high_freq_factor;
      for (int64_t i = 0; i < half; i++) {
        const double wl = 2 * M_PI / inv_freq[i];
        if (wl > low_wl) {
          inv_freq[i] /= factor;
        } else if (wl >= high_wl && s->high_freq_factor > s->low_freq_factor) {
          /* medium frequencies: smooth between interpolation and the original */
          const double smooth = (old / wl - s->low_freq_factor) / (s->high_freq_factor - s->low_freq_factor);
          inv_freq[i] = (1 - smooth) * inv_freq[i] / factor + smooth * inv_freq[i];
        }
      }
      break;
    }
    case FERRY_ROPE_YARN: {
      /* transformers: with original_max_position_embeddings the factor is the context ratio */
      double orig = (double)rope->max_position;
      if (s->original_max_position) {
        orig = (double)s->original_max_position;
        factor = (double)rope->max_position / orig;
      }
      if (s->attention_factor > 0)
        *attn_factor = s->attention_factor;
      else if (s->mscale > 0 && s->mscale_all_dim > 0)
        *attn_factor = yarn_mscale(factor, s->mscale) / yarn_mscale(factor, s->mscale_all_dim);
      else
        *attn_factor = yarn_mscale(factor, 1.0);
      const double bf = s->beta_fast > 0 ? s->beta_fast : 32, bs = s->beta_slow > 0 ? s->beta_slow : 1;
      double low = correction_dim(bf, (double)dim, rope->theta, orig);
      double high = correction_dim(bs, (double)dim, rope->theta, orig);
      if (!s->no_truncate) {
        low = floor(low);
        high = ceil(high);
      }
      if (low < 0) low = 0;
      if (high > (double)(dim - 1)) high = (double)(dim - 1);
      if (low == high) high += 0.001;
      for (int64_t i = 0; i < half; i++) {
        const double pos_freq = pow(rope->theta, (double)(2 * i) / (double)dim);
        const double extra = 1.0 / pos_freq, inter = 1.0 / (factor * pos_freq);
        double ramp = ((double)i - low) / (high - low);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        const double extra_factor = 1 - ramp;
        inv_freq[i] = inter * (1 - extra_factor) + extra * extra_factor;
      }
      break;
    }
    case FERRY_ROPE_LONGROPE: {
      double orig = (double)rope->max_position;
      if (s->original_max_position) {
        orig = (double)s->original_max_position;
        factor = (double)rope->max_position / orig;
      }
      const int longer = (double)seq_len > orig;
      const float *f = longer ? s->long_factor : s->short_factor;
      for (int64_t i = 0; i < half && i < s->n_factors; i++) inv_freq[i] /= (double)f[i];
      const double m = longer ? s->long_mscale : s->short_mscale;
      if (m > 0)
        *attn_factor = m;
      else if (s->attention_factor > 0)
        *attn_factor = s->attention_factor;
      else
        *attn_factor = factor <= 1 ? 1.0 : sqrt(1 + log(factor) / log(orig));
      break;
    }
  }
}

double ferry_model_attn_scale(const ferry_model *model) {
  if (!model) return 0;
  const struct ferry_model_config *c = &model->cfg;
  double scale = 1.0 / sqrt(c->query_pre_attn_scalar > 0 ? c->query_pre_attn_scalar : (double)c->head_dim);
  const struct ferry_rope_scaling *s = &c->rope_scaling;
  if (c->kv_lora_rank && s->type == FERRY_ROPE_YARN && s->mscale_all_dim > 0) {
    /* DeepSeek: the softmax scale follows yarn's attention temperature over all dims */
    const double m = yarn_mscale(s->factor, s->mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}
