/* Synthetic model generation. Weights are drawn from seeded streams (one per tensor, so any
 * tensor can be regenerated alone) and scaled so activations stay bounded through every layer:
 *   - matrices ~ N(0, 1/fan_in): each projection keeps the variance of its input;
 *   - projections that write into the residual stream (attention output, FFN/expert down) are
 *     further scaled by 1/sqrt(2 * layers), so the residual's variance grows to about 2 at the
 *     last layer instead of with the depth (the GPT-2 initialisation rule);
 *   - norm weights ~ 1 + N(0, 0.05), biases ~ N(0, 0.02), embeddings ~ N(0, 1);
 *   - router rows ~ N(0, 4/fan_in) (a peaked softmax), optionally skewed towards popular
 *     experts and correlated between adjacent layers, or shaped by a routing profile (see
 *     ferry_gen_options and gen_profile below).
 * "Normal" draws are the sum of four 16-bit uniforms, rescaled: one generator call per value,
 * so generation keeps up with the disk. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/alloc.h"
#include "common/cpu.h"
#include "common/fsutil.h"
#include "common/half.h"
#include "common/rng.h"
#include "common/units.h"
#include "ferry/gen.h"
#include "ferry/store.h"

#define CHUNK_ELEMS (1u << 20)

static inline float approx_normal(struct ferry_rng *r) {
  uint64_t x = ferry__rng_u64(r);
  int32_t s = (int32_t)(x & 0xffff) + (int32_t)((x >> 16) & 0xffff) + (int32_t)((x >> 32) & 0xffff) +
              (int32_t)(x >> 48) - 131070;
  /* four U(0, 65535) sum: variance 4 * 65536^2 / 12 */
  return (float)s * (1.0f / 37837.23f);
}

static double tensor_std(const struct ferry_model_config *mc, const struct ferry_tensor_desc *t, double *mean) {
  *mean = 0;
  /* weights stored [in, out] (fused experts) take their fan-in from the first dimension */
  const double fan_in = t->ndim == 2 ? (double)t->shape[t->transposed ? 0 : 1] : 1.0;
  const double residual = 1.0 / sqrt(2.0 * (double)mc->n_layers);
  switch (t->role) {
    /* Gemma scales its embeddings by sqrt(hidden): draw them smaller so they start near 1 */
    case FERRY_ROLE_EMBED: return mc->scale_embeddings ? 1.0 / sqrt((double)mc->hidden) : 1.0;
    case FERRY_ROLE_POS_EMBED: return 0.1;
    case FERRY_ROLE_ATTN_NORM:
    case FERRY_ROLE_FFN_NORM:
    case FERRY_ROLE_Q_NORM:
    case FERRY_ROLE_K_NORM:
    case FERRY_ROLE_FINAL_NORM:
    case FERRY_ROLE_POST_ATTN_NORM:
    case FERRY_ROLE_POST_FFN_NORM:
    case FERRY_ROLE_EMBED_NORM:
    case FERRY_ROLE_MLA_Q_A_NORM:
    case FERRY_ROLE_MLA_KV_A_NORM:
      /* Gemma's norms multiply by (1 + w): their weights sit around 0 */
      *mean = mc->norm_unit_offset ? 0.0 : 1.0;
      return 0.05;
    case FERRY_ROLE_ATTN_NORM_BIAS:
    case FERRY_ROLE_FFN_NORM_BIAS:
    case FERRY_ROLE_FINAL_NORM_BIAS:
    case FERRY_ROLE_EMBED_NORM_BIAS:
    case FERRY_ROLE_ATTN_Q_BIAS:
    case FERRY_ROLE_ATTN_K_BIAS:
    case FERRY_ROLE_ATTN_V_BIAS:
    case FERRY_ROLE_ATTN_QKV_BIAS:
    case FERRY_ROLE_ATTN_O_BIAS:
    case FERRY_ROLE_FFN_UP_BIAS:
    case FERRY_ROLE_FFN_DOWN_BIAS:
    case FERRY_ROLE_ROUTER_BIAS:
    case FERRY_ROLE_ROUTER_SCORE_BIAS:
    case FERRY_ROLE_EXPERT_GATE_UP_BIAS:
    case FERRY_ROLE_EXPERT_DOWN_BIAS:
    case FERRY_ROLE_LM_HEAD_BIAS:
      return 0.02;
    case FERRY_ROLE_ATTN_SINKS: return 1.0;
    case FERRY_ROLE_ATTN_O:
    case FERRY_ROLE_FFN_DOWN:
    case FERRY_ROLE_EXPERT_DOWN:
    case FERRY_ROLE_SHARED_DOWN:
      return residual / sqrt(fan_in);
    case FERRY_ROLE_ROUTER: return 2.0 / sqrt(fan_in);
    default: return 1.0 / sqrt(fan_in);
  }
}

/* Writing overlaps generating: a writer thread writes one buffer while the next is filled. */
struct writer_thread {
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  ferry_store_writer *w;
  const void *job;  /* buffer to write, NULL when idle */
  size_t job_len;
  int stop, started;
  ferry_status status; /* first failure */
  char msg[FERRY_ERRMSG_MAX];
};

static void *writer_main(void *arg) {
  struct writer_thread *t = arg;
  pthread_mutex_lock(&t->mu);
  for (;;) {
    while (!t->job && !t->stop) pthread_cond_wait(&t->cv, &t->mu);
    if (!t->job) break;
    const void *buf = t->job;
    size_t len = t->job_len;
    pthread_mutex_unlock(&t->mu);
    ferry_status st = t->status == FERRY_OK ? ferry_store_writer_write(t->w, buf, len) : t->status;
    pthread_mutex_lock(&t->mu);
    if (st != FERRY_OK && t->status == FERRY_OK) {
      t->status = st;
      snprintf(t->msg, sizeof t->msg, "%s", ferry_store_writer_errmsg(t->w));
    }
    t->job = NULL;
    pthread_cond_broadcast(&t->cv);
  }
  pthread_mutex_unlock(&t->mu);
  return NULL;
}

/* Wait until the writer is idle; its first failure, if any. */
static ferry_status writer_wait(struct writer_thread *t) {
  if (!t->started) return FERRY_OK;
  pthread_mutex_lock(&t->mu);
  while (t->job) pthread_cond_wait(&t->cv, &t->mu);
  ferry_status st = t->status;
  pthread_mutex_unlock(&t->mu);
  if (st != FERRY_OK) return ferry__fail(st, "%s", t->msg);
  return FERRY_OK;
}

static void writer_stop(struct writer_thread *t) {
  if (!t->started) return;
  pthread_mutex_lock(&t->mu);
  while (t->job) pthread_cond_wait(&t->cv, &t->mu);
  t->stop = 1;
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
  pthread_join(t->thread, NULL);
  pthread_mutex_destroy(&t->mu);
  pthread_cond_destroy(&t->cv);
  t->started = 0;
}

/* Router shaping of a routing profile. A random token stream gives a router nothing to repeat
 * from token to token, so temporal locality is left to the synthetic routing model
 * (traces/routing_profile.c); what weights can give is shaped here. */
struct gen_profile {
  const char *name;
  double affinity; /* correlation of a router row with the permuted previous layer's row */
  double cluster;  /* weight of the token cluster in the embeddings and router rows (0: none) */
};

static const struct gen_profile gen_profiles[] = {
    {"mixtral", 0.75, 1.0}, {"olmoe", 0.6, 1.0}, {"deepseek", 0.6, 1.0}, {"uniform", 0, 0}};

struct gen_state {
  const struct ferry_model_config *mc;
  const struct ferry_gen_options *opt;
  ferry_store_writer *w;
  float *chunk;
  void *out[2]; /* output buffers, one being written while the other fills */
  int cur;
  struct writer_thread wt;
  float *prev_router; /* last layer's router rows, for adjacent-layer correlation */
  float *direction;   /* shared embedding direction the router skew keys on */
  const struct gen_profile *prof; /* routing profile, or NULL */
  float *clusters;    /* [n_clusters][hidden] token-cluster directions (profile with clusters) */
  int32_t n_clusters;
  int32_t *cluster_of, *prev_cluster_of; /* [experts] the cluster each expert's row keys on */
  int32_t *perm;      /* [experts] scratch permutation */
  int routers_done;   /* routers generated so far (the first has no previous layer) */
  uint64_t written, next_report;
  int64_t t0;
};

#if defined(__x86_64__)
/* F16C conversion, 8 values at a time (round to nearest even, as ferry__f32_to_f16). */
__attribute__((target("avx,f16c"))) static void f32_to_f16_f16c(const float *v, uint16_t *o, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(o + i), _mm256_cvtps_ph(_mm256_loadu_ps(v + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; i++) o[i] = ferry__f32_to_f16(v[i]);
}
#endif

static void f32_to_f16(const float *v, uint16_t *o, size_t n) {
#if defined(__x86_64__)
  if (ferry__cpu_avx_f16c()) {
    f32_to_f16_f16c(v, o, n);
    return;
  }
#endif
  for (size_t i = 0; i < n; i++) o[i] = ferry__f32_to_f16(v[i]);
}

static ferry_status emit(struct gen_state *g, const float *v, size_t n) {
  size_t es = ferry_dtype_size(g->opt->dtype);
  /* the buffer filled now was handed to the writer two chunks ago: wait for it to be free */
  ferry_status st = writer_wait(&g->wt);
  if (st != FERRY_OK) return st;
  void *o = g->out[g->cur];
  if (g->opt->dtype == FERRY_DTYPE_F16)
    f32_to_f16(v, o, n);
  else if (g->opt->dtype == FERRY_DTYPE_BF16)
    for (size_t i = 0; i < n; i++) ((uint16_t *)o)[i] = ferry__f32_to_bf16(v[i]);
  else
    memcpy(o, v, n * sizeof *v);
  pthread_mutex_lock(&g->wt.mu);
  g->wt.job = o;
  g->wt.job_len = n * es;
  pthread_cond_broadcast(&g->wt.cv);
  pthread_mutex_unlock(&g->wt.mu);
  g->cur ^= 1;
  g->written += n * es;
  if (g->opt->progress && g->written >= g->next_report) {
    double s = (double)(ferry__mono_ns() - g->t0) / 1e9;
    fprintf(stderr, "ferry: generated %.0f MiB (%.0f MB/s)\n", (double)g->written / 1048576.0,
            s > 0 ? (double)g->written / 1e6 / s : 0.0);
    g->next_report += 256u << 20;
  }
  return FERRY_OK;
}

/* Router of one layer: random rows, plus a bias along the shared direction that favours
 * low-numbered experts (skew), mixed with the previous layer's rows (correlation). */
static ferry_status gen_router(struct gen_state *g, const struct ferry_tensor_desc *t, struct ferry_rng *r) {
  const int64_t E = t->shape[0], H = t->shape[1];
  const double std = 2.0 / sqrt((double)H), corr = g->opt->router_locality;
  float *rows = g->chunk; /* E * H <= CHUNK_ELEMS checked by the caller */
  for (int64_t e = 0; e < E; e++) {
    double bias = g->opt->router_skew > 0 ? g->opt->router_skew * (1.0 - pow((double)(e + 1), -0.5)) : 0.0;
    for (int64_t i = 0; i < H; i++) {
      double v = std * approx_normal(r);
      if (g->prev_router && corr > 0) v = corr * g->prev_router[e * H + i] + sqrt(1.0 - corr * corr) * v;
      rows[e * H + i] = (float)v;
    }
    /* popular experts get the largest component along the shared direction */
    if (g->direction)
      for (int64_t i = 0; i < H; i++) rows[e * H + i] += (float)(-bias * g->direction[i] / sqrt((double)H) * 4.0);
  }
  if (g->prev_router) memcpy(g->prev_router, rows, (size_t)(E * H) * sizeof(float));
  return emit(g, rows, (size_t)(E * H));
}

/* Router of one layer under a routing profile. Row e is a fresh draw mixed with row p^-1(e)
 * of the previous layer (p a random permutation per layer), so layer l+1's choice follows
 * layer l's through p rather than by equal ids; it keys on the token cluster that the row it
 * came from keyed on (layer 0: cluster e mod C), with a logit gain about `cluster` on a token
 * of that cluster. Rows keep the N(0, 4/H) scale of the plain router: balanced experts and
 * the gate spread of a trained router (mean top-1 share near 0.7 for top-2 of 8). */
static ferry_status gen_router_profile(struct gen_state *g, const struct ferry_tensor_desc *t, struct ferry_rng *r) {
  const int64_t E = t->shape[0], H = t->shape[1];
  const double std = 2.0 / sqrt((double)H), a = g->prof->affinity, gain = 2.5 * g->prof->cluster / (double)H;
  float *base = g->prev_router; /* the previous layer's rows without cluster terms, then this layer's */
  float *rows = g->chunk;
  const int first = g->routers_done++ == 0;
  for (int64_t e = 0; e < E; e++) g->perm[e] = (int32_t)e;
  for (int64_t e = E - 1; e > 0; e--) { /* p: the previous layer's row e becomes this layer's row perm[e] */
    int64_t j = (int64_t)ferry__rng_below(r, (uint64_t)e + 1);
    int32_t tmp = g->perm[e];
    g->perm[e] = g->perm[j];
    g->perm[j] = tmp;
  }
  for (int64_t e = 0; e < E; e++) {
    const int64_t to = g->perm[e];
    for (int64_t i = 0; i < H; i++) {
      double v = std * approx_normal(r);
      if (!first) v = a * base[e * H + i] + sqrt(1.0 - a * a) * v;
      rows[to * H + i] = (float)v;
    }
    g->cluster_of[to] = first ? (int32_t)(e % g->n_clusters) : g->prev_cluster_of[e];
  }
  memcpy(base, rows, (size_t)(E * H) * sizeof(float));
  memcpy(g->prev_cluster_of, g->cluster_of, (size_t)E * sizeof *g->cluster_of);
  for (int64_t e = 0; e < E; e++) {
    const float *u = g->clusters ? g->clusters + (size_t)g->cluster_of[e] * (size_t)H : NULL;
    double norm = 0;
    for (int64_t i = 0; i < H; i++) {
      if (u) rows[e * H + i] += (float)(gain * u[i]);
      norm += (double)rows[e * H + i] * rows[e * H + i];
    }
    /* rows of equal length: no expert is favoured on every token (a trained router's balance) */
    const double scale = std * sqrt((double)H) / sqrt(norm);
    for (int64_t i = 0; i < H; i++) rows[e * H + i] = (float)(rows[e * H + i] * scale);
  }
  return emit(g, rows, (size_t)(E * H));
}

/* Token v's cluster (a hash of the id: tokens of one cluster are spread over the vocabulary). */
static int32_t token_cluster(uint64_t seed, int64_t v, int32_t n) {
  uint64_t z = seed ^ ((uint64_t)v * 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ULL;
  return (int32_t)((z ^ (z >> 29)) % (uint64_t)n);
}

/* Embedding row values under a routing profile: a token of cluster c is scaled by 0.7 + 0.6 c /
 * (C - 1), so the hidden-state norm the predictor features read tells the clusters apart, and
 * carries the cluster's direction the router rows key on. */
static float embed_value(const struct gen_state *g, int64_t token, int64_t col, float v) {
  const int32_t c = token_cluster(g->opt->seed, token, g->n_clusters);
  const double scale = g->n_clusters > 1 ? 0.7 + 0.6 * c / (g->n_clusters - 1) : 1.0, beta = g->prof->cluster;
  const float u = g->clusters[(size_t)c * (size_t)g->mc->hidden + (size_t)col];
  return (float)(scale * (v + beta * u) / sqrt(1.0 + beta * beta));
}

static ferry_status gen_tensor(struct gen_state *g, size_t index, const struct ferry_tensor_desc *t) {
  struct ferry_rng r;
  ferry__rng_seed_stream(&r, g->opt->seed, (uint64_t)index + 1);
  if (t->role == FERRY_ROLE_ROUTER && t->numel <= CHUNK_ELEMS)
    return g->prof ? gen_router_profile(g, t, &r) : gen_router(g, t, &r);
  double mean, std = tensor_std(g->mc, t, &mean);
  const int embed_dir = t->role == FERRY_ROLE_EMBED && g->direction;
  const int embed_cluster = t->role == FERRY_ROLE_EMBED && g->clusters;
  const uint64_t cols = t->ndim == 2 ? (uint64_t)t->shape[1] : t->numel;
  for (uint64_t done = 0; done < t->numel;) {
    size_t n = t->numel - done < CHUNK_ELEMS ? (size_t)(t->numel - done) : CHUNK_ELEMS;
    for (size_t i = 0; i < n; i++) {
      float v = (float)(mean + std * approx_normal(&r));
      if (embed_dir) v += g->direction[(done + i) % cols];
      if (embed_cluster) v = embed_value(g, (int64_t)((done + i) / cols), (int64_t)((done + i) % cols), v);
      g->chunk[i] = v;
    }
    ferry_status st = emit(g, g->chunk, n);
    if (st != FERRY_OK) return st;
    done += n;
  }
  return FERRY_OK;
}

ferry_status ferry_model_config_derive(const struct ferry_model_config *base, int64_t layers, double scale,
                                       int64_t vocab, struct ferry_model_config *out) {
  *out = *base;
  if (layers > 0) {
    out->n_layers = layers;
    /* fewer layers than DeepSeek's dense-first run: keep the last one MoE */
    if (out->n_experts && out->first_dense_layers >= layers) out->first_dense_layers = layers - 1;
  }
  if (vocab > 0) out->vocab = vocab;
  if (scale > 0 && scale != 1.0) {
    int64_t heads = (int64_t)llround((double)base->n_heads * scale);
    if (heads < 1) heads = 1;
    int64_t kv = (int64_t)llround((double)base->n_kv_heads * scale);
    if (kv < 1) kv = 1;
    while (heads % kv) kv--;
    out->n_heads = heads;
    out->n_kv_heads = kv;
    out->hidden = heads * base->head_dim;
#define SCALE16(f) \
  if (base->f) out->f = ((int64_t)llround((double)base->f * scale) + 15) / 16 * 16;
    SCALE16(intermediate);
    SCALE16(expert_intermediate);
    SCALE16(shared_intermediate);
#undef SCALE16
    if (base->family == FERRY_FAMILY_BLOOM) out->intermediate = 4 * out->hidden; /* BLOOM's is implied */
  }
  ferry_model *check = NULL;
  ferry_status st = ferry_model_create(&check, out);
  ferry_model_close(check);
  return st;
}

ferry_status ferry_model_generate(const ferry_model *model, const struct ferry_gen_options *options,
                                  const char *out_dir, uint64_t *bytes_written) {
  const struct ferry_model_config *base = ferry_model_get_config(model);
  if (options->dtype != FERRY_DTYPE_F32 && options->dtype != FERRY_DTYPE_F16 && options->dtype != FERRY_DTYPE_BF16)
    return ferry__fail(FERRY_ERR_INVALID, "model gen: --dtype must be fp32, fp16 or bf16");
  if (options->router_locality < 0 || options->router_locality > 1 || options->router_skew < 0)
    return ferry__fail(FERRY_ERR_INVALID, "model gen: router skew must be >= 0 and locality in [0, 1]");
  const struct gen_profile *prof = NULL;
  if (options->routing_profile) {
    for (size_t i = 0; i < sizeof gen_profiles / sizeof *gen_profiles; i++)
      if (!strcmp(gen_profiles[i].name, options->routing_profile)) prof = &gen_profiles[i];
    if (!prof)
      return ferry__fail(FERRY_ERR_INVALID, "model gen: routing profile '%s' is unknown (expected mixtral, olmoe, "
                         "deepseek or uniform)", options->routing_profile);
    if (options->router_skew > 0 || options->router_locality > 0)
      return ferry__fail(FERRY_ERR_INVALID, "model gen: a routing profile shapes the routers itself: give it without "
                         "--router-skew and --router-locality");
  }
  struct ferry_model_config mc = *base;
  mc.dtype = options->dtype;
  /* synthetic weights are written plain at --dtype, whatever format the checkpoint is published in */
  memset(&mc.quant, 0, sizeof mc.quant);
  ferry_model *m = NULL;
  ferry_status st = ferry_model_create(&m, &mc);
  if (st != FERRY_OK) return st;
  struct gen_state g = {.mc = ferry_model_get_config(m), .opt = options, .prof = prof};
  char *tmp_dir = ferry__asprintf("%s.ferry-tmp-%ld", out_dir, (long)getpid());
  char *config_json = NULL, *config_path = NULL;
  g.chunk = ferry_malloc(CHUNK_ELEMS * sizeof(float));
  g.out[0] = ferry_malloc(CHUNK_ELEMS * sizeof(float));
  g.out[1] = ferry_malloc(CHUNK_ELEMS * sizeof(float));
  if (!tmp_dir || !g.chunk || !g.out[0] || !g.out[1]) {
    st = ferry__fail(FERRY_ERR_NOMEM, "model gen: out of memory");
    goto out_free;
  }
  if (ferry__is_dir(out_dir) && rmdir(out_dir) != 0 && !options->force) {
    st = ferry__fail(FERRY_ERR_EXISTS, "%s: exists and is not empty (use --force to replace it)", out_dir);
    goto out_free;
  }
  if (ferry__is_file(out_dir)) {
    st = ferry__fail(FERRY_ERR_EXISTS, "%s: exists and is a file", out_dir);
    goto out_free;
  }
  ferry__rm_rf(tmp_dir);
  if ((st = ferry__mkdir_p(tmp_dir, NULL)) != FERRY_OK) goto out_free;
  if (mc.n_experts && prof) {
    if ((uint64_t)(mc.n_experts * mc.hidden) > CHUNK_ELEMS) {
      st = ferry__fail(FERRY_ERR_UNSUPPORTED, "model gen: a routing profile needs experts x hidden <= %u", CHUNK_ELEMS);
      goto out_rm;
    }
    g.n_clusters = (int32_t)mc.n_experts;
    g.prev_router = ferry__calloc((size_t)(mc.n_experts * mc.hidden), sizeof(float));
    g.cluster_of = ferry__calloc((size_t)mc.n_experts, sizeof *g.cluster_of);
    g.prev_cluster_of = ferry__calloc((size_t)mc.n_experts, sizeof *g.prev_cluster_of);
    g.perm = ferry__calloc((size_t)mc.n_experts, sizeof *g.perm);
    if (prof->cluster > 0) g.clusters = ferry__calloc((size_t)(mc.n_experts * mc.hidden), sizeof(float));
    if (!g.prev_router || !g.cluster_of || !g.prev_cluster_of || !g.perm || (prof->cluster > 0 && !g.clusters)) {
      st = ferry__fail(FERRY_ERR_NOMEM, "model gen: out of memory");
      goto out_rm;
    }
    if (g.clusters) {
      struct ferry_rng r;
      ferry__rng_seed_stream(&r, options->seed, 0x636c7573ULL);
      for (int64_t i = 0; i < mc.n_experts * mc.hidden; i++) g.clusters[i] = approx_normal(&r);
    }
  } else if (mc.n_experts && (options->router_skew > 0 || options->router_locality > 0)) {
    if ((uint64_t)(mc.n_experts * mc.hidden) > CHUNK_ELEMS) {
      st = ferry__fail(FERRY_ERR_UNSUPPORTED, "model gen: router shaping needs experts x hidden <= %u", CHUNK_ELEMS);
      goto out_rm;
    }
    g.prev_router = options->router_locality > 0 ? ferry__calloc((size_t)(mc.n_experts * mc.hidden), sizeof(float)) : NULL;
    g.direction = options->router_skew > 0 ? ferry__calloc((size_t)mc.hidden, sizeof(float)) : NULL;
    if ((options->router_locality > 0 && !g.prev_router) || (options->router_skew > 0 && !g.direction)) {
      st = ferry__fail(FERRY_ERR_NOMEM, "model gen: out of memory");
      goto out_rm;
    }
    if (g.direction) {
      struct ferry_rng r;
      ferry__rng_seed_stream(&r, options->seed, 0);
      for (int64_t i = 0; i < mc.hidden; i++) g.direction[i] = (float)(approx_normal(&r) > 0 ? 0.7 : -0.7);
    }
  }
  if ((st = ferry_store_writer_create(&g.w, tmp_dir, options->max_shard_bytes)) != FERRY_OK) goto out_rm;
  char seed_text[32];
  snprintf(seed_text, sizeof seed_text, "%llu", (unsigned long long)options->seed);
  size_t n = ferry_model_tensor_count(m);
  if ((st = ferry_store_writer_set_metadata(g.w, "format", "pt")) ||
      (st = ferry_store_writer_set_metadata(g.w, "ferry.generator", "ferry model gen")) ||
      (st = ferry_store_writer_set_metadata(g.w, "ferry.seed", seed_text)))
    goto out_writer;
  for (size_t i = 0; i < n; i++) {
    const struct ferry_tensor_desc *t = ferry_model_tensor(m, i);
    if (t->slice > 0) continue; /* a fused tensor is declared once, with its expert dimension */
    int64_t shape[3] = {t->n_slices, t->shape[0], t->shape[1]};
    const int lead = t->slice == 0;
    if ((st = ferry_store_writer_add(g.w, t->name, options->dtype, t->ndim + lead, lead ? shape : t->shape)) != FERRY_OK)
      goto out_writer;
  }
  g.t0 = ferry__mono_ns();
  g.next_report = 256u << 20;
  g.wt.w = g.w;
  pthread_mutex_init(&g.wt.mu, NULL);
  pthread_cond_init(&g.wt.cv, NULL);
  if (pthread_create(&g.wt.thread, NULL, writer_main, &g.wt) != 0) {
    pthread_mutex_destroy(&g.wt.mu);
    pthread_cond_destroy(&g.wt.cv);
    st = ferry__fail(FERRY_ERR_INTERNAL, "model gen: cannot start the writer thread");
    goto out_writer;
  }
  g.wt.started = 1;
  for (size_t i = 0; i < n; i++) {
    const struct ferry_tensor_desc *t = ferry_model_tensor(m, i);
    if (t->slice > 0) continue;
    if (t->slice < 0) {
      if ((st = gen_tensor(&g, i, t)) != FERRY_OK) goto out_writer;
      continue;
    }
    /* a fused [experts, ...] tensor: its slices in expert order, each from its own stream */
    for (size_t j = i; j < n; j++) {
      const struct ferry_tensor_desc *u = ferry_model_tensor(m, j);
      if (u->slice >= 0 && u->layer == t->layer && !strcmp(u->name, t->name) &&
          (st = gen_tensor(&g, j, u)) != FERRY_OK)
        goto out_writer;
    }
  }
  if ((st = writer_wait(&g.wt)) != FERRY_OK) goto out_writer;
  writer_stop(&g.wt);
  if ((st = ferry_store_writer_finish(g.w)) != FERRY_OK) {
    st = ferry__fail(st, "%s", ferry_store_writer_errmsg(g.w));
    goto out_writer;
  }
  if ((st = ferry_model_config_json(m, &config_json)) != FERRY_OK) goto out_writer;
  config_path = ferry__path_join(tmp_dir, "config.json");
  if (!config_path) {
    st = ferry__fail(FERRY_ERR_NOMEM, "model gen: out of memory");
    goto out_writer;
  }
  if ((st = ferry__write_file_atomic(config_path, config_json, strlen(config_json), NULL)) != FERRY_OK) goto out_writer;
  if (options->force && ferry__is_dir(out_dir)) ferry__rm_rf(out_dir);
  if (rename(tmp_dir, out_dir) != 0) {
    st = ferry__fail(FERRY_ERR_IO, "%s: cannot move the generated model into place", out_dir);
    goto out_writer;
  }
  if (bytes_written) *bytes_written = g.written;
out_writer:
  writer_stop(&g.wt);
  ferry_store_writer_free(g.w);
out_rm:
  if (st != FERRY_OK) ferry__rm_rf(tmp_dir);
out_free:
  ferry_free(config_json);
  ferry_free(config_path);
  ferry_free(g.prev_router);
  ferry_free(g.direction);
  ferry_free(g.clusters);
  ferry_free(g.cluster_of);
  ferry_free(g.prev_cluster_of);
  ferry_free(g.perm);
  ferry_free(g.chunk);
  ferry_free(g.out[0]);
  ferry_free(g.out[1]);
  ferry_free(tmp_dir);
  ferry_model_close(m);
  return st;
}
