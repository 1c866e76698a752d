/* ferry_report_write(): load the databases, write every section that the data allows into a
 * temporary sibling of the output folder (HTML body, Markdown, CSVs, gnuplot scripts and
 * SVGs), then assemble index.html and report.md and rename the folder into place. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/alloc.h"
#include "common/fsutil.h"
#include "reports/report_internal.h"
#include "reports/routing_sections.h"

/* The file every report folder holds: only a folder with it (or an empty one) is replaced. */
#define REPORT_MARKER ".ferry-report"

void ferry_report_options_init(struct ferry_report_options *opt) {
  memset(opt, 0, sizeof *opt);
  opt->timeline_run = -1;
  opt->step_first = -1;
  opt->step_last = -1;
}

const char *ferry_report_section_name(enum ferry_report_section section) {
  switch (section) {
    case FERRY_REPORT_RUNS: return "runs";
    case FERRY_REPORT_SWEEP: return "sweep";
    case FERRY_REPORT_BYTES: return "bytes";
    case FERRY_REPORT_TIMELINE: return "timeline";
    case FERRY_REPORT_MEMORY: return "memory";
    case FERRY_REPORT_SIM_VS_REAL: return "sim-vs-real";
    case FERRY_REPORT_QUANT: return "quantization";
    case FERRY_REPORT_PREDICTOR: return "predictors";
    case FERRY_REPORT_HARDWARE: return "hardware";
    case FERRY_REPORT_PREDICTOR_CI: return "predictor-intervals";
    case FERRY_REPORT_ROUTING: return "routing";
    case FERRY_REPORT_LATENCY: return "latency";
    case FERRY_REPORT_STRATEGIES: return "strategies";
    case FERRY_REPORT_EVENTS: return "events";
    case FERRY_REPORT_PLAN: return "plan";
  }
  return "?";
}

static const char css[] =
    "body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:0 auto;max-width:1240px;"
    "padding:0 24px 48px;color:#222;line-height:1.45}"
    "h1{font-size:1.7em;margin:28px 0 4px}h2{font-size:1.35em;border-bottom:2px solid #1f77b4;padding-bottom:4px;"
    "margin-top:40px}h3{font-size:1.1em;margin-top:28px}"
    ".meta{color:#666;margin:0 0 16px}nav ul{columns:2;padding-left:18px}"
    "figure{margin:18px 0;padding:0}figure .svg svg{width:100%;height:auto;max-width:1200px}"
    "figcaption{color:#444;font-size:.92em;margin-top:4px}"
    ".table{overflow-x:auto;margin:14px 0}table{border-collapse:collapse;font-size:.86em}"
    "caption{text-align:left;color:#444;padding:4px 0;caption-side:top}"
    "th,td{border:1px solid #ddd;padding:3px 8px;white-space:nowrap}th{background:#f3f6fa;text-align:left}"
    "td.n{text-align:right;font-variant-numeric:tabular-nums}tbody tr:nth-child(even){background:#fafafa}"
    "a{color:#1f5f9f}";

static ferry_status write_text(struct report *rp, const char *name, const struct ferry_strbuf *b) {
  if (b->oom) return ferry__err_set(&rp->err, FERRY_ERR_NOMEM, "report: out of memory writing %s", name);
  char *path = ferry__path_join(rp->dir, name);
  if (!path) return ferry__err_set(&rp->err, FERRY_ERR_NOMEM, "report: out of memory");
  ferry_status st = ferry__write_file_atomic(path, b->p ? b->p : "", b->len, &rp->err);
  ferry_free(path);
  return st;
}

static ferry_status assemble(struct report *rp) {
  const struct ferry_report_options *o = rp->opt;
  const char *title = o->title && *o->title ? o->title : "ferry report";
  char when[64];
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", &tm);
  struct ferry_strbuf h = {0}, m = {0};
  ferry__sb_puts(&h, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                     "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>");
  ferry__rb_html(&h, title);
  ferry__sb_printf(&h, "</title>\n<style>%s</style>\n</head>\n<body>\n<h1>", css);
  ferry__rb_html(&h, title);
  ferry__sb_puts(&h, "</h1>\n<p class=\"meta\">");
  ferry__sb_printf(&h, "%zu runs (%zu complete, %zu failed or incomplete) from ", rp->sum.runs, rp->sum.complete,
                   rp->sum.failed);
  ferry__sb_puts(&m, "# ");
  ferry__rb_md(&m, title);
  ferry__sb_printf(&m, "\n\n%zu runs (%zu complete, %zu failed or incomplete) from ", rp->sum.runs, rp->sum.complete,
                   rp->sum.failed);
  for (size_t i = 0; i < o->n_dbs; i++) {
    ferry__sb_puts(&h, i ? ", " : "");
    ferry__sb_puts(&h, "<code>");
    ferry__rb_html(&h, o->db_paths[i]);
    ferry__sb_puts(&h, "</code>");
    ferry__sb_puts(&m, i ? ", " : "");
    ferry__rb_md(&m, o->db_paths[i]);
  }
  ferry__sb_printf(&h, "; written %s by ferry %s. Tables are in <code>tables/</code> as CSV, plots in "
                       "<code>plots/</code> with the gnuplot script that drew each.</p>\n<nav><ul>\n",
                   when, FERRY_VERSION);
  ferry__sb_printf(&m, "; written %s by ferry %s.\n\n", when, FERRY_VERSION);
  ferry__sb_put(&h, rp->toc.p ? rp->toc.p : "", rp->toc.len);
  ferry__sb_puts(&h, "</ul></nav>\n");
  ferry__sb_put(&h, rp->html.p ? rp->html.p : "", rp->html.len);
  ferry__sb_puts(&h, "</body>\n</html>\n");
  ferry__sb_put(&m, rp->md.p ? rp->md.p : "", rp->md.len);
  ferry_status st = write_text(rp, "index.html", &h);
  if (st == FERRY_OK) st = write_text(rp, "report.md", &m);
  if (st == FERRY_OK) {
    struct ferry_strbuf mk = {0};
    ferry__sb_printf(&mk, "ferry report %s: this folder is replaced by the next report written here\n", FERRY_VERSION);
    st = write_text(rp, REPORT_MARKER, &mk);
    ferry__sb_free(&mk);
  }
  ferry__sb_free(&h);
  ferry__sb_free(&m);
  return st;
}

/* A fresh temporary folder next to out_dir (same file system, so the final rename is atomic). */
static ferry_status make_tmp_dir(struct report *rp, const char *out) {
  char *tmpl = ferry__asprintf("%s.partial-XXXXXX", out);
  if (!tmpl) return ferry__err_set(&rp->err, FERRY_ERR_NOMEM, "report: out of memory");
  char *parent = ferry__strdup(out);
  if (!parent) {
    ferry_free(tmpl);
    return ferry__err_set(&rp->err, FERRY_ERR_NOMEM, "report: out of memory");
  }
  char *slash = strrchr(parent, '/');
  ferry_status st = FERRY_OK;
  if (slash && slash != parent) {
    *slash = '\0';
    st = ferry__mkdir_p(parent, &rp->err);
  }
  ferry_free(parent);
  if (st != FERRY_OK) {
    ferry_free(tmpl);
    return st;
  }
  if (!mkdtemp(tmpl)) {
    st = ferry__err_set(&rp->err, FERRY_ERR_IO, "%s: cannot create the report folder: %s", out, strerror(errno));
    ferry_free(tmpl);
    return st;
  }
  rp->dir = tmpl;
  chmod(tmpl, 0755);
  char *sub = ferry__path_join(tmpl, "plots");
  if (!sub || mkdir(sub, 0755) != 0) st = ferry__err_set(&rp->err, FERRY_ERR_IO, "%s: cannot create plots/", tmpl);
  ferry_free(sub);
  sub = ferry__path_join(tmpl, "tables");
  if (st == FERRY_OK && (!sub || mkdir(sub, 0755) != 0))
    st = ferry__err_set(&rp->err, FERRY_ERR_IO, "%s: cannot create tables/", tmpl);
  ferry_free(sub);
  return st;
}

/* Whether out may be replaced: absent, an empty folder, or a previous report; *exists says
 * whether there is something to move aside. */
static ferry_status check_replaceable(struct ferry_err *err, const char *out, int *exists) {
  struct stat sb;
  *exists = 0;
  if (lstat(out, &sb) != 0) return FERRY_OK;
  *exists = 1;
  if (!S_ISDIR(sb.st_mode))
    return ferry__err_set(err, FERRY_ERR_EXISTS, "%s: exists and is not a folder; not replacing it", out);
  char *marker = ferry__path_join(out, REPORT_MARKER);
  if (!marker) return ferry__err_set(err, FERRY_ERR_NOMEM, "report: out of memory");
  int is_report = lstat(marker, &sb) == 0 && S_ISREG(sb.st_mode);
  ferry_free(marker);
  if (is_report) return FERRY_OK;
  DIR *d = opendir(out);
  if (!d) return ferry__err_set(err, FERRY_ERR_IO, "%s: cannot read the folder: %s", out, strerror(errno));
  struct dirent *e;
  int empty = 1;
  while (empty && (e = readdir(d)) != NULL) empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
  closedir(d);
  if (!empty)
    return ferry__err_set(err, FERRY_ERR_EXISTS,
                          "%s: exists and is not a ferry report (no " REPORT_MARKER " in it); not replacing it: "
                          "remove it or give another --out", out);
  return FERRY_OK;
}

/* Move the finished folder into place; a previous report there is replaced. */
static ferry_status publish(struct report *rp, const char *out) {
  char *old = NULL;
  int exists;
  ferry_status st0 = check_replaceable(&rp->err, out, &exists); /* again: it may have changed meanwhile */
  if (st0 != FERRY_OK) return st0;
  if (exists) {
    old = ferry__asprintf("%s.old-XXXXXX", out);
    if (!old || !mkdtemp(old)) {
      ferry_free(old);
      return ferry__err_set(&rp->err, FERRY_ERR_IO, "%s: cannot make room for the new report: %s", out, strerror(errno));
    }
    if (rename(out, old) != 0) {
      ferry_status st = ferry__err_set(&rp->err, FERRY_ERR_IO, "%s: cannot move the old report aside: %s", out, strerror(errno));
      ferry__rm_rf(old);
      ferry_free(old);
      return st;
    }
  }
  if (rename(rp->dir, out) != 0) {
    ferry_status st = ferry__err_set(&rp->err, FERRY_ERR_IO, "%s: cannot move the report into place: %s", out, strerror(errno));
    if (old) rename(old, out);
    ferry_free(old);
    return st;
  }
  if (old) ferry__rm_rf(old);
  ferry_free(old);
  return FERRY_OK;
}

ferry_status ferry_report_write(const struct ferry_report_options *opt, struct ferry_report_summary *summary) {
  if (summary) memset(summary, 0, sizeof *summary);
  if (!opt || !opt->db_paths || opt->n_dbs == 0) return ferry__fail(FERRY_ERR_INVALID, "report: no database given");
  if (!opt->out_dir || !*opt->out_dir) return ferry__fail(FERRY_ERR_INVALID, "report: no output folder given");
  struct report rp;
  memset(&rp, 0, sizeof rp);
  rp.opt = opt;
  char *out = ferry__strdup(opt->out_dir);
  if (!out) return ferry__fail(FERRY_ERR_NOMEM, "report: out of memory");
  size_t len = strlen(out);
  while (len > 1 && out[len - 1] == '/') out[--len] = '\0';
  /* the folder is replaced at the end: it must not be, nor hold, a database being read */
  struct ferry_path_use *uses = ferry__calloc(opt->n_dbs + 1, sizeof *uses);
  if (!uses) {
    ferry_free(out);
    return ferry__fail(FERRY_ERR_NOMEM, "report: out of memory");
  }
  uses[0] = (struct ferry_path_use){"--out", out, FERRY_PATH_OUT | FERRY_PATH_DIR};
  for (size_t i = 0; i < opt->n_dbs; i++) uses[i + 1] = (struct ferry_path_use){"--db", opt->db_paths[i], FERRY_PATH_SQLITE};
  ferry_status st = ferry__check_paths(uses, opt->n_dbs + 1);
  ferry_free(uses);
  if (st != FERRY_OK) {
    ferry_free(out);
    return st;
  }
  int exists;
  st = check_replaceable(&rp.err, out, &exists); /* refuse before the work, not after */
  if (st == FERRY_OK) st = ferry__report_load(&rp);
  if (st == FERRY_OK && opt->timeline_run >= 0) ferry__timeline_run(&rp, &st); /* fail early on a bad run id */
  if (st == FERRY_OK) st = make_tmp_dir(&rp, out);
  if (st == FERRY_OK) st = ferry__section_runs(&rp);
  if (st == FERRY_OK) st = ferry__section_sweep(&rp);
  if (st == FERRY_OK) st = ferry__section_latency(&rp);
  if (st == FERRY_OK) st = ferry__section_bytes(&rp);
  if (st == FERRY_OK) st = ferry__section_strategies(&rp);
  if (st == FERRY_OK) st = ferry__section_timeline(&rp);
  if (st == FERRY_OK) st = ferry__section_memory(&rp);
  if (st == FERRY_OK) st = ferry__section_events(&rp);
  if (st == FERRY_OK) st = ferry__section_sim_vs_real(&rp);
  if (st == FERRY_OK) st = ferry__section_variants(&rp, "quant", FERRY_REPORT_QUANT);
  if (st == FERRY_OK) st = ferry__section_variants(&rp, "predictor", FERRY_REPORT_PREDICTOR);
  if (st == FERRY_OK) st = ferry__section_predictor_ci(&rp);
  if (st == FERRY_OK) st = ferry__section_routing(&rp);
  if (st == FERRY_OK) st = ferry__section_hardware(&rp);
  if (st == FERRY_OK) st = ferry__section_plan(&rp);
  if (st == FERRY_OK) st = assemble(&rp);
  if (st == FERRY_OK) st = publish(&rp, out);
  if (st != FERRY_OK && rp.dir) ferry__rm_rf(rp.dir);
  if (st != FERRY_OK) ferry__err_copy(NULL, &rp.err);
  if (st == FERRY_OK && summary) *summary = rp.sum;
  ferry__report_unload(&rp);
  ferry__sb_free(&rp.html);
  ferry__sb_free(&rp.md);
  ferry__sb_free(&rp.toc);
  ferry_free(rp.dir);
  ferry_free(out);
  return st;
}
