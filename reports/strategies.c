/* The strategies section of a report: runs that differ in how they offload (expert placement,
 * CPU compute, KV placement and format, whole-layer streaming, micro-batches) side by side, with
 * what each costs (TPOT), moves (bytes by class) and saves (expert-cache hit rate), from the
 * strategy metrics of the steps table (schema 6; older databases read as nothing recorded). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "reports/report_internal.h"

#define NOMEM(rp) ferry__err_set(&(rp)->err, FERRY_ERR_NOMEM, "report: out of memory")
#define MAX_RUNS 64 /* bars per plot; the table lists every run */

/* Configuration keys that say how a run offloads (run options, docs/strategies.md); predictors
 * and quantization formats have sections of their own. */
static const char *const strategy_keys[] = {"expert_cache",    "offload_compute", "kv_home",         "kv_prefill",
                                            "kv_attention",    "kv_dtype",        "gpu_batches",     "expert_granularity", "kv_block_tokens",
                                            "kv_preempt",      "schedule", NULL};

/* Sums of a run's strategy metrics (NAN when its database predates them). */
struct strat {
  double cpu_busy_ns, compute_busy_ns, bytes_blocks, bytes_experts, bytes_act, cpu_experts, evictions, kv_blocks;
};

static void strat_of(const struct report *rp, const struct rrun *r, struct strat *out) {
  double *v[8] = {&out->cpu_busy_ns,   &out->compute_busy_ns, &out->bytes_blocks, &out->bytes_experts,
                  &out->bytes_act,     &out->cpu_experts,     &out->evictions,    &out->kv_blocks};
  for (int i = 0; i < 8; i++) *v[i] = NAN;
  sqlite3_stmt *q = NULL;
  if (sqlite3_prepare_v2(rp->dbs[r->db],
                         "SELECT total(cpu_busy_ns), total(compute_busy_ns), total(bytes_blocks), total(bytes_experts),"
                         " total(bytes_act), total(cpu_experts), total(evictions), max(kv_blocks) FROM steps"
                         " WHERE runId = ?1",
                         -1, &q, NULL) != SQLITE_OK) {
    sqlite3_finalize(q); /* a database without the columns (schema 5 or older) */
    return;
  }
  sqlite3_bind_int64(q, 1, r->id);
  if (sqlite3_step(q) == SQLITE_ROW)
    for (int i = 0; i < 8; i++) *v[i] = sqlite3_column_type(q, i) == SQLITE_NULL ? 0 : sqlite3_column_double(q, i);
  sqlite3_finalize(q);
}

/* "expert_cache=lfu offload_compute=..." of the strategy keys a run sets; "defaults" without. */
static void describe(const struct rrun *r, char *out, size_t len) {
  size_t n = 0;
  out[0] = '\0';
  for (size_t k = 0; strategy_keys[k] && n < len; k++) {
    char v[96];
    if (!ferry__run_val(r, strategy_keys[k], v, sizeof v) || !v[0] || !strcmp(v, "none")) continue;
    int w = snprintf(out + n, len - n, "%s%s=%s", n ? " " : "", strategy_keys[k], v);
    if (w < 0) break;
    n += (size_t)w;
  }
  if (!n) snprintf(out, len, "defaults");
}

static int usable(const struct rrun *r) { return r->complete && r->n_req > 0 && r->n_steps > 0; }

/* Whether the runs differ in a strategy key (else the section says nothing new). */
static int strategies_differ(const struct report *rp) {
  for (size_t k = 0; strategy_keys[k]; k++) {
    char first[96] = "", v[96];
    int seen = 0;
    for (size_t i = 0; i < rp->n_runs; i++) {
      const struct rrun *r = &rp->runs[i];
      if (!usable(r)) continue;
      if (!ferry__run_val(r, strategy_keys[k], v, sizeof v)) v[0] = '\0';
      if (!seen++) snprintf(first, sizeof first, "%s", v);
      else if (strcmp(first, v)) return 1;
    }
  }
  return 0;
}

static void gnum(struct ferry_strbuf *b, double v) {
  char t[48];
  if (isnan(v) || isinf(v)) snprintf(t, sizeof t, " NaN");
  else snprintf(t, sizeof t, " %.6g", v);
  ferry__sb_puts(b, t);
}

ferry_status ferry__section_strategies(struct report *rp) {
  if (!strategies_differ(rp)) return FERRY_OK;
  ferry__doc_section(rp, FERRY_REPORT_STRATEGIES, "Offloading strategies side by side");
  ferry__doc_para(rp, "Runs that differ in how they offload (docs/strategies.md): expert placement, compute "
                      "on the CPU, the KV cache's home and format, whole-layer streaming, micro-batches. Per run: "
                      "mean TPOT, the bytes copied host to device by class (layer blocks, routed experts, "
                      "activations between the device and the CPU), the expert-cache hit rate, experts computed on "
                      "the CPU and the CPU's busy time beside the device's.");
  char head[768];
  snprintf(head, sizeof head,
           "run" SEP "strategy" SEP "TPOT mean (ms)" SEP "tokens/s" SEP "host to device (GiB)" SEP "blocks (GiB)" SEP
           "experts (GiB)" SEP "activations (GiB)" SEP "hit rate (%%)" SEP "evictions" SEP "CPU experts" SEP
           "CPU busy (s)" SEP "device busy (s)" SEP "KV blocks peak");
  struct rtable *t = ferry__table_new("strategies", head);
  if (!t) return NOMEM(rp);
  struct ferry_strbuf s = {0};
  ferry__sb_puts(&s, "$d << EOD\n");
  size_t bars = 0;
  const double gib = 1.0 / 1073741824.0;
  for (size_t i = 0; i < rp->n_runs; i++) {
    const struct rrun *r = &rp->runs[i];
    if (!usable(r)) continue;
    struct strat m;
    strat_of(rp, r, &m);
    char desc[512], nb[14][40];
    describe(r, desc, sizeof desc);
    ferry__table_rowf(t, "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP "%s" SEP
                         "%s" SEP "%s" SEP "%s",
                      r->label, desc, ferry__fmt_num(r->tpot.mean, nb[0], 40), ferry__fmt_num(r->thr_tok_s, nb[1], 40),
                      ferry__fmt_num(r->bytes_h2d * gib, nb[2], 40), ferry__fmt_num(m.bytes_blocks * gib, nb[3], 40),
                      ferry__fmt_num(m.bytes_experts * gib, nb[4], 40), ferry__fmt_num(m.bytes_act * gib, nb[5], 40),
                      ferry__fmt_num(r->hit_rate_pct, nb[6], 40), ferry__fmt_num(m.evictions, nb[7], 40),
                      ferry__fmt_num(m.cpu_experts, nb[8], 40), ferry__fmt_num(m.cpu_busy_ns / 1e9, nb[9], 40),
                      ferry__fmt_num(m.compute_busy_ns / 1e9, nb[10], 40), ferry__fmt_num(m.kv_blocks, nb[11], 40));
    if (bars >= MAX_RUNS) continue;
    bars++;
    ferry__gp_data(&s, r->label);
    gnum(&s, r->tpot.mean);
    gnum(&s, m.bytes_blocks * gib);
    gnum(&s, m.bytes_experts * gib);
    gnum(&s, m.bytes_act * gib);
    gnum(&s, r->hit_rate_pct);
    ferry__sb_puts(&s, "\n");
  }
  ferry__sb_puts(&s, "EOD\nset datafile missing 'NaN'\nset style data histograms\n"
                     "set style fill solid 0.85 border -1\nset boxwidth 0.9\nset xtics rotate by -90 left nomirror\n"
                     "set key outside top center horizontal\nset yrange [0:*]\nset multiplot layout 1,3\n"
                     "set style histogram clustered gap 1\n");
  ferry__gp_set(&s, "title", "Time per output token");
  ferry__gp_set(&s, "ylabel", "TPOT mean (ms)");
  ferry__sb_puts(&s, "plot $d using 2:xtic(1) title 'TPOT' lt 1\nset style histogram rowstacked\n");
  ferry__gp_set(&s, "title", "Host to device, by class");
  ferry__gp_set(&s, "ylabel", "GiB");
  ferry__sb_puts(&s, "plot $d using 3:xtic(1) title 'blocks' lt 2, '' using 4 title 'experts' lt 3, "
                     "'' using 5 title 'activations' lt 4\nset style histogram clustered gap 1\nset yrange [0:100]\n");
  ferry__gp_set(&s, "title", "Expert-cache hit rate");
  ferry__gp_set(&s, "ylabel", "hits (%%)");
  ferry__sb_puts(&s, "plot $d using 6:xtic(1) title 'hit rate' lt 5\nunset multiplot\n");
  char caption[256];
  snprintf(caption, sizeof caption,
           "Mean TPOT (left), bytes copied host to device by class (middle) and expert-cache hit rate (right) per "
           "run%s; the runs' strategies are in the table.",
           bars < t->nrows ? " (the first 64)" : "");
  ferry_status st = s.oom ? NOMEM(rp) : ferry__emit_plot(rp, "strategies", caption, 1500, 640, s.p);
  if (st == FERRY_OK) st = ferry__emit_table(rp, t, "What each strategy cost, moved and saved (sums over the run's steps).");
  ferry__sb_free(&s);
  ferry__table_free(t);
  ferry__sb_puts(&rp->html, "</section>\n");
  return st;
}
