/* The second executor side of hybrid runs: the host's CPU computing experts, layers or attention
 * where their weights or KV cache live, beside the device, over one op stream. The CPU has its
 * own queue and workspace (in host memory, the leading part of the device workspace's layout
 * that its ops address: ws.cpu_extent); activations cross the link as copies ordered by
 * events, like weights do; the engine decides what runs where. */
#include <string.h>

#include "common/alloc.h"
#include "engine_impl.h"

#define TRY(call)                                                                              \
  do {                                                                                         \
    ferry_status st_ = (call);                                                                 \
    if (st_ != FERRY_OK) return ferry__err_set(&e->err, st_, "%s", ferry_exec_errmsg(e->ex)); \
  } while (0)

ferry_status ferry__hybrid_queues(struct ferry_engine *e) {
  e->q_cpu = e->q_up = -1;
  e->cq = e->q_compute;
  if (!ferry__hybrid_on(e)) return FERRY_OK;
  TRY(ferry_exec_queue_create(e->ex, FERRY_QUEUE_CPU, &e->q_cpu));
  TRY(ferry_exec_queue_create(e->ex, FERRY_QUEUE_H2D, &e->q_up));
  return FERRY_OK;
}

/* The CPU's workspace at the layout's ws.cpu_extent: allocated, or again after a reload changed
 * the layout (dequantization slots of another quantization). */
ferry_status ferry__hybrid_alloc_ws(struct ferry_engine *e) {
  if (!ferry__hybrid_on(e) || (e->hws_buf && ferry_exec_buf_size(e->hws_buf) == e->ws.cpu_extent)) return FERRY_OK;
  ferry_exec_free(e->ex, e->hws_buf);
  e->hws_buf = NULL;
  const ferry_status st = ferry_exec_alloc(e->ex, FERRY_TIER_HOST, e->ws.cpu_extent, "CPU workspace", &e->hws_buf);
  return st == FERRY_OK ? st : ferry__err_set(&e->err, st, "%s", ferry_exec_errmsg(e->ex));
}

ferry_status ferry__hybrid_alloc(struct ferry_engine *e) {
  if (!ferry__hybrid_on(e)) return FERRY_OK;
  ferry_status st;
  if ((st = ferry__hybrid_alloc_ws(e)) != FERRY_OK) return st;
  if (e->cfg.kv_home_disk) { /* its file and the staging of the rows the CPU attends over */
    if ((st = ferry__kv_disk_alloc(e)) != FERRY_OK) return st;
  } else if (e->hkv_bytes && (st = ferry_exec_alloc_host(e->ex, e->hkv_bytes, e->cfg.kv_host_memory, "host KV cache",
                                                                &e->hkv_buf)) != FERRY_OK) {
    return ferry__err_set(&e->err, st, "%s", ferry_exec_errmsg(e->ex));
  }
  if (ferry_exec_event_create(e->ex, &e->ev_dev) != FERRY_OK ||
      ferry_exec_event_create(e->ex, &e->ev_down) != FERRY_OK ||
      ferry_exec_event_create(e->ex, &e->ev_cpu) != FERRY_OK || ferry_exec_event_create(e->ex, &e->ev_up) != FERRY_OK)
    return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory for events");
  const size_t pairs = (size_t)e->cfg.max_step_tokens * (size_t)(e->mc->experts_per_token ? e->mc->experts_per_token : 1);
  e->pair_cpu = ferry__calloc(pairs, 1);
  e->cpu_rows = ferry__calloc(pairs, sizeof *e->cpu_rows);
  e->dev_rows = ferry__calloc(pairs, sizeof *e->dev_rows);
  e->zero_rows = ferry__calloc((size_t)e->cfg.max_step_tokens, sizeof *e->zero_rows);
  e->expert_cpu_now = ferry__calloc((size_t)(e->mc->n_experts ? e->mc->n_experts : 1), 1);
  if (!e->pair_cpu || !e->cpu_rows || !e->dev_rows || !e->zero_rows || !e->expert_cpu_now)
    return ferry__err_set(&e->err, FERRY_ERR_NOMEM, "engine: out of memory for the hybrid step arrays");
  return FERRY_OK;
}

/* What the CPU's workspace holds before the first step: the weights its attention reads that
 * the device may hold (ferry__engine_load_mirror()), and the zero row both sides gather for the
 * other side's pairs, written into it (host memory the engine can write) and copied to the
 * device's once, when the device's window holds it (not when every routed expert runs on the
 * CPU: the device gathers no pairs). */
ferry_status ferry__hybrid_load(struct ferry_engine *e) {
  if (!ferry__hybrid_on(e)) return FERRY_OK;
  const ferry_status st = ferry__engine_load_mirror(e);
  if (st != FERRY_OK) return st;
  if (!e->ws.zero) return FERRY_OK;
  const uint64_t bytes = (uint64_t)e->mc->hidden * 4;
  char *host = ferry_exec_buf_host_ptr(e->ex, e->hws_buf);
  if (host) memset(host + e->ws.zero, 0, bytes); /* the simulator has no bytes */
  if (e->ws.zero < e->ws.device_base) return FERRY_OK;
  TRY(ferry_exec_copy(e->ex, e->q_h2d, (struct ferry_ref){e->ws_buf, e->ws.zero, FERRY_DTYPE_F32},
                      (struct ferry_ref){e->hws_buf, e->ws.zero, FERRY_DTYPE_F32}, bytes));
  TRY(ferry_exec_drain(e->ex));
  return FERRY_OK;
}

void ferry__hybrid_free(struct ferry_engine *e) {
  ferry__kv_disk_free(e);
  if (e->ex) {
    ferry_exec_free(e->ex, e->hws_buf);
    ferry_exec_free(e->ex, e->hkv_buf);
    ferry_exec_event_destroy(e->ex, e->ev_dev);
    ferry_exec_event_destroy(e->ex, e->ev_down);
    ferry_exec_event_destroy(e->ex, e->ev_cpu);
    ferry_exec_event_destroy(e->ex, e->ev_up);
  }
  e->hws_buf = e->hkv_buf = NULL;
  e->ev_dev = e->ev_down = e->ev_cpu = e->ev_up = NULL;
  ferry_free(e->pair_cpu);
  ferry_free(e->cpu_rows);
  ferry_free(e->dev_rows);
  ferry_free(e->zero_rows);
  ferry_free(e->expert_cpu_now);
  e->cpu_rows = e->dev_rows = e->zero_rows = NULL;
  e->pair_cpu = e->expert_cpu_now = NULL;
}

void ferry__side_cpu(struct ferry_engine *e) {
  e->cq = e->q_cpu;
  e->cws = e->hws_buf;
  e->w_host = 1;
}

void ferry__side_device(struct ferry_engine *e) {
  e->cq = e->q_compute;
  e->cws = e->ws_buf;
  e->w_host = 0;
}

/* The bytes a crossing of `fp32_bytes` of activations moves: the runtime's element size, as the
 * workspace was charged (ws.act_bytes, ferry_exec_elem_bytes()), so an fp16 runtime simulated
 * moves half the fp32 rows' bytes (the leading part of the same rows: the simulator times the
 * copy and has no bytes to keep); host and cuda move them whole. */
static uint64_t crossing_bytes(const struct ferry_engine *e, uint64_t fp32_bytes) {
  return fp32_bytes / 4 * e->ws.act_bytes;
}

ferry_status ferry__cross_down(struct ferry_engine *e, const uint64_t *off, const uint64_t *bytes, int n) {
  TRY(ferry_exec_record(e->ex, e->q_compute, e->ev_dev));
  TRY(ferry_exec_queue_wait(e->ex, e->q_d2h, e->ev_dev));
  for (int i = 0; i < n; i++) {
    const uint64_t moved = crossing_bytes(e, bytes[i]);
    if (!moved) continue;
    TRY(ferry_exec_copy(e->ex, e->q_d2h, (struct ferry_ref){e->hws_buf, off[i], FERRY_DTYPE_F32},
                        (struct ferry_ref){e->ws_buf, off[i], FERRY_DTYPE_F32}, moved));
    e->step_bytes_d2h += moved;
    e->step_bytes_act += moved;
  }
  TRY(ferry_exec_record(e->ex, e->q_d2h, e->ev_down));
  TRY(ferry_exec_queue_wait(e->ex, e->q_cpu, e->ev_down));
  return FERRY_OK;
}

ferry_status ferry__cross_up(struct ferry_engine *e, const uint64_t *off, const uint64_t *bytes, int n) {
  TRY(ferry_exec_record(e->ex, e->q_cpu, e->ev_cpu));
  TRY(ferry_exec_queue_wait(e->ex, e->q_up, e->ev_cpu));
  for (int i = 0; i < n; i++) {
    const uint64_t moved = crossing_bytes(e, bytes[i]);
    if (!moved) continue;
    TRY(ferry_exec_copy(e->ex, e->q_up, (struct ferry_ref){e->ws_buf, off[i], FERRY_DTYPE_F32},
                        (struct ferry_ref){e->hws_buf, off[i], FERRY_DTYPE_F32}, moved));
    e->step_bytes_h2d += moved;
    e->step_bytes_act += moved;
  }
  TRY(ferry_exec_record(e->ex, e->q_up, e->ev_up));
  TRY(ferry_exec_queue_wait(e->ex, e->q_compute, e->ev_up));
  return FERRY_OK;
}

static struct ferry_place_rates place_rates(const struct ferry_engine *e) {
  const struct ferry_compute_rates *r = &e->cfg.rates;
  return (struct ferry_place_rates){r->cpu_flops, r->cpu_bytes, r->device_flops, r->device_bytes, r->link_bytes};
}

int ferry__expert_on_cpu(const struct ferry_engine *e, int32_t layer, int32_t expert, int32_t n_tokens) {
  (void)layer;
  (void)expert;
  switch (e->cfg.compute_experts) {
    case FERRY_COMPUTE_CPU: return 1;
    case FERRY_COMPUTE_AUTO: {
      const struct ferry_model_config *mc = e->mc;
      /* gate, up and down (or a fused gate_up twice as wide): 3 x hidden x intermediate MACs */
      const double flops = 6.0 * (double)mc->hidden * (double)mc->expert_intermediate * (double)n_tokens;
      const struct ferry_place_rates r = place_rates(e);
      return ferry__place_on_cpu(&r, (double)e->plan.expert_slot_bytes, flops);
    }
    default: return 0;
  }
}

/* The most tokens one micro-batch of the step carries: the rows of each of its products. */
static int32_t step_rows(const struct ferry_engine *e) {
  int32_t rows = 0;
  for (int32_t m = 0; m < e->n_mb; m++)
    if (e->mbs[m].n_tok > rows) rows = e->mbs[m].n_tok;
  return rows;
}

int ferry__layers_on_cpu(const struct ferry_engine *e, int32_t n_tokens) {
  switch (e->cfg.compute_layers) {
    case FERRY_COMPUTE_CPU: return 1;
    case FERRY_COMPUTE_AUTO: {
      /* a runtime with a rule of its own: llama.cpp's scheduler runs an op whose weights are in a
       * CPU buffer on the GPU when the GPU backend's offload_op accepts it, a product over at least
       * min_batch_size (32) rows, the weights then copied up as the split's input (ggml-backend.c
       * ggml_backend_sched_backend_id_from_cur, ggml-cuda.cu ggml_backend_cuda_offload_op, PR 6083);
       * a smaller batch (decode) runs on the CPU */
      if (e->cfg.rates.offload_min_rows > 0) return step_rows(e) < e->cfg.rates.offload_min_rows;
      /* the largest streamed block decides for all of them: a step runs its streamed layers on
       * one side, so the block prefetch window stays in order */
      const struct ferry_plan *p = &e->plan;
      double bytes = 0;
      for (int32_t b = 0; b < p->n_blocks; b++)
        if ((double)p->blocks[b].bytes > bytes) bytes = (double)p->blocks[b].bytes;
      if (bytes <= 0) return 0;
      /* two flops per weight element per token, elements from the block's bytes at the model's
       * element size */
      const double elem = (double)ferry_dtype_size(e->mc->dtype);
      const double flops = 2.0 * bytes / (elem > 0 ? elem : 2.0) * (double)n_tokens;
      const struct ferry_place_rates r = place_rates(e);
      return ferry__place_on_cpu(&r, bytes, flops);
    }
    default: return 0;
  }
}
