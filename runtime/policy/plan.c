/* The residency plan: which parts of which layers are pinned on the device, how the rest is
 * cut into blocks of consecutive layers, how many device slots streaming needs for a prefetch
 * depth, how large the expert cache can be in what is left, and which streamed units live in
 * host memory and which are read from disk. Pure arithmetic over sizes. */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/units.h"
#include "policy.h"

void ferry__plan_free(struct ferry_plan *p) {
  if (!p) return;
  ferry_free(p->attn_pinned);
  ferry_free(p->ffn_pinned);
  ferry_free(p->layer_block);
  ferry_free(p->blocks);
  memset(p, 0, sizeof *p);
}

static const char *fmt(uint64_t b, char *buf) { return ferry__format_bytes(b, buf, 32); }

/* Where the KV cache is once the plan says which layers stream. A cache kept with its layer's
 * weights (layer_kv_bytes) is on the device while the layer is pinned and in host memory while
 * any part of it streams; streamed layers that attend on the device take turns in one window
 * scratch there, as large as the largest of theirs. */
struct kv_split {
  uint64_t device, host, window;
  int32_t host_layers;
};

static struct kv_split split_kv(const struct ferry_plan_input *in, const struct ferry_plan *p) {
  struct kv_split s = {.device = in->kv_bytes, .host = in->host_kv_bytes};
  for (int32_t l = 0; in->layer_kv_bytes && l < in->n_layers; l++) {
    if (p->layer_block[l] < 0) {
      s.device += in->layer_kv_bytes[l];
      continue;
    }
    s.host += in->layer_kv_bytes[l];
    s.host_layers++;
    if (in->kv_window_bytes && in->kv_window_bytes[l] > s.window) s.window = in->kv_window_bytes[l];
  }
  s.device += s.window;
  return s;
}

/* The device KV cache as a refusal names it: with caches kept by layer, what the pinned layers'
 * and the window take and what the streamed layers keep in host memory instead. */
static const char *kv_words(const struct ferry_plan_input *in, const struct kv_split *kv, char *buf, size_t len) {
  char b[3][32], window[64] = "";
  if (!in->layer_kv_bytes) {
    snprintf(buf, len, "%s", fmt(kv->device, b[0]));
    return buf;
  }
  if (kv->window) snprintf(window, sizeof window, " and a streamed layer's window of %s", fmt(kv->window, b[1]));
  snprintf(buf, len, "%s: the pinned layers'%s, the %d streamed layers' %s in host memory", fmt(kv->device, b[0]),
           window, kv->host_layers, fmt(kv->host - in->host_kv_bytes, b[2]));
  return buf;
}

/* Which parts of each layer are pinned, and the blocks the streamed layers form: consecutive
 * ones, block_layers each (0 = all of them), between the streamed embeddings' and head's. Adds
 * the pinned parts to *pinned. */
static void make_blocks(const struct ferry_plan_input *in, const struct ferry_plan_config *cfg, int all_pinned,
                        int stream_globals, struct ferry_plan *p, uint64_t *pinned) {
  const int32_t L = in->n_layers;
  p->embed_block = p->head_block = -1;
  if (stream_globals && in->embed_bytes) {
    p->embed_block = p->n_blocks;
    p->blocks[p->n_blocks++] = (struct ferry_plan_block){.first_layer = -1, .n_layers = 0, .bytes = in->embed_bytes};
  }
  for (int32_t l = 0; l < L; l++) {
    p->layer_block[l] = -1;
    int pin_layer = all_pinned || l < cfg->pin_first || l >= L - cfg->pin_last;
    p->attn_pinned[l] = (uint8_t)(pin_layer || cfg->resident_attention);
    p->ffn_pinned[l] = (uint8_t)pin_layer;
    if (p->attn_pinned[l]) *pinned += in->attn_bytes[l];
    if (p->ffn_pinned[l]) *pinned += in->ffn_bytes[l];
  }
  int32_t per_block = cfg->block_layers;
  for (int32_t l = 0; l < L; l++) {
    uint64_t streamed = (p->attn_pinned[l] ? 0 : in->attn_bytes[l]) + (p->ffn_pinned[l] ? 0 : in->ffn_bytes[l]);
    if (!streamed) continue;
    struct ferry_plan_block *cur = p->n_blocks ? &p->blocks[p->n_blocks - 1] : NULL;
    int extend = cur && cur->first_layer + cur->n_layers == l && (per_block == 0 || cur->n_layers < per_block);
    if (!extend) {
      cur = &p->blocks[p->n_blocks++];
      cur->first_layer = l;
      cur->n_layers = 0;
      cur->bytes = 0;
    }
    cur->n_layers++;
    cur->bytes += streamed;
    p->layer_block[l] = p->n_blocks - 1;
  }
  if (stream_globals && in->head_bytes) {
    p->head_block = p->n_blocks;
    p->blocks[p->n_blocks++] = (struct ferry_plan_block){.first_layer = L, .n_layers = 0, .bytes = in->head_bytes};
  }
}

/* Homes of streamed units: host memory while the host budget lasts after the plan's fixed host
 * bytes (p->host_fixed_bytes), then disk, with staging slots for the reads from there. */
static ferry_status place_homes(const struct ferry_plan_input *in, const struct ferry_plan_config *cfg,
                                struct ferry_plan *p, int cached_experts, uint64_t n_expert_units, char *msg,
                                size_t len) {
  char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32];
  uint64_t streamed_units = 0, largest = 0;
  for (int32_t b = 0; b < p->n_blocks; b++) {
    streamed_units += p->blocks[b].bytes;
    if (p->blocks[b].bytes > largest) largest = p->blocks[b].bytes;
  }
  if (cached_experts) {
    streamed_units += n_expert_units * in->expert_bytes;
    if (in->expert_bytes > largest) largest = in->expert_bytes;
  }
  p->host_workspace_bytes = in->host_workspace_bytes;
  /* Every unit passes through host memory when it is loaded or streamed from disk. */
  /* slots start on 4 KiB boundaries so O_DIRECT reads can land in any of them */
  const uint64_t stage_slot = (largest + 2 * in->staging_align + 4095) / 4096 * 4096;
  p->expert_home = FERRY_TIER_HOST;
  int need_disk = cfg->home_disk && (p->n_blocks > 0 || cached_experts);
  const uint64_t host_budget = cfg->host_budget_bytes;
  if (!need_disk && host_budget && p->host_fixed_bytes + streamed_units > host_budget) need_disk = 1;
  if (need_disk && !in->disk_available) {
    snprintf(msg, len, "host budget %s cannot hold the %s of streamed weights and there are no weight files to read",
             fmt(host_budget, b1), fmt(streamed_units, b2));
    ferry__plan_free(p);
    return FERRY_ERR_BUDGET;
  }
  if (need_disk) {
    p->n_staging_slots = 2;
    if (cfg->prefetch_depth + 1 > p->n_staging_slots) p->n_staging_slots = cfg->prefetch_depth + 1;
    p->staging_slot_bytes = stage_slot;
    p->host_staging_bytes = (uint64_t)p->n_staging_slots * stage_slot;
  }
  uint64_t host_left = host_budget ? host_budget : UINT64_MAX;
  uint64_t host_min = p->host_fixed_bytes + p->host_staging_bytes;
  if (host_budget && host_min > host_budget) {
    snprintf(msg, len,
             "host budget %s is below the minimum %s (KV cache in host memory %s, CPU workspace %s, read-back "
             "buffers %s, %d staging slot(s) of %s)",
             fmt(host_budget, b1), fmt(host_min, b2), fmt(p->host_kv_bytes, b5), fmt(in->host_workspace_bytes, b6),
             fmt(in->host_fixed_bytes - in->host_kv_bytes - in->host_workspace_bytes, b3), p->n_staging_slots,
             fmt(stage_slot, b4));
    ferry__plan_free(p);
    return FERRY_ERR_BUDGET;
  }
  if (host_budget) host_left -= host_min;
  for (int32_t b = 0; b < p->n_blocks; b++) {
    if (!cfg->home_disk && p->blocks[b].bytes <= host_left) {
      p->blocks[b].home = FERRY_TIER_HOST;
      if (host_budget) host_left -= p->blocks[b].bytes;
      p->host_units_bytes += p->blocks[b].bytes;
    } else {
      p->blocks[b].home = FERRY_TIER_DISK;
    }
  }
  if (cached_experts) {
    uint64_t fit = cfg->home_disk ? 0 : host_left / in->expert_bytes;
    if (fit > n_expert_units) fit = n_expert_units;
    p->experts_on_host = (int32_t)fit;
    p->host_units_bytes += fit * in->expert_bytes;
    p->expert_home = fit == n_expert_units ? FERRY_TIER_HOST : FERRY_TIER_DISK;
  }
  p->host_total_bytes = p->host_units_bytes + p->host_staging_bytes + p->host_fixed_bytes;
  return FERRY_OK;
}

ferry_status ferry__plan_make(const struct ferry_plan_input *in, const struct ferry_plan_config *cfg,
                              struct ferry_plan *p, char *msg, size_t len) {
  memset(p, 0, sizeof *p);
  const int32_t L = in->n_layers;
  const uint64_t n_expert_units = (uint64_t)(in->n_moe_layers ? in->n_moe_layers : L) * (uint64_t)in->n_experts;
  if (L <= 0 || cfg->block_layers < 0 || cfg->prefetch_depth < 0 || cfg->pin_first < 0 || cfg->pin_last < 0) {
    snprintf(msg, len, "plan: invalid configuration");
    return FERRY_ERR_INVALID;
  }
  if (cfg->home_disk && !in->disk_available) {
    snprintf(msg, len, "plan: units cannot be homed on disk without weight files");
    return FERRY_ERR_INVALID;
  }
  p->attn_pinned = ferry__calloc((size_t)L, 1);
  p->ffn_pinned = ferry__calloc((size_t)L, 1);
  p->layer_block = ferry__calloc((size_t)L, sizeof(int32_t));
  p->blocks = ferry__calloc((size_t)L + 2, sizeof *p->blocks); /* + streamed embeddings and head */
  if (!p->attn_pinned || !p->ffn_pinned || !p->layer_block || !p->blocks) {
    ferry__plan_free(p);
    snprintf(msg, len, "plan: out of memory");
    return FERRY_ERR_NOMEM;
  }
  char b1[32], b2[32], b3[32], b5[32], b6[32], b7[32];
  const int all_pinned = cfg->resident_all || cfg->device_budget_bytes == 0;
  uint64_t pinned = in->global_bytes;
  /* Streamed embeddings and head are blocks of no layer, first and last in the fetch order (the
   * order the forward pass uses them); with everything pinned they are pinned too. */
  const int stream_globals = !all_pinned && (in->embed_bytes || in->head_bytes);
  if (!stream_globals) pinned += in->embed_bytes + in->head_bytes - in->head_shared_bytes;
  make_blocks(in, cfg, all_pinned, stream_globals, p, &pinned);
  for (int32_t b = 0; b < p->n_blocks; b++)
    if (p->blocks[b].bytes > p->block_slot_bytes) p->block_slot_bytes = p->blocks[b].bytes;
  if (p->n_blocks && !cfg->blocks_on_cpu) {
    int64_t slots = (int64_t)cfg->prefetch_depth + 1;
    if (cfg->block_slots > slots) slots = cfg->block_slots;
    p->n_block_slots = (int32_t)(slots < p->n_blocks ? slots : p->n_blocks);
    p->prefetch_depth = cfg->prefetch_depth < p->n_block_slots - 1 ? cfg->prefetch_depth : p->n_block_slots - 1;
  }
  p->experts_pinned = in->n_experts > 0 && all_pinned;
  if (p->experts_pinned) pinned += n_expert_units * in->expert_bytes;

  const struct kv_split kv = split_kv(in, p);
  p->device_pinned_bytes = pinned;
  p->device_kv_bytes = kv.device;
  p->device_workspace_bytes = in->workspace_bytes;
  p->device_block_bytes = (uint64_t)p->n_block_slots * p->block_slot_bytes;
  const uint64_t fixed = pinned + kv.device + in->workspace_bytes + p->device_block_bytes;
  /* experts not pinned live in host memory or on disk; the device caches them in slots, at least
   * one, unless every one is computed on the CPU (nothing ever fills a slot) */
  const int cached_experts = in->n_experts > 0 && !p->experts_pinned;
  const int expert_slots = cached_experts && !cfg->experts_on_cpu;
  p->expert_slot_bytes = cached_experts ? in->expert_bytes : 0;
  p->device_min_bytes = fixed + (expert_slots ? in->expert_bytes : 0);

  if (cfg->device_budget_bytes && p->device_min_bytes > cfg->device_budget_bytes) {
    char kvw[192];
    snprintf(msg, len,
             "device budget %s is below the minimum working set %s (pinned %s, KV cache %s, workspace %s, "
             "%d block slot(s) of %s%s%s)",
             fmt(cfg->device_budget_bytes, b1), fmt(p->device_min_bytes, b2), fmt(pinned, b3),
             kv_words(in, &kv, kvw, sizeof kvw), fmt(in->workspace_bytes, b5), p->n_block_slots,
             fmt(p->block_slot_bytes, b6),
             expert_slots ? ", 1 expert slot of " : "", expert_slots ? fmt(in->expert_bytes, b7) : "");
    ferry__plan_free(p);
    return FERRY_ERR_BUDGET;
  }
  if (expert_slots) {
    uint64_t slots = (cfg->device_budget_bytes - fixed) / in->expert_bytes;
    if (slots > n_expert_units) slots = n_expert_units;
    if (cfg->max_expert_slots > 0 && slots > (uint64_t)cfg->max_expert_slots) slots = (uint64_t)cfg->max_expert_slots;
    p->n_expert_slots = (int32_t)slots;
    p->device_expert_bytes = slots * in->expert_bytes;
  }
  p->device_total_bytes = fixed + p->device_expert_bytes;

  /* the streamed layers' caches kept in host memory come before any streamed unit's home there */
  p->host_kv_bytes = kv.host;
  p->host_fixed_bytes = in->host_fixed_bytes - in->host_kv_bytes + kv.host;
  return place_homes(in, cfg, p, cached_experts, n_expert_units, msg, len);
}
