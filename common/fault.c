/* Fault injection (the rules of FERRY_FAULT / --faults, drawn per attempt at a site) and the
 * I/O layer's retry policy, counters and observer. One process-wide state: the sites are the
 * executors' threads and the store's readers, which know nothing of each other. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/io.h"
#include "common/units.h"
#include "ferry/fault.h"

#define MAX_RULES 16

struct rule {
  enum ferry_fault_site site;
  enum ferry_fault_kind kind;
  int64_t delay_ns;
  uint64_t first, count; /* attempts [first, first + count); count UINT64_MAX: every one after */
  double probability;    /* > 0: each attempt with this probability instead */
};

struct rules {
  struct rule r[MAX_RULES];
  int n;
  uint64_t seed;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct rules installed;
static atomic_int active;
static _Atomic uint64_t attempts[FERRY_FAULT_SITES];
static _Atomic uint64_t injected;

static uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/* Uniform in [0, 1) from a hash: attempt i of a site draws the same number in every run. */
static double unit(uint64_t h) { return (double)(mix64(h) >> 11) * (1.0 / 9007199254740992.0); }

static const char *const site_names[FERRY_FAULT_SITES] = {"read", "copy", "kernel"};

static int parse_site(const char *s, size_t n, enum ferry_fault_site *out) {
  for (int i = 0; i < FERRY_FAULT_SITES; i++)
    if (strlen(site_names[i]) == n && !strncmp(s, site_names[i], n)) {
      *out = (enum ferry_fault_site)i;
      return 1;
    }
  return 0;
}

static const struct {
  const char *name;
  enum ferry_fault_kind kind;
} kinds[] = {{"eio", FERRY_FAULT_EIO},         {"eagain", FERRY_FAULT_EAGAIN}, {"eintr", FERRY_FAULT_EINTR},
             {"short", FERRY_FAULT_SHORT},     {"corrupt", FERRY_FAULT_CORRUPT}, {"fail", FERRY_FAULT_FAIL},
             {"delay", FERRY_FAULT_NONE}};

/* "N", "N+", "N*K" or a probability "0.01". */
static ferry_status parse_when(const char *w, struct rule *r, const char *rule_text) {
  char buf[64];
  snprintf(buf, sizeof buf, "%s", w);
  if (strchr(buf, '.')) {
    double p;
    if (ferry__parse_double(buf, &p) != FERRY_OK || !(p > 0) || p > 1)
      return ferry__fail(FERRY_ERR_INVALID, "fault rule '%s': a probability is in (0, 1], got '%s'", rule_text, w);
    r->probability = p;
    return FERRY_OK;
  }
  size_t n = strlen(buf);
  int64_t first, count = 1;
  char *star = strchr(buf, '*');
  if (n && buf[n - 1] == '+') {
    buf[n - 1] = '\0';
    count = -1;
  } else if (star) {
    *star = '\0';
    if (ferry__parse_i64(star + 1, &count) != FERRY_OK || count < 1)
      return ferry__fail(FERRY_ERR_INVALID, "fault rule '%s': '*K' needs a count K >= 1", rule_text);
  }
  if (ferry__parse_i64(buf, &first) != FERRY_OK || first < 1)
    return ferry__fail(FERRY_ERR_INVALID,
                       "fault rule '%s': expected @N (the Nth attempt, from 1), @N+, @N*K or a probability like @0.01",
                       rule_text);
  r->first = (uint64_t)first;
  r->count = count < 0 ? UINT64_MAX : (uint64_t)count;
  return FERRY_OK;
}

/* One rule "SITE:KIND@WHEN" (SITE optional, KIND "delay:MS"). */
static ferry_status parse_rule(const char *text, struct rule *r) {
  memset(r, 0, sizeof *r);
  r->site = FERRY_FAULT_READ;
  const char *at = strrchr(text, '@');
  if (!at || at == text || !at[1])
    return ferry__fail(FERRY_ERR_INVALID, "fault rule '%s': expected SITE:KIND@WHEN (e.g. read:eio@3)", text);
  const char *p = text, *colon = memchr(p, ':', (size_t)(at - p));
  if (colon && parse_site(p, (size_t)(colon - p), &r->site)) p = colon + 1;
  size_t klen = (size_t)(at - p);
  const char *arg = memchr(p, ':', klen);
  size_t name_len = arg ? (size_t)(arg - p) : klen;
  int found = 0;
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0] && !found; i++)
    if (strlen(kinds[i].name) == name_len && !strncmp(p, kinds[i].name, name_len)) {
      found = 1;
      r->kind = kinds[i].kind;
    }
  if (!found)
    return ferry__fail(FERRY_ERR_INVALID,
                       "fault rule '%s': unknown fault '%.*s' (eio, eagain, eintr, short, corrupt, delay:MS, fail)",
                       text, (int)name_len, p);
  const int delay = r->kind == FERRY_FAULT_NONE;
  if (delay) {
    char ms[32];
    int64_t ns;
    snprintf(ms, sizeof ms, "%.*s", arg ? (int)(klen - name_len - 1) : 0, arg ? arg + 1 : "");
    double v;
    if (!arg || ferry__parse_double(ms, &v) != FERRY_OK || !(v >= 0) || ferry__seconds_to_ns(v / 1e3, &ns) != FERRY_OK)
      return ferry__fail(FERRY_ERR_INVALID, "fault rule '%s': delay needs milliseconds, e.g. delay:20@0.1", text);
    r->delay_ns = ns;
  } else if (arg) {
    return ferry__fail(FERRY_ERR_INVALID, "fault rule '%s': only delay takes an argument", text);
  }
  const int is_read = r->site == FERRY_FAULT_READ;
  if (!delay && is_read == (r->kind == FERRY_FAULT_FAIL))
    return ferry__fail(FERRY_ERR_INVALID, "fault rule '%s': %s faults are %s", text, site_names[r->site],
                       is_read ? "eio, eagain, eintr, short, corrupt or delay:MS" : "fail or delay:MS");
  return parse_when(at + 1, r, text);
}

ferry_status ferry_fault_set(const char *spec) {
  struct rules next;
  memset(&next, 0, sizeof next);
  next.seed = 1;
  char *copy = spec ? strdup(spec) : NULL;
  if (spec && !copy) return ferry__fail(FERRY_ERR_NOMEM, "fault specification: out of memory");
  ferry_status st = FERRY_OK;
  char *save = NULL;
  for (char *tok = copy ? strtok_r(copy, ",", &save) : NULL; tok && st == FERRY_OK; tok = strtok_r(NULL, ",", &save)) {
    while (*tok == ' ') tok++;
    if (!*tok) continue;
    if (!strncmp(tok, "seed=", 5)) {
      int64_t s;
      if (ferry__parse_i64(tok + 5, &s) != FERRY_OK || s < 0)
        st = ferry__fail(FERRY_ERR_INVALID, "fault specification: seed=N needs a non-negative integer, got '%s'", tok + 5);
      else next.seed = (uint64_t)s;
      continue;
    }
    if (next.n == MAX_RULES) {
      st = ferry__fail(FERRY_ERR_INVALID, "fault specification: at most %d rules", MAX_RULES);
      break;
    }
    st = parse_rule(tok, &next.r[next.n]);
    if (st == FERRY_OK) next.n++;
  }
  free(copy);
  if (st != FERRY_OK) return st;
  pthread_mutex_lock(&lock);
  installed = next;
  for (int i = 0; i < FERRY_FAULT_SITES; i++) atomic_store(&attempts[i], 0);
  atomic_store(&injected, 0);
  atomic_store(&active, next.n > 0);
  pthread_mutex_unlock(&lock);
  return FERRY_OK;
}

void ferry_fault_clear(void) { (void)ferry_fault_set(NULL); }

ferry_status ferry_fault_from_env(void) {
  const char *v = getenv("FERRY_FAULT");
  if (!v || !*v) return FERRY_OK;
  ferry_status st = ferry_fault_set(v);
  if (st != FERRY_OK) return ferry__fail(st, "FERRY_FAULT: %s", ferry_last_error());
  return FERRY_OK;
}

int ferry_fault_active(void) { return atomic_load_explicit(&active, memory_order_relaxed); }

uint64_t ferry_fault_injected(void) { return atomic_load(&injected); }

struct ferry_fault ferry_fault_draw(enum ferry_fault_site site) {
  struct ferry_fault f = {FERRY_FAULT_NONE, 0, 0};
  if (!atomic_load_explicit(&active, memory_order_relaxed) || (unsigned)site >= FERRY_FAULT_SITES) return f;
  pthread_mutex_lock(&lock);
  const uint64_t i = atomic_fetch_add(&attempts[site], 1) + 1;
  f.attempt = i;
  for (int k = 0; k < installed.n; k++) {
    const struct rule *r = &installed.r[k];
    if (r->site != site) continue;
    int hit = r->probability > 0 ? unit(installed.seed ^ mix64(((uint64_t)site << 56) ^ ((uint64_t)k << 48) ^ i)) < r->probability
                                 : i >= r->first && i - r->first < r->count;
    if (!hit) continue;
    if (r->kind == FERRY_FAULT_NONE) f.delay_ns += r->delay_ns;
    else if (f.kind == FERRY_FAULT_NONE) f.kind = r->kind;
  }
  pthread_mutex_unlock(&lock);
  if (f.kind != FERRY_FAULT_NONE || f.delay_ns) atomic_fetch_add(&injected, 1);
  return f;
}

/* ---- retry policy, counters, observer -------------------------------------------------------- */

static const struct ferry_io_policy default_policy = {
    .max_attempts = 5, .backoff_ns = 1000000, .backoff_max_ns = 200000000, .jitter = 0.5};
static struct ferry_io_policy policy = {
    .max_attempts = 5, .backoff_ns = 1000000, .backoff_max_ns = 200000000, .jitter = 0.5};

void ferry_io_set_policy(const struct ferry_io_policy *p) {
  struct ferry_io_policy v = p ? *p : default_policy;
  if (v.max_attempts < 1) v.max_attempts = 1;
  if (v.max_attempts > 1000) v.max_attempts = 1000;
  if (v.backoff_ns < 0) v.backoff_ns = 0;
  if (v.backoff_max_ns < v.backoff_ns) v.backoff_max_ns = v.backoff_ns;
  if (!(v.jitter >= 0)) v.jitter = 0;
  if (v.jitter > 1) v.jitter = 1;
  pthread_mutex_lock(&lock);
  policy = v;
  pthread_mutex_unlock(&lock);
}

void ferry_io_get_policy(struct ferry_io_policy *out) {
  pthread_mutex_lock(&lock);
  *out = policy;
  pthread_mutex_unlock(&lock);
}

int64_t ferry_io_backoff_ns(int32_t retry, uint64_t salt) {
  struct ferry_io_policy p;
  ferry_io_get_policy(&p);
  if (retry < 1) retry = 1;
  double wait = (double)p.backoff_ns;
  for (int32_t i = 1; i < retry && wait < (double)p.backoff_max_ns; i++) wait *= 2;
  if (wait > (double)p.backoff_max_ns) wait = (double)p.backoff_max_ns;
  /* full jitter spreads the retries of readers that failed together */
  wait *= 1.0 - p.jitter * unit(salt ^ ((uint64_t)retry << 40));
  return (int64_t)wait;
}

static struct {
  _Atomic uint64_t reads, attempts, retries, short_reads, recovered, failed, checksum_mismatches;
} counters;

void ferry_io_stats_get(struct ferry_io_stats *out) {
  out->reads = atomic_load(&counters.reads);
  out->attempts = atomic_load(&counters.attempts);
  out->retries = atomic_load(&counters.retries);
  out->short_reads = atomic_load(&counters.short_reads);
  out->recovered = atomic_load(&counters.recovered);
  out->failed = atomic_load(&counters.failed);
  out->checksum_mismatches = atomic_load(&counters.checksum_mismatches);
}

void ferry_io_stats_reset(void) {
  atomic_store(&counters.reads, 0);
  atomic_store(&counters.attempts, 0);
  atomic_store(&counters.retries, 0);
  atomic_store(&counters.short_reads, 0);
  atomic_store(&counters.recovered, 0);
  atomic_store(&counters.failed, 0);
  atomic_store(&counters.checksum_mismatches, 0);
}

void ferry__io_count(enum ferry__io_counter c, uint64_t n) {
  switch (c) {
    case FERRY__IO_READS: atomic_fetch_add(&counters.reads, n); break;
    case FERRY__IO_ATTEMPTS: atomic_fetch_add(&counters.attempts, n); break;
    case FERRY__IO_RETRIES: atomic_fetch_add(&counters.retries, n); break;
    case FERRY__IO_SHORT: atomic_fetch_add(&counters.short_reads, n); break;
    case FERRY__IO_RECOVERED: atomic_fetch_add(&counters.recovered, n); break;
    case FERRY__IO_FAILED: atomic_fetch_add(&counters.failed, n); break;
    case FERRY__IO_MISMATCH: atomic_fetch_add(&counters.checksum_mismatches, n); break;
  }
}

static ferry_io_observer_fn observer;
static void *observer_user;

void ferry_io_set_observer(ferry_io_observer_fn fn, void *user) {
  pthread_mutex_lock(&lock);
  observer = fn;
  observer_user = user;
  pthread_mutex_unlock(&lock);
}

void ferry__io_notify(const struct ferry_io_event *ev) {
  pthread_mutex_lock(&lock);
  ferry_io_observer_fn fn = observer;
  void *user = observer_user;
  pthread_mutex_unlock(&lock);
  if (fn) fn(user, ev);
}
