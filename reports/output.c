/* The report's output primitives: growing strings, tables written at once as HTML, Markdown
 * and CSV, section headings, and plots: a gnuplot script saved next to the SVG it draws, run as
 * an external program, the SVG then inlined into index.html with its ids made unique. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/fsutil.h"
#include "reports/report_internal.h"

/* ---- strings ---------------------------------------------------------------------------- */

void ferry__rb_html(struct ferry_strbuf *b, const char *s) {
  for (; s && *s; s++) {
    switch (*s) {
      case '<': ferry__sb_puts(b, "&lt;"); break;
      case '>': ferry__sb_puts(b, "&gt;"); break;
      case '&': ferry__sb_puts(b, "&amp;"); break;
      case '"': ferry__sb_puts(b, "&quot;"); break;
      case '\'': ferry__sb_puts(b, "&#39;"); break;
      default: ferry__sb_put(b, s, 1);
    }
  }
}

void ferry__rb_md(struct ferry_strbuf *b, const char *s) {
  for (; s && *s; s++) {
    switch (*s) {
      case '<': ferry__sb_puts(b, "&lt;"); break;
      case '>': ferry__sb_puts(b, "&gt;"); break;
      case '&': ferry__sb_puts(b, "&amp;"); break;
      case '\\': case '`': case '*': case '[': case ']': case '|':
        ferry__sb_puts(b, "\\"); /* CommonMark: a backslash makes ASCII punctuation literal */
        ferry__sb_put(b, s, 1);
        break;
      default: ferry__sb_put(b, ((unsigned char)*s < 0x20 || *s == 0x7f) ? " " : s, 1);
    }
  }
}

const char *ferry__fmt_num(double v, char *buf, size_t len) {
  double a = fabs(v);
  if (isnan(v)) buf[0] = len ? (char)0 : (char)0;
  else if (a == 0) snprintf(buf, len, "0");
  else if (a >= 1e6 || a < 1e-3) snprintf(buf, len, "%.3g", v);
  else if (a >= 100) snprintf(buf, len, "%.0f", v);
  else if (a >= 10) snprintf(buf, len, "%.1f", v);
  else if (a >= 1) snprintf(buf, len, "%.2f", v);
  else snprintf(buf, len, "%.3f", v);
  return buf;
}

int ferry__spans_decades(const double *v, size_t n) {
  double lo = INFINITY, hi = 0;
  for (size_t i = 0; i < n; i++) {
    if (!(v[i] > 0) || !isfinite(v[i])) continue;
    if (v[i] < lo) lo = v[i];
    if (v[i] > hi) hi = v[i];
  }
  return hi > 0 && lo < INFINITY && hi / lo >= 100.0;
}

/* ---- tables ----------------------------------------------------------------------------- */

static void split_cells(struct rtable *t, const char *line, char **dst) {
  const char *p = line;
  for (size_t c = 0; c < t->ncols; c++) {
    const char *e = p ? strchr(p, '\x1f') : NULL;
    size_t n = p ? (e ? (size_t)(e - p) : strlen(p)) : 0;
    dst[c] = ferry__strndup(p ? p : "", n);
    if (!dst[c]) t->oom = 1;
    p = (p && e) ? e + 1 : NULL;
  }
}

struct rtable *ferry__table_new(const char *name, const char *head) {
  struct rtable *t = ferry__calloc(1, sizeof *t);
  if (!t) return NULL;
  t->ncols = 1;
  for (const char *p = head; *p; p++) t->ncols += *p == '\x1f';
  char safe[96];
  ferry__safe_name(name, safe, sizeof safe); /* names come from configuration keys: untrusted */
  t->name = ferry__strdup(safe);
  t->head = ferry__calloc(t->ncols, sizeof *t->head);
  if (!t->name || !t->head) {
    ferry__table_free(t);
    return NULL;
  }
  split_cells(t, head, t->head);
  return t;
}

void ferry__table_rowf(struct rtable *t, const char *fmt, ...) {
  if (!t || t->oom) return;
  if (t->nrows == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 16;
    char **c = ferry__reallocarray(t->cells, cap * t->ncols, sizeof *c);
    if (!c) {
      t->oom = 1;
      return;
    }
    t->cells = c;
    t->cap = cap;
  }
  struct ferry_strbuf line = {0};
  va_list ap;
  va_start(ap, fmt);
  ferry__sb_vprintf(&line, fmt, ap);
  va_end(ap);
  if (line.oom) {
    t->oom = 1;
    return;
  }
  split_cells(t, line.p ? line.p : "", t->cells + t->nrows * t->ncols);
  ferry__sb_free(&line);
  t->nrows++;
}

void ferry__table_free(struct rtable *t) {
  if (!t) return;
  for (size_t i = 0; i < t->nrows * t->ncols; i++) ferry_free(t->cells[i]);
  if (t->head)
    for (size_t i = 0; i < t->ncols; i++) ferry_free(t->head[i]);
  ferry_free(t->cells);
  ferry_free(t->head);
  ferry_free(t->name);
  ferry_free(t);
}

static int is_number(const char *s) {
  if (!*s) return 0;
  char *end;
  strtod(s, &end);
  return *end == '\0' || (end[0] == '%' && end[1] == '\0');
}

static void csv_cell(struct ferry_strbuf *b, const char *s) {
  if (!strpbrk(s, ",\"\n\r")) {
    ferry__sb_puts(b, s);
    return;
  }
  ferry__sb_puts(b, "\"");
  for (; *s; s++) {
    if (*s == '"') ferry__sb_puts(b, "\"\"");
    else ferry__sb_put(b, s, 1);
  }
  ferry__sb_puts(b, "\"");
}

static void md_cell(struct ferry_strbuf *b, const char *s) {
  ferry__sb_puts(b, " ");
  ferry__rb_md(b, s);
  ferry__sb_puts(b, " |");
}

ferry_status ferry__emit_csv(struct report *rp, struct rtable *t) {
  if (!t || t->oom) return ferry__err_set(&rp->err, FERRY_ERR_NOMEM, "report: out of memory building a table");
  struct ferry_strbuf csv = {0};
  for (size_t c = 0; c < t->ncols; c++) {
    if (c) ferry__sb_puts(&csv, ",");
    csv_cell(&csv, t->head[c]);
  }
  ferry__sb_puts(&csv, "\n");
  for (size_t r = 0; r < t->nrows; r++) {
    for (size_t c = 0; c < t->ncols; c++) {
      if (c) ferry__sb_puts(&csv, ",");
      csv_cell(&csv, t->cells[r * t->ncols + c]);
    }
    ferry__sb_puts(&csv, "\n");
  }
  if (csv.oom) {
    ferry__sb_free(&csv);
    return ferry__err_set(&rp->err, FERRY_ERR_NOMEM, "report: out of memory writing %s.csv", t->name);
  }
  char *path = ferry__asprintf("%s/tables/%s.csv", rp->dir, t->name);
  ferry_status st = path ? ferry__write_file_atomic(path, csv.p, csv.len, &rp->err)
                         : ferry__err_set(&rp->err, FERRY_ERR_NOMEM, "report: out of memory");
  ferry_free(path);
  ferry__sb_free(&csv);
  if (st == FERRY_OK) rp->sum.tables++;
  return st;
}

ferry_status ferry__emit_table(struct report *rp, struct rtable *t, const char *caption) {
  ferry_status st = ferry__emit_csv(rp, t);
  if (st != FERRY_OK) return st;

  struct ferry_strbuf *h = &rp->html;
  ferry__sb_printf(h, "<div class=\"table\" id=\"table-%s\"><table>\n<caption>", t->name);
  ferry__rb_html(h, caption);
  ferry__sb_printf(h, " <a href=\"tables/%s.csv\">%s.csv</a></caption>\n<thead><tr>", t->name, t->name);
  for (size_t c = 0; c < t->ncols; c++) {
    ferry__sb_puts(h, "<th>");
    ferry__rb_html(h, t->head[c]);
    ferry__sb_puts(h, "</th>");
  }
  ferry__sb_puts(h, "</tr></thead>\n<tbody>\n");
  for (size_t r = 0; r < t->nrows; r++) {
    ferry__sb_puts(h, "<tr>");
    for (size_t c = 0; c < t->ncols; c++) {
      const char *cell = t->cells[r * t->ncols + c];
      ferry__sb_puts(h, is_number(cell) ? "<td class=\"n\">" : "<td>");
      ferry__rb_html(h, cell);
      ferry__sb_puts(h, "</td>");
    }
    ferry__sb_puts(h, "</tr>\n");
  }
  ferry__sb_puts(h, "</tbody></table></div>\n");

  struct ferry_strbuf *m = &rp->md;
  ferry__sb_puts(m, "*");
  ferry__rb_md(m, caption);
  ferry__sb_printf(m, "* ([%s.csv](tables/%s.csv))\n\n|", t->name, t->name);
  for (size_t c = 0; c < t->ncols; c++) md_cell(m, t->head[c]);
  ferry__sb_puts(m, "\n|");
  for (size_t c = 0; c < t->ncols; c++) ferry__sb_puts(m, "---|");
  ferry__sb_puts(m, "\n");
  for (size_t r = 0; r < t->nrows; r++) {
    ferry__sb_puts(m, "|");
    for (size_t c = 0; c < t->ncols; c++) md_cell(m, t->cells[r * t->ncols + c]);
    ferry__sb_puts(m, "\n");
  }
  ferry__sb_puts(m, "\n");
  return FERRY_OK;
}

/* ---- headings and paragraphs ------------------------------------------------------------ */

void ferry__doc_section(struct report *rp, enum ferry_report_section sec, const char *title) {
  const char *id = ferry_report_section_name(sec);
  rp->sum.sections |= (unsigned)sec;
  ferry__sb_printf(&rp->html, "<section id=\"%s\">\n<h2>", id);
  ferry__rb_html(&rp->html, title);
  ferry__sb_puts(&rp->html, "</h2>\n");
  ferry__sb_printf(&rp->toc, "<li><a href=\"#%s\">", id);
  ferry__rb_html(&rp->toc, title);
  ferry__sb_puts(&rp->toc, "</a></li>\n");
  ferry__sb_puts(&rp->md, "## ");
  ferry__rb_md(&rp->md, title);
  ferry__sb_puts(&rp->md, "\n\n");
}

void ferry__doc_heading(struct report *rp, const char *title) {
  ferry__sb_puts(&rp->html, "<h3>");
  ferry__rb_html(&rp->html, title);
  ferry__sb_puts(&rp->html, "</h3>\n");
  ferry__sb_puts(&rp->md, "### ");
  ferry__rb_md(&rp->md, title);
  ferry__sb_puts(&rp->md, "\n\n");
}

void ferry__doc_para(struct report *rp, const char *fmt, ...) {
  struct ferry_strbuf t = {0};
  va_list ap;
  va_start(ap, fmt);
  ferry__sb_vprintf(&t, fmt, ap);
  va_end(ap);
  ferry__sb_puts(&rp->html, "<p>");
  ferry__rb_html(&rp->html, t.p ? t.p : "");
  ferry__sb_puts(&rp->html, "</p>\n");
  ferry__rb_md(&rp->md, t.p ? t.p : "");
  ferry__sb_puts(&rp->md, "\n\n");
  if (t.oom) rp->html.oom = 1;
  ferry__sb_free(&t);
}

/* ---- plots -------------------------------------------------------------------------------- */

/* Run gnuplot on plots/NAME.gp in the plots folder; stderr is captured for the error message.
 * Whether the program could be started at all comes back on its own close-on-exec pipe (the
 * errno of a failed chdir or exec), never mixed into gnuplot's own output. */
static ferry_status run_gnuplot(struct report *rp, const char *plots_dir, const char *name) {
  const char *given = rp->opt->gnuplot && *rp->opt->gnuplot ? rp->opt->gnuplot : "gnuplot";
  /* the child changes folder first: a relative path must not change meaning */
  char cwd[4096];
  char *prog = strchr(given, '/') && given[0] != '/' && getcwd(cwd, sizeof cwd) ? ferry__path_join(cwd, given)
                                                                                 : ferry__strdup(given);
  if (!prog) return ferry__err_set(&rp->err, FERRY_ERR_NOMEM, "report: out of memory");
  char script[300];
  snprintf(script, sizeof script, "%s.gp", name);
  int fds[2] = {-1, -1}, efd[2] = {-1, -1};
  ferry_status st = FERRY_OK;
  if (pipe(fds) != 0 || pipe2(efd, O_CLOEXEC) != 0) {
    st = ferry__err_set(&rp->err, FERRY_ERR_IO, "report: pipe: %s", strerror(errno));
    goto out;
  }
  pid_t pid = fork();
  if (pid < 0) {
    st = ferry__err_set(&rp->err, FERRY_ERR_IO, "report: fork: %s", strerror(errno));
    goto out;
  }
  if (pid == 0) {
    close(fds[0]);
    close(efd[0]);
    int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
      dup2(devnull, 0);
      dup2(devnull, 1);
    }
    dup2(fds[1], 2);
    int failure[2] = {0, 0}; /* {0 = chdir, 1 = exec; errno} */
    if (chdir(plots_dir) == 0) {
      execlp(prog, prog, script, (char *)NULL);
      failure[0] = 1;
    }
    failure[1] = errno;
    ssize_t w = write(efd[1], failure, sizeof failure);
    (void)w;
    _exit(127);
  }
  close(fds[1]);
  close(efd[1]);
  fds[1] = efd[1] = -1;
  char err[2048];
  size_t n = 0;
  for (;;) {
    char chunk[512];
    ssize_t got = read(fds[0], chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    size_t take = (size_t)got < sizeof err - 1 - n ? (size_t)got : sizeof err - 1 - n;
    memcpy(err + n, chunk, take);
    n += take;
  }
  err[n] = '\0';
  int failure[2];
  ssize_t got;
  while ((got = read(efd[0], failure, sizeof failure)) < 0 && errno == EINTR) {
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (got == (ssize_t)sizeof failure) {
    if (failure[0])
      st = ferry__err_set(&rp->err, FERRY_ERR_NOT_FOUND,
                          "report: cannot run gnuplot '%s' (%s); install the Debian package gnuplot-nox or give --gnuplot PATH",
                          prog, strerror(failure[1]));
    else
      st = ferry__err_set(&rp->err, FERRY_ERR_IO, "report: %s: cannot enter the folder: %s", plots_dir, strerror(failure[1]));
    goto out;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    /* first line that says what went wrong */
    char *line = err;
    while (*line == '\n' || *line == ' ') line++;
    char *nl = strchr(line, '\n');
    char *errline = strstr(err, "rror");
    if (errline) {
      while (errline > err && errline[-1] != '\n') errline--;
      line = errline;
      nl = strchr(line, '\n');
    }
    if (nl) *nl = '\0';
    for (char *c = line; *c; c++) /* it may quote the script: no terminal controls */
      if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = ' ';
    char how[64] = "";
    if (WIFSIGNALED(status)) snprintf(how, sizeof how, " (killed by signal %d)", WTERMSIG(status));
    else if (WIFEXITED(status)) snprintf(how, sizeof how, " (exit status %d)", WEXITSTATUS(status));
    st = ferry__err_set(&rp->err, FERRY_ERR_INTERNAL, "report: gnuplot failed on plots/%s.gp%s: %s", name, how,
                        *line ? line : "no message");
  }
out:
  for (int i = 0; i < 2; i++) {
    if (fds[i] >= 0) close(fds[i]);
    if (efd[i] >= 0) close(efd[i]);
  }
  ferry_free(prog);
  return st;
}

/* Append the SVG to the HTML without its XML prolog, with every id prefixed so that several
 * gnuplot figures (which all use the same ids) can live in one document. */
static void inline_svg(struct ferry_strbuf *h, const char *svg, size_t plot_no) {
  const char *p = strstr(svg, "<svg");
  if (!p) return;
  char prefix[32];
  snprintf(prefix, sizeof prefix, "p%zu_", plot_no);
  while (*p) {
    static const char *const pats[] = {"id='", "id=\"", "href='#", "href=\"#", "url(#"};
    size_t k;
    for (k = 0; k < sizeof pats / sizeof pats[0]; k++)
      if (!strncmp(p, pats[k], strlen(pats[k]))) break;
    if (k < sizeof pats / sizeof pats[0]) {
      ferry__sb_puts(h, pats[k]);
      ferry__sb_puts(h, prefix);
      p += strlen(pats[k]);
    } else {
      ferry__sb_put(h, p, 1);
      p++;
    }
  }
}

ferry_status ferry__emit_plot(struct report *rp, const char *plot_name, const char *caption, int width, int height,
                              const char *script) {
  char name[96];
  ferry__safe_name(plot_name, name, sizeof name);
  struct ferry_strbuf s = {0};
  ferry__gp_comment(&s, caption);
  ferry__sb_printf(&s, "# Redraw with: gnuplot %s.gp (writes %s.svg; the data is inline below)\n", name, name);
  ferry__sb_printf(&s, "set terminal svg size %d,%d dynamic noenhanced font 'Helvetica,12' background rgb 'white'\n"
                       "set output ", width, height);
  ferry__gp_strf(&s, "%s.svg", name);
  ferry__sb_puts(&s,
                   "\nset encoding utf8\n"
                   "set grid lc rgb '#dddddd'\n"
                   "set border lc rgb '#555555'\n"
                   "set key noopaque box lc rgb '#cccccc'\n"
                   "set linetype 1 lc rgb '#1f77b4' lw 2 pt 7 ps 0.8\n"
                   "set linetype 2 lc rgb '#ff7f0e' lw 2 pt 5 ps 0.8\n"
                   "set linetype 3 lc rgb '#2ca02c' lw 2 pt 9 ps 0.9\n"
                   "set linetype 4 lc rgb '#d62728' lw 2 pt 11 ps 0.9\n"
                   "set linetype 5 lc rgb '#9467bd' lw 2 pt 13 ps 0.9\n"
                   "set linetype 6 lc rgb '#8c564b' lw 2 pt 15 ps 0.9\n"
                   "set linetype 7 lc rgb '#e377c2' lw 2 pt 7 ps 0.8\n"
                   "set linetype 8 lc rgb '#7f7f7f' lw 2 pt 5 ps 0.8\n"
                   "set linetype 9 lc rgb '#bcbd22' lw 2 pt 9 ps 0.9\n"
                   "set linetype 10 lc rgb '#17becf' lw 2 pt 11 ps 0.9\n"
                   "set linetype cycle 10\n");
  ferry__sb_puts(&s, script);
  if (s.oom) {
    ferry__sb_free(&s);
    return ferry__err_set(&rp->err, FERRY_ERR_NOMEM, "report: out of memory building plot %s", name);
  }
  char why[128];
  if (!ferry__gp_check(s.p, why, sizeof why)) {
    /* a string that bypassed ferry__gp_str: never hand it to gnuplot */
    ferry__sb_free(&s);
    return ferry__err_set(&rp->err, FERRY_ERR_INTERNAL, "report: plot %s: unsafe gnuplot script (%s); not run", name, why);
  }
  char *plots = ferry__asprintf("%s/plots", rp->dir);
  char *gp = ferry__asprintf("%s/plots/%s.gp", rp->dir, name);
  char *svgp = ferry__asprintf("%s/plots/%s.svg", rp->dir, name);
  char *svg = NULL;
  size_t svg_len = 0;
  ferry_status st;
  if (!plots || !gp || !svgp) {
    st = ferry__err_set(&rp->err, FERRY_ERR_NOMEM, "report: out of memory");
    goto out;
  }
  if ((st = ferry__write_file_atomic(gp, s.p, s.len, &rp->err)) != FERRY_OK) goto out;
  if ((st = run_gnuplot(rp, plots, name)) != FERRY_OK) goto out;
  if ((st = ferry__read_file(svgp, (size_t)256 << 20, &svg, &svg_len, &rp->err)) != FERRY_OK) goto out;
  if (!strstr(svg, "<svg") || !strstr(svg, "</svg>")) {
    st = ferry__err_set(&rp->err, FERRY_ERR_INTERNAL, "report: gnuplot wrote no SVG document to plots/%s.svg", name);
    goto out;
  }
  rp->sum.plots++;
  struct ferry_strbuf *h = &rp->html;
  ferry__sb_printf(h, "<figure id=\"fig-%s\">\n<div class=\"svg\">", name);
  inline_svg(h, svg, rp->sum.plots);
  ferry__sb_puts(h, "</div>\n<figcaption>");
  ferry__rb_html(h, caption);
  ferry__sb_printf(h, " <a href=\"plots/%s.gp\">gnuplot script</a> · <a href=\"plots/%s.svg\">SVG</a></figcaption>\n</figure>\n",
                   name, name);
  ferry__sb_printf(&rp->md, "![%s](plots/%s.svg)\n\n*", name, name);
  ferry__rb_md(&rp->md, caption);
  ferry__sb_printf(&rp->md, "* (script: [plots/%s.gp](plots/%s.gp))\n\n", name, name);
out:
  ferry__sb_free(&s);
  ferry_free(plots);
  ferry_free(gp);
  ferry_free(svgp);
  ferry_free(svg);
  return st;
}
