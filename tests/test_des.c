/* sim/des and sim/resource: event ordering, ties in submission order, cancellation; fluid
 * (processor-sharing) links and disks with exact completion times, copy-engine and
 * queue-depth limits; FIFO compute units; the roofline cost function. */
#include <stdint.h>
#include <string.h>

#include "common/alloc.h"
#include "ferry/hw.h"
#include "sim/des.h"
#include "sim/gpu_cost.h"
#include "sim/resource.h"
#include "testutil.h"

/* ---- DES kernel ---------------------------------------------------------------------------- */

struct trace {
  int ids[256];
  int64_t at[256];
  int n;
};

struct tagged {
  struct trace *tr;
  int tag;
};

static void record(struct ferry__des *des, void *ctx) {
  struct tagged *t = ctx;
  t->tr->ids[t->tr->n] = t->tag;
  t->tr->at[t->tr->n] = ferry__des_now(des);
  t->tr->n++;
}

static void test_des_order_and_ties(void **state) {
  (void)state;
  struct ferry__des *des;
  assert_int_equal(ferry__des_create(&des, 2), FERRY_OK); /* tiny pool: forces growth */
  struct trace tr = {0};
  struct tagged tags[10];
  /* times: 50, 10, 30, 10, 50, 10, 0, 30, 20, 10 */
  static const int64_t times[10] = {50, 10, 30, 10, 50, 10, 0, 30, 20, 10};
  for (int i = 0; i < 10; i++) {
    tags[i] = (struct tagged){&tr, i};
    assert_int_equal(ferry__des_schedule(des, times[i], record, &tags[i], NULL), FERRY_OK);
  }
  assert_int_equal(ferry__des_pending(des), 10);
  int64_t next = -1;
  assert_true(ferry__des_next_time(des, &next));
  assert_int_equal(next, 0);
  assert_int_equal(ferry__des_run_all(des), 10);
  static const int expect[10] = {6, 1, 3, 5, 9, 8, 2, 7, 0, 4};
  assert_int_equal(tr.n, 10);
  for (int i = 0; i < 10; i++) {
    assert_int_equal(tr.ids[i], expect[i]);
    assert_int_equal(tr.at[i], times[expect[i]]);
  }
  assert_int_equal(ferry__des_now(des), 50);
  assert_int_equal(ferry__des_pending(des), 0);
  assert_false(ferry__des_run_one(des));
  /* the past is refused */
  assert_int_equal(ferry__des_schedule(des, 49, record, &tags[0], NULL), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "before the current time"));
  assert_int_equal(ferry__des_schedule_in(des, -1, record, &tags[0], NULL), FERRY_ERR_INVALID);
  ferry__des_destroy(des);
  ferry__des_destroy(NULL);
}

/* Many events at random-ish times: popped order must be sorted by (time, submission). */
static void test_des_heap_stress(void **state) {
  (void)state;
  struct ferry__des *des;
  assert_int_equal(ferry__des_create(&des, 0), FERRY_OK);
  enum { N = 5000 };
  static struct tagged tags[N];
  static int64_t when[N];
  uint64_t x = 12345;
  for (int i = 0; i < N; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    tags[i].tag = i;
    tags[i].tr = NULL;
    when[i] = (int64_t)(x >> 54); /* 0..1023: many ties */
    assert_int_equal(ferry__des_schedule(des, when[i], record, &tags[i], NULL) == FERRY_OK, 1);
  }
  /* run one at a time: each event must come after the previous in (time, submission) */
  int64_t last_t = -1;
  int last_id = -1;
  struct trace tr;
  for (int i = 0; i < N; i++) tags[i].tr = &tr;
  for (int i = 0; i < N; i++) {
    tr.n = 0;
    assert_true(ferry__des_run_one(des));
    int id = tr.ids[0];
    int64_t t = tr.at[0];
    assert_int_equal(t, when[id]);
    assert_true(t > last_t || (t == last_t && id > last_id));
    last_t = t;
    last_id = id;
  }
  ferry__des_destroy(des);
}

static void test_des_cancel(void **state) {
  (void)state;
  struct ferry__des *des;
  assert_int_equal(ferry__des_create(&des, 0), FERRY_OK);
  struct trace tr = {0};
  struct tagged tags[4] = {{&tr, 0}, {&tr, 1}, {&tr, 2}, {&tr, 3}};
  ferry__des_id ids[4];
  for (int i = 0; i < 4; i++)
    assert_int_equal(ferry__des_schedule(des, 100 * (i + 1), record, &tags[i], &ids[i]), FERRY_OK);
  assert_true(ids[0] != 0);
  assert_int_equal(ferry__des_cancel(des, ids[1]), 1);
  assert_int_equal(ferry__des_cancel(des, ids[1]), 0); /* twice */
  assert_int_equal(ferry__des_cancel(des, 0), 0);
  assert_int_equal(ferry__des_pending(des), 3);
  assert_int_equal(ferry__des_run_until(des, 250), 1); /* runs 0 (100); 1 cancelled */
  assert_int_equal(ferry__des_now(des), 250);            /* clock advanced to the target */
  assert_int_equal(ferry__des_cancel(des, ids[0]), 0);   /* already ran */
  /* a stale id must not cancel the event that reuses its slot */
  struct tagged t5 = {&tr, 5};
  ferry__des_id id5;
  assert_int_equal(ferry__des_schedule(des, 260, record, &t5, &id5), FERRY_OK);
  assert_int_equal(ferry__des_cancel(des, ids[0]), 0);
  assert_int_equal(ferry__des_cancel(des, ids[1]), 0);
  assert_int_equal(ferry__des_run_all(des), 3);
  assert_int_equal(tr.n, 4);
  assert_int_equal(tr.ids[0], 0);
  assert_int_equal(tr.ids[1], 5);
  assert_int_equal(tr.ids[2], 2);
  assert_int_equal(tr.ids[3], 3);
  /* next_time skips cancelled entries */
  ferry__des_id a, b;
  assert_int_equal(ferry__des_schedule(des, 1000, record, &tags[0], &a), FERRY_OK);
  assert_int_equal(ferry__des_schedule(des, 2000, record, &tags[1], &b), FERRY_OK);
  assert_int_equal(ferry__des_cancel(des, a), 1);
  int64_t next = 0;
  assert_true(ferry__des_next_time(des, &next));
  assert_int_equal(next, 2000);
  assert_int_equal(ferry__des_cancel(des, b), 1);
  assert_false(ferry__des_next_time(des, &next));
  assert_int_equal(ferry__des_run_all(des), 0);
  ferry__des_destroy(des);
}

/* Mass cancellation triggers compaction; the survivors still run in order. */
static void test_des_cancel_compaction(void **state) {
  (void)state;
  struct ferry__des *des;
  assert_int_equal(ferry__des_create(&des, 0), FERRY_OK);
  enum { N = 4000 };
  static ferry__des_id ids[N];
  static struct tagged tags[N];
  static struct trace tr;
  tr.n = 0;
  for (int i = 0; i < N; i++) {
    tags[i] = (struct tagged){&tr, i};
    assert_int_equal(ferry__des_schedule(des, N - i, record, &tags[i], &ids[i]), FERRY_OK);
  }
  for (int i = 0; i < N; i++)
    if (i % 40 != 0) assert_int_equal(ferry__des_cancel(des, ids[i]), 1);
  assert_int_equal(ferry__des_pending(des), N / 40);
  assert_int_equal(ferry__des_run_all(des), N / 40);
  assert_int_equal(tr.n, N / 40);
  for (int k = 0; k < tr.n; k++) assert_int_equal(tr.ids[k], N - 40 - 40 * k);
  ferry__des_destroy(des);
}

/* A callback that reschedules itself; run_while_not stops when the predicate holds. */
struct counter {
  int n, limit;
};
static void tick(struct ferry__des *des, void *ctx) {
  struct counter *c = ctx;
  c->n++;
  if (c->n < c->limit) ferry__des_schedule_in(des, 10, tick, c, NULL);
}
static int reached_5(void *arg) { return ((struct counter *)arg)->n >= 5; }
static int reached_99(void *arg) { return ((struct counter *)arg)->n >= 99; }
static void stopper(struct ferry__des *des, void *ctx) {
  (void)ctx;
  ferry__des_stop(des);
}

static void test_des_run_while(void **state) {
  (void)state;
  struct ferry__des *des;
  assert_int_equal(ferry__des_create(&des, 0), FERRY_OK);
  struct counter c = {0, 8};
  assert_int_equal(ferry__des_schedule(des, 0, tick, &c, NULL), FERRY_OK);
  assert_int_equal(ferry__des_run_while_not(des, reached_5, &c), 1);
  assert_int_equal(c.n, 5);
  assert_int_equal(ferry__des_now(des), 40);
  assert_int_equal(ferry__des_run_while_not(des, reached_99, &c), 0); /* runs dry: deadlock */
  assert_int_equal(c.n, 8);
  assert_int_equal(ferry__des_events_run(des), 8);
  /* stop() ends run_until early without jumping the clock */
  assert_int_equal(ferry__des_schedule(des, 100, stopper, NULL, NULL), FERRY_OK);
  assert_int_equal(ferry__des_schedule(des, 200, stopper, NULL, NULL), FERRY_OK);
  assert_int_equal(ferry__des_run_until(des, 1000), 1);
  assert_int_equal(ferry__des_now(des), 100);
  assert_int_equal(ferry__des_run_until(des, 1000), 1);
  assert_int_equal(ferry__des_now(des), 200);
  ferry__des_destroy(des);
}

static void test_des_alloc_failure(void **state) {
  (void)state;
  struct ferry__des *des = NULL;
  ferry_alloc_fail_after(0);
  assert_int_equal(ferry__des_create(&des, 0), FERRY_ERR_NOMEM);
  assert_null(des);
  ferry_alloc_fail_after(-1);
  assert_int_equal(ferry__des_create(&des, 1), FERRY_OK);
  struct counter c = {0, 1};
  assert_int_equal(ferry__des_schedule(des, 0, tick, &c, NULL), FERRY_OK);
  ferry_alloc_fail_after(0);
  assert_int_equal(ferry__des_schedule(des, 0, tick, &c, NULL), FERRY_ERR_NOMEM);
  ferry_alloc_fail_after(-1);
  assert_int_equal(ferry__des_pending(des), 1);
  assert_int_equal(ferry__des_run_all(des), 1);
  ferry__des_destroy(des);
}

/* ---- resources ----------------------------------------------------------------------------- */

struct done_log {
  int n;
  int order[64];
  int64_t at[64];
};

struct job_ctx {
  struct done_log *log;
  int tag;
};

static void job_done(struct ferry__res_job *job, void *ctx) {
  struct job_ctx *c = ctx;
  c->log->order[c->log->n] = c->tag;
  c->log->at[c->log->n] = job->end_ns;
  c->log->n++;
}

static void setup_jobs(struct ferry__res_job *jobs, struct job_ctx *ctxs, struct done_log *log, int n) {
  memset(jobs, 0, sizeof *jobs * (size_t)n);
  for (int i = 0; i < n; i++) {
    ctxs[i] = (struct job_ctx){log, i};
    jobs[i].done = job_done;
    jobs[i].ctx = &ctxs[i];
  }
}

/* One transfer alone: latency + bytes / bandwidth. */
static void test_link_closed_form(void **state) {
  (void)state;
  struct ferry__des *des;
  struct ferry__fluid *link;
  assert_int_equal(ferry__des_create(&des, 0), FERRY_OK);
  /* 12.89 GB/s, 10 us latency; 1 GiB takes 10 us + 1073741824 / 12.89 ns */
  assert_int_equal(ferry__link_create(&link, des, "h2d", 12.89e9, 10000, 0), FERRY_OK);
  struct done_log log = {0};
  struct ferry__res_job j[1];
  struct job_ctx c[1];
  setup_jobs(j, c, &log, 1);
  j[0].bytes = 1ull << 30;
  assert_int_equal(ferry__des_schedule(des, 0, NULL, NULL, NULL), FERRY_ERR_INVALID); /* no callback */
  assert_int_equal(ferry__fluid_submit(link, &j[0]), FERRY_OK);
  ferry__des_run_all(des);
  assert_int_equal(log.n, 1);
  /* 1073741824 / 12.89 = 83300374.0884... -> rounded up to whole ns */
  assert_int_equal(log.at[0], 10000 + 83300375);
  assert_int_equal(j[0].start_ns, 0);
  assert_int_equal(j[0].submit_ns, 0);
  struct ferry__fluid_stats st;
  ferry__fluid_get_stats(link, &st);
  assert_int_equal(st.jobs_done, 1);
  assert_int_equal(st.bytes_done, 1ull << 30);
  ferry__fluid_destroy(link);
  ferry__des_destroy(des);
}

/* Two equal transfers started together: each takes latency + 2 B / bw. Unequal sizes: the
 * short one ends at latency + 2 A / bw, then the long one speeds up. */
static void test_link_sharing(void **state) {
  (void)state;
  struct ferry__des *des;
  struct ferry__fluid *link;
  assert_int_equal(ferry__des_create(&des, 0), FERRY_OK);
  assert_int_equal(ferry__link_create(&link, des, "h2d", 1e9, 100, 0), FERRY_OK); /* 1 byte/ns */
  struct done_log log = {0};
  struct ferry__res_job j[4];
  struct job_ctx c[4];
  setup_jobs(j, c, &log, 4);
  j[0].bytes = 1000000;
  j[1].bytes = 1000000;
  assert_int_equal(ferry__fluid_submit(link, &j[0]), FERRY_OK);
  assert_int_equal(ferry__fluid_submit(link, &j[1]), FERRY_OK);
  ferry__des_run_all(des);
  assert_int_equal(log.n, 2);
  assert_int_equal(log.at[0], 100 + 2000000);
  assert_int_equal(log.at[1], 100 + 2000000);
  assert_int_equal(log.order[0], 0); /* simultaneous completions in submission order */
  assert_int_equal(log.order[1], 1);

  /* unequal: A = 1000, B = 3000 at t0 = T; A ends T+100+2000; B gets 1000 then 2000 alone */
  log.n = 0;
  int64_t t0 = ferry__des_now(des);
  j[2].bytes = 3000;
  j[3].bytes = 1000;
  assert_int_equal(ferry__fluid_submit(link, &j[2]), FERRY_OK);
  assert_int_equal(ferry__fluid_submit(link, &j[3]), FERRY_OK);
  ferry__des_run_all(des);
  assert_int_equal(log.n, 2);
  assert_int_equal(log.order[0], 3);
  assert_int_equal(log.at[0], t0 + 100 + 2000);
  assert_int_equal(log.order[1], 2);
  assert_int_equal(log.at[1], t0 + 100 + 4000);
  ferry__fluid_destroy(link);
  ferry__des_destroy(des);
}

/* Staggered arrival: A (1000 B) alone for 500 ns, then B (3000 B) joins; A ends at 1500, B at
 * 4000 (4000 bytes at 1 byte/ns in all: the link never idles). Odd shares: three transfers
 * at bw 3 bytes/ns finish at exact integer ns. */
struct submit_at {
  struct ferry__fluid *link;
  struct ferry__res_job *job;
};
static void submit_cb(struct ferry__des *des, void *ctx) {
  (void)des;
  struct submit_at *s = ctx;
  assert_int_equal(ferry__fluid_submit(s->link, s->job), FERRY_OK);
}

static void test_link_staggered(void **state) {
  (void)state;
  struct ferry__des *des;
  struct ferry__fluid *link;
  assert_int_equal(ferry__des_create(&des, 0), FERRY_OK);
  assert_int_equal(ferry__link_create(&link, des, "l", 1e9, 0, 0), FERRY_OK);
  struct done_log log = {0};
  struct ferry__res_job j[5];
  struct job_ctx c[5];
  setup_jobs(j, c, &log, 5);
  j[0].bytes = 1000;
  j[1].bytes = 3000;
  assert_int_equal(ferry__fluid_submit(link, &j[0]), FERRY_OK);
  struct submit_at s = {link, &j[1]};
  assert_int_equal(ferry__des_schedule(des, 500, submit_cb, &s, NULL), FERRY_OK);
  ferry__des_run_all(des);
  assert_int_equal(log.n, 2);
  assert_int_equal(log.order[0], 0);
  assert_int_equal(log.at[0], 1500);
  assert_int_equal(log.order[1], 1);
  assert_int_equal(log.at[1], 4000);
  assert_int_equal(j[1].start_ns, 500);
  ferry__fluid_destroy(link);

  /* 3 bytes/ns, sizes 300, 600, 900 together: 300 ends at 300 (each 1 B/ns), 600 at
   * 300 + 300/1.5 = 500, 900 at 500 + 300/3 = 600 */
  log.n = 0;
  ferry__des_destroy(des);
  assert_int_equal(ferry__des_create(&des, 0), FERRY_OK);
  assert_int_equal(ferry__link_create(&link, des, "l", 3e9, 0, 0), FERRY_OK);
  j[2].bytes = 900;
  j[3].bytes = 300;
  j[4].bytes = 600;
  for (int i = 2; i < 5; i++) assert_int_equal(ferry__fluid_submit(link, &j[i]), FERRY_OK);
  ferry__des_run_all(des);
  assert_int_equal(log.n, 3);
  assert_int_equal(log.order[0], 3);
  assert_int_equal(log.at[0], 300);
  assert_int_equal(log.order[1], 4);
  assert_int_equal(log.at[1], 500);
  assert_int_equal(log.order[2], 2);
  assert_int_equal(log.at[2], 600);
  ferry__fluid_destroy(link);
  ferry__des_destroy(des);
}

/* Copy engines: with 1 engine, transfers run one after another in FIFO order, each paying
 * its latency; with 2 engines, the third waits for the first to finish. */
static void test_link_copy_engines(void **state) {
  (void)state;
  struct ferry__des *des;
  struct ferry__fluid *link;
  assert_int_equal(ferry__des_create(&des, 0), FERRY_OK);
  assert_int_equal(ferry__link_create(&link, des, "h2d", 1e9, 50, 1), FERRY_OK);
  struct done_log log = {0};
  struct ferry__res_job j[3];
  struct job_ctx c[3];
  setup_jobs(j, c, &log, 3);
  j[0].bytes = 1000;
  j[1].bytes = 10;
  j[2].bytes = 500;
  for (int i = 0; i < 3; i++) assert_int_equal(ferry__fluid_submit(link, &j[i]), FERRY_OK);
  struct ferry__fluid_stats st;
  ferry__fluid_get_stats(link, &st);
  assert_int_equal(st.active, 1);
  assert_int_equal(st.waiting, 2);
  ferry__des_run_all(des);
  assert_int_equal(log.n, 3);
  for (int i = 0; i < 3; i++) assert_int_equal(log.order[i], i);
  assert_int_equal(log.at[0], 1050);
  assert_int_equal(log.at[1], 1050 + 60);
  assert_int_equal(log.at[2], 1110 + 550);
  assert_int_equal(j[1].start_ns, 1050);
  assert_int_equal(j[2].start_ns, 1110);
  ferry__fluid_destroy(link);

  /* two engines: A 1000 and B 3000 share; C 1000 waits until A ends (at 50 + 2000), then
   * shares with B: B has 2000 left, C 1000 after its latency (50 ns during which B runs
   * alone: 50 bytes), so B 1950 vs C 1000 at half rate: C ends at 2100 + 2000 = 4100, B
   * then has 950 left alone: ends at 5050 */
  log.n = 0;
  ferry__des_destroy(des);
  assert_int_equal(ferry__des_create(&des, 0), FERRY_OK);
  assert_int_equal(ferry__link_create(&link, des, "h2d", 1e9, 50, 2), FERRY_OK);
  j[0].bytes = 1000;
  j[1].bytes = 3000;
  j[2].bytes = 1000;
  for (int i = 0; i < 3; i++) assert_int_equal(ferry__fluid_submit(link, &j[i]), FERRY_OK);
  ferry__des_run_all(des);
  assert_int_equal(log.n, 3);
  assert_int_equal(log.order[0], 0);
  assert_int_equal(log.at[0], 2050);
  assert_int_equal(j[2].start_ns, 2050);
  assert_int_equal(log.order[1], 2);
  assert_int_equal(log.at[1], 4100);
  assert_int_equal(log.order[2], 1);
  assert_int_equal(log.at[2], 5050);
  ferry__fluid_get_stats(link, &st);
  assert_int_equal(st.busy_ns, 5050 - 50); /* bandwidth in use from 50 to 5050 */
  ferry__fluid_destroy(link);
  ferry__des_destroy(des);
}

/* Disk with queue depth 2: requests beyond it wait FIFO; admitted ones share bandwidth. */
static void test_disk_queue_depth(void **state) {
  (void)state;
  struct ferry__des *des;
  struct ferry__fluid *disk;
  assert_int_equal(ferry__des_create(&des, 0), FERRY_OK);
  assert_int_equal(ferry__disk_create(&disk, des, "nvme", 2e9, 1000, 0, 0), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "queue depth"));
  assert_null(disk);
  assert_int_equal(ferry__fluid_create(&disk, des, "bad", 0, 0, 0), FERRY_ERR_INVALID);
  assert_int_equal(ferry__fluid_create(&disk, des, "bad", 1e9, -1, 0), FERRY_ERR_INVALID);
  assert_int_equal(ferry__disk_create(&disk, des, "nvme", 2e9, 1000, 2, -1), FERRY_ERR_INVALID);
  assert_true(tu_contains(ferry_last_error(), "a read's rate"));
  assert_null(disk);
  assert_int_equal(ferry__disk_create(&disk, des, "nvme", 2e9, 1000, 2, 0), FERRY_OK); /* 2 B/ns */
  struct done_log log = {0};
  struct ferry__res_job j[4];
  struct job_ctx c[4];
  setup_jobs(j, c, &log, 4);
  for (int i = 0; i < 4; i++) j[i].bytes = 4000;
  for (int i = 0; i < 4; i++) assert_int_equal(ferry__fluid_submit(disk, &j[i]), FERRY_OK);
  ferry__des_run_all(des);
  /* pairs: each pair takes 1000 + 8000/2 = 5000 ns */
  assert_int_equal(log.n, 4);
  for (int i = 0; i < 4; i++) assert_int_equal(log.order[i], i);
  assert_int_equal(log.at[0], 5000);
  assert_int_equal(log.at[1], 5000);
  assert_int_equal(j[2].start_ns, 5000);
  assert_int_equal(log.at[2], 10000);
  assert_int_equal(log.at[3], 10000);
  ferry__fluid_destroy(disk);
  ferry__des_destroy(des);
}

/* A disk whose reader reaches less than its bandwidth (read_bytes_per_s): each read flows at the
 * smaller of that limit and an equal share, alone or in pairs, on both timing paths. */
static void test_disk_read_limit(void **state) {
  (void)state;
  static const struct {
    double limit_bytes_per_s;
    int64_t pair_ns, alone_ns; /* two reads of 4000 B together; one alone */
  } cases[] = {
      {0.5e9, 1000 + 8000, 1000 + 8000},  /* 0.5 B/ns each, below the share of 1: the limit binds */
      {1.5e9, 1000 + 4000, 1000 + 2667},  /* a share of 1 B/ns each; alone, 4000 / 1.5 rounded up */
      {3e9, 1000 + 4000, 1000 + 2000},    /* above the disk: the disk's 2 B/ns */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct ferry__des *des;
    struct ferry__fluid *disk;
    assert_int_equal(ferry__des_create(&des, 0), FERRY_OK);
    assert_int_equal(ferry__disk_create(&disk, des, "nvme", 2e9, 1000, 2, cases[i].limit_bytes_per_s), FERRY_OK);
    struct done_log log = {0};
    struct ferry__res_job j[2];
    struct job_ctx c[2];
    setup_jobs(j, c, &log, 2);
    for (int k = 0; k < 2; k++) j[k].bytes = 4000;
    for (int k = 0; k < 2; k++) assert_int_equal(ferry__fluid_submit(disk, &j[k]), FERRY_OK);
    ferry__des_run_all(des);
    assert_int_equal(log.n, 2);
    assert_int_equal(log.at[0], cases[i].pair_ns);
    assert_int_equal(log.at[1], cases[i].pair_ns);
    assert_int_equal(ferry__fluid_alone_ns(disk, 4000, NULL), cases[i].alone_ns);
    ferry__fluid_destroy(disk);
    ferry__des_destroy(des);
  }
}

/* A zero-byte transfer completes after the latency; a completion callback may submit more. */
struct chain {
  struct ferry__fluid *link;
  struct ferry__res_job *next;
  struct done_log *log;
};
static void chain_done(struct ferry__res_job *job, void *ctx) {
  struct chain *ch = ctx;
  ch->log->at[ch->log->n++] = job->end_ns;
  if (ch->next) {
    struct ferry__res_job *n = ch->next;
    ch->next = NULL;
    assert_int_equal(ferry__fluid_submit(ch->link, n), FERRY_OK);
  }
}

static void test_link_zero_and_reentrant(void **state) {
  (void)state;
  struct ferry__des *des;
  struct ferry__fluid *link;
  assert_int_equal(ferry__des_create(&des, 0), FERRY_OK);
  assert_int_equal(ferry__link_create(&link, des, "l", 1e9, 70, 1), FERRY_OK);
  struct done_log log = {0};
  struct ferry__res_job a = {0}, b = {0};
  struct chain ch = {link, &b, &log};
  a.bytes = 0;
  a.done = chain_done;
  a.ctx = &ch;
  b.bytes = 100;
  b.done = chain_done;
  b.ctx = &ch;
  assert_int_equal(ferry__fluid_submit(link, &a), FERRY_OK);
  assert_int_equal(ferry__fluid_submit(link, &a), FERRY_ERR_BUSY); /* already in flight */
  ferry__des_run_all(des);
  assert_int_equal(log.n, 2);
  assert_int_equal(log.at[0], 70);
  assert_int_equal(log.at[1], 70 + 70 + 100);
  /* a finished job may be resubmitted */
  assert_int_equal(ferry__fluid_submit(link, &a), FERRY_OK);
  ferry__des_run_all(des);
  assert_int_equal(log.n, 3);
  ferry__fluid_destroy(link);
  ferry__des_destroy(des);
}

/* Many overlapping transfers with random sizes: bytes are conserved (the link is never idle
 * while work remains, so the last completion is at sum(bytes)/bw when latency is 0) and the
 * run is deterministic. */
static int64_t random_run(uint64_t seed, int64_t *sum_bytes) {
  struct ferry__des *des;
  struct ferry__fluid *link;
  assert_int_equal(ferry__des_create(&des, 0), FERRY_OK);
  assert_int_equal(ferry__link_create(&link, des, "l", 1e9, 0, 0), FERRY_OK);
  enum { N = 200 };
  static struct ferry__res_job j[N];
  static struct job_ctx c[N];
  static struct done_log log;
  memset(&log, 0, sizeof log);
  setup_jobs(j, c, &log, N);
  for (int i = 0; i < N; i++) c[i].log = NULL;
  static struct submit_at s[N];
  uint64_t x = seed;
  *sum_bytes = 0;
  for (int i = 0; i < N; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    j[i].bytes = 1 + (x >> 40) % 100000;
    j[i].done = NULL;
    *sum_bytes += (int64_t)j[i].bytes;
    s[i] = (struct submit_at){link, &j[i]};
    /* arrivals within the first 1000 ns: the link is busy throughout */
    assert_int_equal(ferry__des_schedule(des, (int64_t)(x >> 20) % 1000, submit_cb, &s[i], NULL), FERRY_OK);
  }
  ferry__des_run_all(des);
  int64_t last = 0;
  for (int i = 0; i < N; i++)
    if (j[i].end_ns > last) last = j[i].end_ns;
  struct ferry__fluid_stats st;
  ferry__fluid_get_stats(link, &st);
  assert_int_equal(st.jobs_done, N);
  ferry__fluid_destroy(link);
  ferry__des_destroy(des);
  return last;
}

static void test_link_conservation(void **state) {
  (void)state;
  int64_t sum1, sum2;
  int64_t a = random_run(7, &sum1);
  int64_t b = random_run(7, &sum2);
  assert_int_equal(a, b);
  assert_int_equal(sum1, sum2);
  /* each completion rounds up to whole ns, so allow one ns per job */
  assert_true(a >= sum1);
  assert_true(a <= sum1 + 200);
}

/* Compute unit: FIFO, one op at a time. */
static void test_compute_fifo(void **state) {
  (void)state;
  struct ferry__des *des;
  struct ferry__compute *cu;
  assert_int_equal(ferry__des_create(&des, 0), FERRY_OK);
  assert_int_equal(ferry__compute_create(&cu, des, "sm"), FERRY_OK);
  struct done_log log = {0};
  struct ferry__res_job j[3];
  struct job_ctx c[3];
  setup_jobs(j, c, &log, 3);
  j[0].duration_ns = 100;
  j[1].duration_ns = 0;
  j[2].duration_ns = 30;
  for (int i = 0; i < 3; i++) assert_int_equal(ferry__compute_submit(cu, &j[i]), FERRY_OK);
  struct ferry__res_job bad = {.duration_ns = -5};
  assert_int_equal(ferry__compute_submit(cu, &bad), FERRY_ERR_INVALID);
  ferry__des_run_all(des);
  assert_int_equal(log.n, 3);
  for (int i = 0; i < 3; i++) assert_int_equal(log.order[i], i);
  assert_int_equal(log.at[0], 100);
  assert_int_equal(log.at[1], 100);
  assert_int_equal(j[2].start_ns, 100);
  assert_int_equal(log.at[2], 130);
  /* idle gap: a later op starts when submitted */
  assert_int_equal(ferry__des_run_until(des, 500), 0);
  j[0].duration_ns = 10;
  assert_int_equal(ferry__compute_submit(cu, &j[0]), FERRY_OK);
  ferry__des_run_all(des);
  assert_int_equal(j[0].start_ns, 500);
  assert_int_equal(j[0].end_ns, 510);
  struct ferry__compute_stats st;
  ferry__compute_get_stats(cu, &st);
  assert_int_equal(st.jobs_done, 4);
  assert_int_equal(st.busy_ns, 140);
  ferry__compute_destroy(cu);
  ferry__des_destroy(des);
}

/* Roofline with a rounded corner: sqrt(t_math^2 + t_mem^2) + launch overhead (sim/gpu_cost.h). */
static void test_roofline(void **state) {
  (void)state;
  struct ferry_hw_profile p;
  memset(&p, 0, sizeof p);
  p.has_gpu = 1;
  p.gpu.mem_bw_gbps = 1000.0;        /* 1000 bytes/ns */
  p.gpu.peak_tflops.fp32 = 10.0;     /* 10000 flops/ns */
  p.gpu.peak_tflops.fp16 = 100.0;    /* 100000 flops/ns */
  p.gpu.launch_overhead_ns = 5000;
  p.gpu.efficiency.gemm = 0.5;
  p.gpu.efficiency.gemv = 0.8;
  p.gpu.efficiency.attention = 0.5;
  p.gpu.efficiency.elementwise = 1.0;
  p.gpu.efficiency.dequantize = 0.5;
  /* GEMV 4096x4096 fp16: 2*N*N flops at 1e5 x 0.8 = 419.43 ns, 2*N*N bytes at 1000 x 0.8 =
   * 41943.04 ns: sqrt of the sum of squares 41945.14 -> 41946 ns */
  double n = 4096;
  int64_t t = ferry__hw_compute_ns(&p, FERRY_HW_OP_GEMV, 2 * n * n, 2 * n * n, FERRY_DTYPE_F16);
  assert_int_equal(t, 5000 + 41946);
  /* GEMM 4096^3 fp16: 2*N^3 flops at 1e5 x 0.5 (gemm) = 2748779.07 ns, 6*N*N bytes streamed at
   * 1000 x 0.8 (gemv) = 125829.12 ns: 2751657.4 -> 2751658 */
  t = ferry__hw_compute_ns(&p, FERRY_HW_OP_GEMM, 2 * n * n * n, 3 * 2 * n * n, FERRY_DTYPE_F16);
  assert_int_equal(t, 5000 + 2751658);
  /* same in fp32: peak 10 TFLOPs -> 10x slower compute: 27487790.7 and 251658.2 -> 27488943 */
  t = ferry__hw_compute_ns(&p, FERRY_HW_OP_GEMM, 2 * n * n * n, 3 * 4 * n * n, FERRY_DTYPE_F32);
  assert_int_equal(t, 5000 + 27488943);
  /* bf16, int8 and fp8 not given: they fall back to the fp16 peak */
  assert_int_equal(ferry__hw_compute_ns(&p, FERRY_HW_OP_GEMM, 2 * n * n * n, 0, FERRY_DTYPE_BF16), 5000 + 2748780);
  assert_int_equal(ferry__hw_compute_ns(&p, FERRY_HW_OP_GEMM, 2 * n * n * n, 0, FERRY_DTYPE_I8), 5000 + 2748780);
  assert_int_equal(ferry__hw_compute_ns(&p, FERRY_HW_OP_GEMM, 2 * n * n * n, 0, FERRY_DTYPE_F8_E4M3), 5000 + 2748780);
  /* given, fp8 runs at its own peak: twice fp16's here */
  p.gpu.peak_tflops.fp8 = 200.0;
  assert_int_equal(ferry__hw_compute_ns(&p, FERRY_HW_OP_GEMM, 2 * n * n * n, 0, FERRY_DTYPE_F8_E4M3), 5000 + 1374390);
  /* elementwise: 1e6 bytes at 1000 bytes/ns x 1.0 = 1000 ns, 1e6 flops at 1e4 = 100 ns:
   * sqrt(100^2 + 1000^2) = 1004.99 -> 1005 */
  assert_int_equal(ferry__hw_compute_ns(&p, FERRY_HW_OP_ELEMENTWISE, 1e6, 1e6, FERRY_DTYPE_F32), 5000 + 1005);
  assert_int_equal(ferry__hw_compute_ns(&p, FERRY_HW_OP_ELEMENTWISE, 0, 1e6, FERRY_DTYPE_F32), 5000 + 1000);
  /* zero work costs only the launch */
  assert_int_equal(ferry__hw_compute_ns(&p, FERRY_HW_OP_ATTENTION, 0, 0, FERRY_DTYPE_F16), 5000);
  /* missing rates: -1 */
  p.gpu.mem_bw_gbps = 0;
  assert_int_equal(ferry__hw_compute_ns(&p, FERRY_HW_OP_GEMV, 1, 1, FERRY_DTYPE_F16), -1);
  p.has_gpu = 0;
  assert_int_equal(ferry__hw_compute_ns(&p, FERRY_HW_OP_GEMV, 1, 1, FERRY_DTYPE_F16), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_des_order_and_ties),
      cmocka_unit_test(test_des_heap_stress),
      cmocka_unit_test(test_des_cancel),
      cmocka_unit_test(test_des_cancel_compaction),
      cmocka_unit_test(test_des_run_while),
      cmocka_unit_test(test_des_alloc_failure),
      cmocka_unit_test(test_link_closed_form),
      cmocka_unit_test(test_link_sharing),
      cmocka_unit_test(test_link_staggered),
      cmocka_unit_test(test_link_copy_engines),
      cmocka_unit_test(test_disk_queue_depth), cmocka_unit_test(test_disk_read_limit),
      cmocka_unit_test(test_link_zero_and_reentrant),
      cmocka_unit_test(test_link_conservation),
      cmocka_unit_test(test_compute_fifo),
      cmocka_unit_test(test_roofline),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
