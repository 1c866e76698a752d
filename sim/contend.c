/* Contention between link copies and kernels for one memory system (the profile's
 * link.contention): while a copy's bytes flow over the link, a kernel on the device advances at
 * (1 - contention) of its speed. Both ways of timing ops use the same two calls: each link
 * transfer's flowing span is noted, and a kernel's end is walked over the spans of the transfers
 * issued before it. The fast path knows every such span when it times the kernel; the
 * discrete-event path learns them as the transfers start and checks the kernel's end again when
 * it comes (a transfer that starts at or after the kernel's end cannot change it), so the two
 * give the same end whenever they time the transfers the same. */
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "sim/exec_sim_impl.h"

/* Spans that ended by keep_from can no longer overlap a kernel: no kernel starts before it. */
static void prune(struct sim_exec *s, int64_t keep_from) {
  uint32_t out = 0;
  for (uint32_t i = 0; i < s->n_flows; i++)
    if (s->flows[i].end_ns > keep_from) s->flows[out++] = s->flows[i];
  s->n_flows = out;
}

ferry_status ferry__sim_flow_note(struct sim_exec *s, int64_t start_ns, int64_t end_ns, uint64_t seq,
                                  int64_t keep_from) {
  if (end_ns <= start_ns) return FERRY_OK; /* nothing flows: no contention */
  prune(s, keep_from);
  if (s->n_flows == s->cap_flows) {
    const uint32_t cap = s->cap_flows ? 2 * s->cap_flows : 32;
    struct sim_flow *v = ferry__reallocarray(s->flows, cap, sizeof *v);
    if (!v) return ferry__err_set(&s->ex->err, FERRY_ERR_NOMEM, "sim executor: out of memory for %u transfers", cap);
    s->flows = v;
    s->cap_flows = cap;
  }
  /* kept in order of start (equal starts: in the order noted); transfers come nearly in order */
  uint32_t i = s->n_flows;
  while (i > 0 && s->flows[i - 1].start_ns > start_ns) {
    s->flows[i] = s->flows[i - 1];
    i--;
  }
  s->flows[i] = (struct sim_flow){start_ns, end_ns, seq};
  s->n_flows++;
  return FERRY_OK;
}

void ferry__sim_flow_ended(struct sim_exec *s, uint64_t seq, int64_t end_ns) {
  for (uint32_t i = 0; i < s->n_flows; i++)
    if (s->flows[i].seq == seq) {
      s->flows[i].end_ns = end_ns;
      return;
    }
}

int64_t ferry__sim_contended_end(const struct sim_exec *s, int64_t start_ns, int64_t work_ns, uint64_t before_seq) {
  const double rate = 1.0 - s->hw.link.contention;
  int64_t t = start_ns;
  double w = (double)work_ns;
  for (uint32_t i = 0; i < s->n_flows; i++) {
    const struct sim_flow *f = &s->flows[i];
    if (f->seq >= before_seq || f->end_ns <= t) continue;
    /* one stretch with some transfer flowing: this span and those overlapping it (spans that
     * only touch it are stretches of their own, so a span the discrete-event path has not
     * learnt yet, starting where the kernel ends, changes nothing) */
    int64_t end = f->end_ns;
    for (uint32_t j = i + 1; j < s->n_flows && s->flows[j].start_ns < end; j++)
      if (s->flows[j].seq < before_seq && s->flows[j].end_ns > end) end = s->flows[j].end_ns;
    const int64_t from = f->start_ns > t ? f->start_ns : t;
    if (w <= (double)(from - t)) break; /* done before the stretch starts */
    w -= (double)(from - t);
    const double can = (double)(end - from) * rate;
    if (w <= can) return from + ferry__ceil_ns(w / rate);
    w -= can;
    t = end;
  }
  return t + ferry__ceil_ns(w);
}
