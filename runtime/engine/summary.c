/* The summary of a run: the latency distributions every output shares (common/metrics.h), the
 * bytes moved and the peaks; over one engine, or over the replicas that served one trace
 * together (every request's metrics, throughput over the union of their times). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/metrics.h"
#include "common/units.h"
#include "engine_impl.h"

/* The summary's distributions are the metrics every output of a run shares (common/metrics.h). */
static void latency_stats(double *v, int64_t n, struct ferry_latency_stats *out) {
  struct ferry__dist d;
  ferry__dist_compute(v, (size_t)n, &d);
  *out = (struct ferry_latency_stats){.count = d.count, .mean = d.mean, .p50 = d.p50, .p90 = d.p90, .p99 = d.p99,
                                      .max = d.max};
}



/* Latencies of every request served by the engines, and the span of their times. */
static void request_stats(const ferry_engine *const *engines, int32_t n_eng, struct ferry_serve_summary *out) {
  int64_t n = 0, na = 0, nb = 0, nc = 0, first = INT64_MAX, last = 0;
  for (int32_t k = 0; k < n_eng; k++) n += engines[k]->n_reqs;
  double *a = ferry__calloc((size_t)(n ? n : 1), sizeof *a), *b = ferry__calloc((size_t)(n ? n : 1), sizeof *b),
         *c = ferry__calloc((size_t)(n ? n : 1), sizeof *c);
  for (int32_t k = 0; k < n_eng; k++)
    for (int64_t i = 0; i < engines[k]->n_reqs; i++) {
      const struct ferry_request_metrics *m = &engines[k]->req_metrics[i];
      if (m->rejected || m->refused) {
        out->requests_rejected += m->rejected;
        out->requests_refused += m->refused;
        continue;
      }
      struct ferry__request_latency lat;
      if (!ferry__request_latency(m->arrival_ns, m->first_token_ns, m->finish_ns, m->output_tokens, &lat)) continue;
      out->requests_done++;
      out->tokens_generated += m->output_tokens;
      if (m->arrival_ns < first) first = m->arrival_ns;
      if (m->finish_ns > last) last = m->finish_ns;
      if (a) a[na++] = lat.ttft_ns;
      if (b && lat.has_tpot) b[nb++] = lat.tpot_ns;
      if (c) c[nc++] = lat.e2e_ns;
    }
  if (a) latency_stats(a, na, &out->ttft);
  if (b) latency_stats(b, nb, &out->tpot);
  if (c) latency_stats(c, nc, &out->e2e);
  out->duration_ns = out->requests_done ? last - first : 0;
  out->tokens_per_s = out->requests_done ? ferry__throughput_tok_s(out->tokens_generated, first, last) : 0;
  ferry_free(a);
  ferry_free(b);
  ferry_free(c);
}

/* Step times and what the steps moved, over every engine. */
static void step_stats(const ferry_engine *const *engines, int32_t n_eng, struct ferry_serve_summary *out) {
  int64_t n = 0, j = 0;
  for (int32_t k = 0; k < n_eng; k++) n += engines[k]->n_steps;
  double *d = ferry__calloc((size_t)(n ? n : 1), sizeof *d);
  for (int32_t k = 0; k < n_eng; k++)
    for (int64_t s = 0; s < engines[k]->n_steps; s++) {
      const struct ferry_step_metrics *sm = &engines[k]->steps[s];
      if (d) d[j++] = (double)(sm->end_ns - sm->start_ns);
      out->bytes_disk += sm->bytes_disk;
      out->bytes_disk_write += sm->bytes_disk_write;
      out->bytes_h2d += sm->bytes_h2d;
      out->bytes_d2h += sm->bytes_d2h;
      out->bytes_peers += sm->bytes_peers;
      out->hits += sm->hits;
      out->misses += sm->misses;
      out->stall_ns += sm->stall_ns;
      if (sm->kv_tokens > out->kv_peak_tokens) out->kv_peak_tokens = sm->kv_tokens;
    }
  if (d) latency_stats(d, n, &out->step);
  out->steps = n;
  ferry_free(d);
}

/* Memory: each replica has the budgets, so the peaks are the fullest replica's (and, over
 * several devices, the fullest device's). */
static void memory_stats(const ferry_engine *e, struct ferry_serve_summary *out) {
  for (int t = 0; t < FERRY_TIER_COUNT; t++) {
    uint64_t peak = 0;
    ferry_exec_tier_usage(e->ex, (enum ferry_tier)t, NULL, &peak);
    if (peak > out->peak_bytes[t]) out->peak_bytes[t] = peak;
    out->budget_bytes[t] = ferry_exec_tier_budget(e->ex, (enum ferry_tier)t);
  }
  out->devices = e->n_dev > 1 ? e->n_dev : 1;
  if (e->n_dev > 1) out->peak_bytes[FERRY_TIER_DEVICE] = 0; /* each device has the budget: the fullest */
  for (int32_t dev = 0; dev < e->n_dev && e->n_dev > 1; dev++) {
    uint64_t peak = 0;
    ferry_exec_device_usage(e->ex, dev, NULL, &peak);
    if (peak > out->device_peak_bytes[dev]) out->device_peak_bytes[dev] = peak;
  }
  for (int32_t dev = 0; dev < e->n_dev && e->n_dev > 1; dev++)
    if (out->device_peak_bytes[dev] > out->peak_bytes[FERRY_TIER_DEVICE])
      out->peak_bytes[FERRY_TIER_DEVICE] = out->device_peak_bytes[dev];
}

void ferry_engine_summary_many(const ferry_engine *const *engines, int32_t n_engines, struct ferry_serve_summary *out) {
  memset(out, 0, sizeof *out);
  request_stats(engines, n_engines, out);
  step_stats(engines, n_engines, out);
  for (int32_t k = 0; k < n_engines; k++) {
    const ferry_engine *e = engines[k];
    out->kv_capacity_tokens = (int64_t)e->n_seqs * e->kv_capacity;
    memory_stats(e, out);
    if (e->load_ns > out->load_ns) out->load_ns = e->load_ns;
    out->prefetches += e->prefetches_before + e->xplan.prefetches;
    out->prefetches_used += e->prefetches_used_before + e->xplan.prefetches_used;
    out->preemptions += e->preemptions;
    out->swaps += e->swaps;
    out->swap_bytes += e->swap_bytes;
    out->kv_pool_blocks = e->kv_pool_blocks;
    if (e->level_max > out->pressure_level_max) out->pressure_level_max = e->level_max;
    out->reloads += e->reloads;
    out->budget_changes += e->budget_changes;
  }
  if (n_engines > 0) out->run_start_ns = engines[0]->run_start_ns;
}

void ferry_engine_summary(const ferry_engine *e, struct ferry_serve_summary *out) {
  ferry_engine_summary_many(&e, 1, out);
}

void ferry_serve_summary_print(const struct ferry_serve_summary *s, FILE *f) {
  char b1[32], b2[32];
  fprintf(f, "requests: %lld done, %lld rejected; %lld steps; %lld tokens in %.3f s (%.1f tokens/s)\n",
          (long long)s->requests_done, (long long)s->requests_rejected, (long long)s->steps,
          (long long)s->tokens_generated, (double)s->duration_ns / 1e9, s->tokens_per_s);
  if (s->requests_refused || s->pressure_level_max || s->reloads)
    fprintf(f, "staying up: %lld request(s) refused under memory pressure, highest pressure level %d, %lld reload(s)\n",
            (long long)s->requests_refused, s->pressure_level_max, (long long)s->reloads);
  fprintf(f, "%-10s %12s %12s %12s %12s %12s\n", "latency", "mean", "p50", "p90", "p99", "max");
  const struct {
    const char *name;
    const struct ferry_latency_stats *st;
  } rows[] = {{"TTFT", &s->ttft}, {"TPOT", &s->tpot}, {"e2e", &s->e2e}, {"step", &s->step}};
  for (size_t i = 0; i < 4; i++) {
    char c[5][32];
    fprintf(f, "%-10s %12s %12s %12s %12s %12s\n", rows[i].name, ferry__format_ns(rows[i].st->mean, c[0], 32),
            ferry__format_ns(rows[i].st->p50, c[1], 32), ferry__format_ns(rows[i].st->p90, c[2], 32),
            ferry__format_ns(rows[i].st->p99, c[3], 32), ferry__format_ns(rows[i].st->max, c[4], 32));
  }
  static const char *tiers[] = {"device", "host"};
  for (int t = 0; t < 2; t++)
    fprintf(f, "peak %-6s %s of %s%s\n", tiers[t], ferry__format_bytes(s->peak_bytes[t], b1, 32),
            s->budget_bytes[t] ? ferry__format_bytes(s->budget_bytes[t], b2, 32) : "unlimited",
            s->budget_changes ? " (the budget at the end; budgets changed during the run)" : "");
  if (s->peak_bytes[FERRY_TIER_DISK]) /* files of the disk tier (a KV cache homed there): no budget */
    fprintf(f, "peak disk   %s\n", ferry__format_bytes(s->peak_bytes[FERRY_TIER_DISK], b1, 32));
  for (int32_t d = 0; d < s->devices && s->devices > 1; d++)
    fprintf(f, "%s%s%s", d ? ", " : "peak per device: ", ferry__format_bytes(s->device_peak_bytes[d], b1, 32),
            d + 1 == s->devices ? "\n" : "");
  fprintf(f, "moved: disk %s, host->device %s, device->host %s\n", ferry__format_bytes(s->bytes_disk, b1, 32),
          ferry__format_bytes(s->bytes_h2d, b2, 32), ferry__format_bytes(s->bytes_d2h, (char[32]){0}, 32));
  if (s->bytes_disk_write) /* a KV cache homed on disk */
    fprintf(f, "written to disk: %s (the KV cache's new rows)\n", ferry__format_bytes(s->bytes_disk_write, b1, 32));
  if (s->bytes_peers) /* ZeRO-3's partitioned fetch (--zero-gpus N) */
    fprintf(f, "from peers: %s (the rest of each streamed block, from the data-parallel peers)\n",
            ferry__format_bytes(s->bytes_peers, b1, 32));
  if (s->hits + s->misses)
    fprintf(f, "expert cache: %lld hits, %lld misses (%.1f%% hit rate)\n", (long long)s->hits, (long long)s->misses,
            100.0 * (double)s->hits / (double)(s->hits + s->misses));
  if (s->kv_pool_blocks)
    fprintf(f, "KV cache: paged, %lld blocks; %lld preemption(s) (%lld swapped to host and back, %s each way; the "
               "others recomputed)\n",
            (long long)s->kv_pool_blocks, (long long)s->preemptions, (long long)s->swaps,
            ferry__format_bytes(s->swap_bytes, (char[32]){0}, 32));
  if (s->prefetches)
    fprintf(f, "expert prefetch: %lld fetched ahead, %lld used (precision %.1f%%)\n", (long long)s->prefetches,
            (long long)s->prefetches_used, 100.0 * (double)s->prefetches_used / (double)s->prefetches);
  char c1[32], c2[32];
  fprintf(f, "compute stall %s; weights loaded in %s\n", ferry__format_ns((double)s->stall_ns, c1, 32),
          ferry__format_ns((double)s->load_ns, c2, 32));
}
