/* Per-token predictor features computed from the real activations (mlp3 / mlp7 of
 * ferry/predict.h): each token's embedding is read back right after the embedding op, its
 * hidden state entering the first MoE layer with that layer's routing, and the host turns them
 * into the variant's feature vector. Every executor issues the same copies (the simulator
 * costs them); only an executor that computes has values to turn into features. */
#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "engine_impl.h"
#include "ferry/predict.h"

#define TRY(call)                                                                             \
  do {                                                                                        \
    ferry_status st_ = (call);                                                                \
    if (st_ != FERRY_OK) return ferry__err_set(&e->err, st_, "%s", ferry_exec_errmsg(e->ex)); \
  } while (0)

/* Embeddings whose spread is the mlp3 "variance over the first tokens' embeddings". */
#define EMB_FIRST_TOKENS 5

ferry_status ferry__features_alloc(struct ferry_engine *e) {
  if (!e->cfg.token_features) return FERRY_OK;
  const size_t T = (size_t)e->cfg.max_step_tokens, B = (size_t)e->cfg.max_batch;
  e->tok_features = ferry__calloc(T * FERRY_MLP7_FEATURES, sizeof(float));
  e->feat_emb5 = ferry__calloc(B * 3, sizeof(double));
  e->feat_seg = ferry__calloc(B * FERRY_MLP_SEGMENT_TOKENS * 2, sizeof(float));
  if (!e->tok_features || !e->feat_emb5 || !e->feat_seg)
    return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory for predictor features");
  return FERRY_OK;
}

void ferry__features_free(struct ferry_engine *e) {
  ferry_free(e->tok_features);
  ferry_free(e->feat_emb5);
  ferry_free(e->feat_seg);
  e->tok_features = NULL;
  e->feat_emb5 = NULL;
  e->feat_seg = NULL;
}

uint64_t ferry__features_readback_bytes(const struct ferry_engine *e) {
  if (!e->cfg.token_features) return 0;
  const uint64_t rows = (uint64_t)e->cfg.max_step_tokens * (uint64_t)e->mc->hidden * 4;
  return 2 * ((rows + 63) / 64 * 64);
}

static uint64_t emb_offset(const struct ferry_engine *e) { return ferry__readback_features_offset(e); }

static uint64_t hidden_offset(const struct ferry_engine *e) {
  return emb_offset(e) + ferry__features_readback_bytes(e) / 2;
}

ferry_status ferry__features_after_embed(struct ferry_engine *e) {
  if (!e->cfg.token_features) return FERRY_OK;
  /* The residual stream is overwritten by the first layer: compute waits for the copy. */
  const uint64_t bytes = (uint64_t)e->n_tok * (uint64_t)e->mc->hidden * 4;
  TRY(ferry_exec_record(e->ex, e->q_compute, e->ev_router));
  TRY(ferry_exec_queue_wait(e->ex, e->q_d2h, e->ev_router));
  TRY(ferry_exec_copy(e->ex, e->q_d2h, (struct ferry_ref){e->readback_buf, emb_offset(e), FERRY_DTYPE_F32},
                      ferry__ws(e, e->ws.x), bytes));
  TRY(ferry_exec_record(e->ex, e->q_d2h, e->ev_tmp));
  TRY(ferry_exec_queue_wait(e->ex, e->q_compute, e->ev_tmp));
  e->step_bytes_d2h += bytes;
  return FERRY_OK;
}

uint64_t ferry__features_hidden_bytes(const struct ferry_engine *e, int32_t layer) {
  if (!e->cfg.token_features || layer != e->first_moe_layer) return 0;
  return (uint64_t)e->n_tok * (uint64_t)e->mc->hidden * 4;
}

ferry_status ferry__features_copy_hidden(struct ferry_engine *e, int32_t layer) {
  const uint64_t bytes = ferry__features_hidden_bytes(e, layer);
  if (!bytes) return FERRY_OK;
  TRY(ferry_exec_copy(e->ex, e->q_d2h, (struct ferry_ref){e->readback_buf, hidden_offset(e), FERRY_DTYPE_F32},
                      ferry__ws(e, e->ws.x), bytes));
  return FERRY_OK;
}

static void row_stats(const float *v, int64_t n, double *sum, double *sumsq) {
  double s = 0, ss = 0;
  for (int64_t i = 0; i < n; i++) {
    s += v[i];
    ss += (double)v[i] * v[i];
  }
  *sum = s;
  *sumsq = ss;
}

void ferry__features_compute(struct ferry_engine *e) {
  if (!e->cfg.token_features || !e->has_data) return;
  const int64_t H = e->mc->hidden;
  const char *base = ferry_exec_buf_host_ptr(e->ex, e->readback_buf);
  const float *emb = (const float *)(base + emb_offset(e));
  const float *hid = (const float *)(base + hidden_offset(e));
  /* tokens of one sequence come in position order within a step (a decode token or a chunk) */
  for (int64_t t = 0; t < e->n_tok; t++) {
    const int32_t s = e->tok_seq[t], idx = e->tok_index[t];
    const struct ferry_engine_request *r = &e->reqs[e->seqs[s].req];
    const int32_t seq_len = r->prompt_tokens + r->output_tokens;
    double sum, sumsq;
    row_stats(emb + t * H, H, &sum, &sumsq);
    const double mean = sum / (double)H;
    const float emb_var = (float)fmax(0.0, sumsq / (double)H - mean * mean);
    double hsum, hsumsq;
    row_stats(hid + t * H, H, &hsum, &hsumsq);
    const float hidden_l2 = (float)sqrt(hsumsq);
    double *acc = e->feat_emb5 + (size_t)s * 3;
    if (idx == 0) acc[0] = acc[1] = acc[2] = 0;
    if (idx < EMB_FIRST_TOKENS) {
      acc[0] += sum;
      acc[1] += sumsq;
      acc[2] += (double)H;
    }
    const double m5 = acc[2] > 0 ? acc[0] / acc[2] : 0;
    const float emb_var5 = acc[2] > 0 ? (float)fmax(0.0, acc[1] / acc[2] - m5 * m5) : 0.0f;
    float *out = e->tok_features + t * FERRY_MLP7_FEATURES;
    if (e->cfg.token_features == FERRY_MLP3_FEATURES) {
      ferry_predictor_features_mlp3(hidden_l2, emb_var5, seq_len, out);
    } else {
      float *seg = e->feat_seg + (size_t)s * FERRY_MLP_SEGMENT_TOKENS * 2;
      const int32_t at = idx % FERRY_MLP_SEGMENT_TOKENS;
      seg[at] = hidden_l2;
      seg[FERRY_MLP_SEGMENT_TOKENS + at] = emb_var;
      ferry_predictor_features_mlp7(seg, seg + FERRY_MLP_SEGMENT_TOKENS, at + 1, seq_len, idx, out);
    }
  }
}

const float *ferry__features_of(const struct ferry_engine *e, int64_t t) {
  if (!e->cfg.token_features || !e->has_data) return NULL;
  return e->tok_features + t * FERRY_MLP7_FEATURES;
}
