/* Internal state of a report: the runs read from the databases with their metrics and parsed
 * configurations, the sweep axes, the growing HTML and Markdown documents, and the helpers
 * the section writers share (tables that also become CSV files, plots drawn by gnuplot). */
#ifndef FERRY_REPORTS_INTERNAL_H
#define FERRY_REPORTS_INTERNAL_H

#include <cjson/cJSON.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/strbuf.h"
#include "ferry/report.h"

/* A growing string; an allocation failure sets oom and later appends do nothing. */

void ferry__rb_html(struct ferry_strbuf *b, const char *s); /* escaped for HTML text and attributes */
/* Escaped for Markdown text: no raw HTML (<, >, & as entities), no code, emphasis, link or
 * table syntax (backslash escapes), control characters as spaces. Every text of report.md
 * that is not the report's own markup goes through it. */
void ferry__rb_md(struct ferry_strbuf *b, const char *s);

/* Latency distribution in milliseconds. */
struct rdist {
  int64_t n;
  double mean, p50, p90, p99;
};

/* One run and what the report needs of it. */
struct rrun {
  int db;
  int64_t id;
  char label[32]; /* "r12", or "d2.r12" when several databases are read */
  char kind[16];
  char *model, *hardware, *trace, *config_hash, *error, *notes;
  int complete;
  cJSON *cfg; /* configuration (owned); keys filled from the run columns when missing */
  int64_t n_req, out_tokens;
  struct rdist ttft, tpot, e2e;
  double thr_tok_s;
  int64_t n_steps, hits, misses, tokens;
  double hit_rate_pct; /* 100 hits / (hits + misses), NAN without both (computed once, in load.c) */
  double bytes_disk, bytes_h2d, bytes_d2h, stall_ms, span_ms;
  double peak_bytes[3];
  double budget_bytes[2]; /* device and host budgets the run had (run meta), 0 when not recorded */
  char *weak_fits;        /* sim runs: the profile's fitted costs with R^2 below 0.9 (run meta WEAK_FITS), or NULL */
  int64_t n_mem, n_kernel, n_memcpy;
  double *lat[3];    /* per-request TTFT, TPOT and e2e in ms, sorted (owned; the CDF plots) */
  int64_t n_lat[3];
  double kv_capacity; /* KV-cache capacity in tokens (run meta), 0 when not recorded */
  char *prov[4];     /* provenance: build, BLAS, machine, GPU and driver (owned, NULL when unknown) */
};

/* Indexes of rrun.prov. */
enum { PROV_BUILD, PROV_BLAS, PROV_MACHINE, PROV_GPU };

/* A configuration key whose value differs between the complete runs. */
struct raxis {
  char *key;
  int numeric; /* every value is a number */
  size_t n;
  char **vals; /* distinct canonical values, sorted (numerically when numeric) */
};

struct report {
  const struct ferry_report_options *opt;
  struct ferry_err err;
  sqlite3 **dbs;
  size_t n_dbs;
  struct rrun *runs;
  size_t n_runs;
  struct raxis *axes;
  size_t n_axes;
  char *dir; /* the temporary folder being written */
  struct ferry_strbuf html, md, toc;
  struct ferry_report_summary sum;
};

/* Canonical text of a run's value for key ("" and 0 when missing). */
int ferry__run_val(const struct rrun *r, const char *key, char *buf, size_t len);
/* Numeric value of a key (NAN when missing or not a number). */
double ferry__run_num(const struct rrun *r, const char *key);
/* Whether two runs agree on every key except those listed (NULL-terminated). */
int ferry__runs_same_except(const struct rrun *a, const struct rrun *b, const char *const *except);
/* Label and unit for a configuration key ("block_layers" -> "layers per block"). */
const char *ferry__key_label(const char *key);

/* Loading (load.c). */
ferry_status ferry__report_load(struct report *rp);
void ferry__report_unload(struct report *rp);

/* A table: header, rows of cells; emitted to HTML, Markdown and tables/NAME.csv. */
struct rtable {
  char *name;
  size_t ncols, nrows, cap;
  char **cells; /* nrows * ncols, owned */
  char **head;
  int oom;
};
/* Cells of a row are separated by SEP in one printf format (cell text never holds SEP). */
#define SEP "\x1f"
/* New table; head is the column names separated by SEP. NULL when out of memory. */
struct rtable *ferry__table_new(const char *name, const char *head);
void ferry__table_rowf(struct rtable *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ferry__table_free(struct rtable *t);
ferry_status ferry__emit_table(struct report *rp, struct rtable *t, const char *caption);
/* Only tables/NAME.csv (for raw data too long to show, e.g. timeline rows). */
ferry_status ferry__emit_csv(struct report *rp, struct rtable *t);

/* Document pieces. */
void ferry__doc_section(struct report *rp, enum ferry_report_section sec, const char *title);
void ferry__doc_heading(struct report *rp, const char *title);
void ferry__doc_para(struct report *rp, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Write plots/NAME.gp (the terminal and output lines are prepended), run gnuplot, inline the SVG. */
ferry_status ferry__emit_plot(struct report *rp, const char *name, const char *caption, int width, int height,
                              const char *script);

/* Formatting: "%.3g"-like with fixed decimals chosen by magnitude. */
const char *ferry__fmt_num(double v, char *buf, size_t len);
/* Gnuplot script text (gpscript.c). Every string in a script goes through one of these: the
 * database is untrusted and gnuplot runs backquotes, macros and system() in its program text. */
/* A single-quoted gnuplot string (' doubled, control characters as spaces): inert. */
void ferry__gp_str(struct ferry_strbuf *b, const char *s);
/* An explicit tic label ("set xtics ('label' 1)"): gnuplot uses it as a format, so % is doubled
 * before ferry__gp_str. */
void ferry__gp_tic(struct ferry_strbuf *b, const char *s);
/* ferry__gp_str of printf-formatted text. */
void ferry__gp_strf(struct ferry_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "set WHAT 'text'\n" with the formatted text quoted by ferry__gp_str. */
void ferry__gp_set(struct ferry_strbuf *b, const char *what, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A string field of an inline datablock row (double-quoted data; quotes and control characters
 * become '). */
void ferry__gp_data(struct ferry_strbuf *b, const char *s);
/* "# text\n" with control characters as spaces. */
void ferry__gp_comment(struct ferry_strbuf *b, const char *s);
/* 1 when the script holds no program text but the report's own: every string single-quoted,
 * no backquote, macro or shell escape outside strings, datablocks and comments; else 0 and why. */
int ferry__gp_check(const char *script, char *why, size_t why_len);
/* A name safe as a file name, HTML id and Markdown link target: [A-Za-z0-9_.-], with an FNV
 * hash of the original appended when anything had to change (len >= 32 recommended). */
void ferry__safe_name(const char *name, char *out, size_t len);
/* "set logscale y" when the positive values span at least two decades. */
int ferry__spans_decades(const double *v, size_t n);

/* Sections (sections.c, timeline.c). */
ferry_status ferry__section_runs(struct report *rp);
ferry_status ferry__section_sweep(struct report *rp);
ferry_status ferry__section_bytes(struct report *rp);
ferry_status ferry__section_timeline(struct report *rp);
ferry_status ferry__section_memory(struct report *rp);
ferry_status ferry__section_sim_vs_real(struct report *rp);
ferry_status ferry__section_variants(struct report *rp, const char *key, enum ferry_report_section sec);
ferry_status ferry__section_hardware(struct report *rp);
ferry_status ferry__section_latency(struct report *rp);
ferry_status ferry__section_strategies(struct report *rp); /* strategies.c */
ferry_status ferry__section_plan(struct report *rp);
/* In the memory section: batch size and KV-cache tokens per step of run r (distributions.c). */
ferry_status ferry__plot_batch_kv(struct report *rp, const struct rrun *r);
/* "r3: executor=sim, pd=1": each run's label and the swept values that differ between these runs,
 * paths as their last component (sections.c). */
void ferry__run_labels(const struct report *rp, const struct rrun *const *runs, size_t n, char (*labels)[160]);
/* "r3 sim bl2 pd1": a run's label and its values on the sweep axes, short (sections.c). */
void ferry__run_short_label(const struct report *rp, const struct rrun *r, char *out, size_t len);

/* Engine events (events.c): the section, and dashed marks of a run's budget changes, pressure
 * transitions, reloads and device failures in [t0, t1] on a chart whose x is (t - t0) / div. */
ferry_status ferry__section_events(struct report *rp);
void ferry__events_marks(struct report *rp, const struct rrun *r, int64_t t0, int64_t t1, double div,
                         struct ferry_strbuf *s);
/* Time of the run's last budget change, transition, reload or device failure (INT64_MIN: none). */
int64_t ferry__events_last(struct report *rp, const struct rrun *r);
/* When tier's budget changed during the run: a datablock NAME of (x, budget x scale) steps from
 * `initial` through every change, to t1; returns 1 (0, nothing written, when it never changed). */
int ferry__events_budget_line(struct report *rp, const struct rrun *r, int tier, int64_t t0, int64_t t1, double div,
                              double initial, double scale, const char *name, struct ferry_strbuf *s);

/* The run chosen for the timeline and memory sections (NULL if none qualifies). */
const struct rrun *ferry__timeline_run(struct report *rp, ferry_status *st);
sqlite3 *ferry__run_db(struct report *rp, const struct rrun *r);

#endif
