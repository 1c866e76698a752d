/* `ferry db diff A B`: each side is one run, a list of runs or a repeat group, in its own
 * database or --db. Runs that did not complete are refused (their metrics cover part of the
 * work), and so are sides that are not like with like (another kind of run, another
 * configuration) unless --force; the library compares the metrics (ferry_db_compare_groups)
 * and this prints the table, the verdict and the exit code. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/db_diff.h"
#include "common/alloc.h"
#include "common/fsutil.h"
#include "common/units.h"
#include "ferry/db.h"

/* Runs on one side at most (a repeat group is a handful; this bounds the work). */
#define MAX_SIDE_RUNS 1000

struct side {
  const char *name; /* "A" or "B" */
  char *path;       /* owned */
  ferry_db *db;
  struct ferry_run_summary *all; /* every run of the database (owned) */
  size_t n_all;
  int64_t *ids; /* owned */
  size_t n;
  const struct ferry_run_summary **rows; /* the selected runs, in all (owned array) */
  struct ferry_run_stats *stats;         /* owned */
};

int db_parse_tolerance(const char *text, double *pct) {
  if (!text) {
    *pct = 5.0;
    return 0;
  }
  char buf[64];
  snprintf(buf, sizeof buf, "%s", text);
  size_t n = strlen(buf);
  const int percent = n && buf[n - 1] == '%';
  if (percent) buf[n - 1] = '\0';
  double v;
  if (cli_parse_double("--tolerance", buf, 0.0, percent ? 1e6 : 1e4, &v)) return CLI_USAGE;
  if (!percent && v >= 1.0)
    return cli_usage_error("db",
                           "--tolerance %s: a number without '%%' is a fraction (0.05 is five percent); write %s%% "
                           "for %s percent",
                           text, buf, buf);
  *pct = percent ? v : v * 100.0;
  return 0;
}

/* "3", "1,2,3", "1-5", "1-3,7": 0 with the ids (owned), -1 when the text is not that. */
static int parse_ids(const char *text, int64_t **out, size_t *n) {
  *out = NULL;
  *n = 0;
  if (!text || !*text) return -1;
  int64_t *ids = NULL;
  size_t len = 0, cap = 0;
  const char *p = text;
  while (*p) {
    char *end;
    if (*p < '0' || *p > '9') goto bad;
    long long lo = strtoll(p, &end, 10), hi = lo;
    p = end;
    if (*p == '-') {
      if (p[1] < '0' || p[1] > '9') goto bad;
      hi = strtoll(p + 1, &end, 10);
      p = end;
    }
    if (lo < 1 || hi < lo || hi - lo >= MAX_SIDE_RUNS) goto bad;
    for (long long id = lo; id <= hi; id++) {
      if (len == MAX_SIDE_RUNS) goto bad;
      if (len == cap) {
        cap = cap ? cap * 2 : 8;
        int64_t *q = ferry__reallocarray(ids, cap, sizeof *q);
        if (!q) goto bad;
        ids = q;
      }
      ids[len++] = id;
    }
    if (*p == ',') p++;
    else if (*p) goto bad;
  }
  *out = ids;
  *n = len;
  return 0;
bad:
  ferry_free(ids);
  return -1;
}

/* [DB:]RUNS: the database is what comes before the last ':' when what follows are run ids. */
static int parse_side(const char *arg, const char *dflt_db, struct side *s) {
  const char *colon = strrchr(arg, ':');
  if (colon && colon != arg && parse_ids(colon + 1, &s->ids, &s->n) == 0) {
    s->path = ferry__strndup(arg, (size_t)(colon - arg));
  } else if (parse_ids(arg, &s->ids, &s->n) == 0) {
    if (!dflt_db)
      return cli_usage_error("db", "diff %s '%s': give DB:RUNS, or --db FILE for the database", s->name, arg);
    s->path = ferry__strdup(dflt_db);
  } else {
    return cli_usage_error("db",
                           "diff %s '%s': expected [DB:]RUNS, RUNS being a run id, a list (1,2,3) or a range (1-5)",
                           s->name, arg);
  }
  if (!s->path) return cli_fail(FERRY_ERR_NOMEM, "out of memory");
  return 0;
}

static const struct ferry_run_summary *find_run(const struct side *s, int64_t id) {
  for (size_t i = 0; i < s->n_all; i++)
    if (s->all[i].id == id) return &s->all[i];
  return NULL;
}

static int same_text(const char *a, const char *b) { return (!a && !b) || (a && b && !strcmp(a, b)); }

/* A run of a repeat group stands for the group. */
static int expand_group(struct side *s) {
  if (s->n != 1) return 0;
  const struct ferry_run_summary *r = find_run(s, s->ids[0]);
  if (!r || !r->repeat_group) return 0;
  size_t k = 0;
  for (size_t i = 0; i < s->n_all; i++) k += same_text(s->all[i].repeat_group, r->repeat_group);
  int64_t *ids = ferry__calloc(k, sizeof *ids);
  if (!ids) return cli_fail(FERRY_ERR_NOMEM, "out of memory");
  k = 0;
  for (size_t i = 0; i < s->n_all; i++)
    if (same_text(s->all[i].repeat_group, r->repeat_group)) ids[k++] = s->all[i].id;
  ferry_free(s->ids);
  s->ids = ids;
  s->n = k;
  return 0;
}

static int open_side(struct side *s) {
  ferry_status st = ferry_db_open(&s->db, s->path, FERRY_DB_READ_ONLY);
  if (st == FERRY_OK) st = ferry_db_list_runs(s->db, &s->all, &s->n_all);
  if (st != FERRY_OK) return cli_fail(st, NULL);
  for (size_t i = 0; i < s->n_all; i++) {
    cli_scrub(s->all[i].error);
    cli_scrub(s->all[i].config_hash);
    cli_scrub(s->all[i].kind);
  }
  return 0;
}

/* The selected runs' rows and statistics. */
static int load_side(struct side *s, int allow_incomplete) {
  s->rows = ferry__calloc(s->n, sizeof *s->rows);
  s->stats = ferry__calloc(s->n, sizeof *s->stats);
  if (!s->rows || !s->stats) return cli_fail(FERRY_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < s->n; i++) {
    const struct ferry_run_summary *r = find_run(s, s->ids[i]);
    if (!r) return cli_fail(FERRY_ERR_NOT_FOUND, "%s: no run %lld", s->path, (long long)s->ids[i]);
    s->rows[i] = r;
    /* a run that did not complete measured only part of the work: a diff against it would
     * report whatever it happened to reach, typically "no regression" */
    if (r->complete != 1) {
      char why[300];
      if (r->error) snprintf(why, sizeof why, "failed: %.250s", r->error);
      else snprintf(why, sizeof why, "%s", r->finished_at ? "failed" : "killed, or still running");
      if (!allow_incomplete)
        return cli_fail(FERRY_ERR_INVALID,
                        "%s: run %lld did not complete (%s); its metrics cover only part of the work. Compare "
                        "complete runs, or pass --allow-incomplete",
                        s->path, (long long)r->id, why);
      fprintf(stderr, "ferry: warning: run %lld did not complete (%s)\n", (long long)r->id, why);
    }
    ferry_status st = ferry_db_run_stats(s->db, r->id, &s->stats[i]);
    if (st != FERRY_OK) return cli_fail(st, NULL);
  }
  return 0;
}

static void side_free(struct side *s) {
  ferry_db_close(s->db);
  ferry_db_runs_free(s->all, s->n_all);
  ferry_free(s->path);
  ferry_free(s->ids);
  ferry_free(s->rows);
  ferry_free(s->stats);
}

/* "1-5" or "1,3,4": the side's ids compactly. */
static void ids_text(const struct side *s, char *buf, size_t len) {
  size_t used = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < s->n && used + 24 < len;) {
    size_t j = i;
    while (j + 1 < s->n && s->ids[j + 1] == s->ids[j] + 1) j++;
    int w = j > i ? snprintf(buf + used, len - used, "%s%lld-%lld", i ? "," : "", (long long)s->ids[i],
                             (long long)s->ids[j])
                  : snprintf(buf + used, len - used, "%s%lld", i ? "," : "", (long long)s->ids[i]);
    used += (size_t)w;
    i = j + 1;
  }
}

/* Up to `max` configuration keys whose values differ, as "key A -> B". */
static void config_differences(const char *ja, const char *jb, char *out, size_t len) {
  out[0] = '\0';
  cJSON *a = ja ? cJSON_Parse(ja) : NULL, *b = jb ? cJSON_Parse(jb) : NULL;
  if (!cJSON_IsObject(a) || !cJSON_IsObject(b)) {
    snprintf(out, len, "%s", !a || !b ? "a configuration is missing" : "a configuration does not parse");
    goto out;
  }
  size_t used = 0;
  int shown = 0, more = 0;
  for (int pass = 0; pass < 2; pass++) {
    const cJSON *x = pass ? b : a, *y = pass ? a : b, *e;
    cJSON_ArrayForEach(e, x) {
      const cJSON *o = cJSON_GetObjectItemCaseSensitive(y, e->string);
      if (pass && o) continue; /* compared in the first pass */
      char *ta = cJSON_PrintUnformatted(pass ? o : e), *tb = cJSON_PrintUnformatted(pass ? e : o);
      if (!same_text(ta, tb)) {
        if (shown < 6 && used + 8 < len) {
          int w = snprintf(out + used, len - used, "%s%s %.60s -> %.60s", shown ? ", " : "", e->string,
                           ta ? ta : "(absent)", tb ? tb : "(absent)");
          used = w > 0 && (size_t)w < len - used ? used + (size_t)w : len - 1;
          shown++;
        } else {
          more++;
        }
      }
      cJSON_free(ta);
      cJSON_free(tb);
    }
  }
  if (more && used + 16 < len) snprintf(out + used, len - used, " and %d more", more);
out:
  cli_scrub(out);
  cJSON_Delete(a);
  cJSON_Delete(b);
}

/* Like with like: one kind and one configuration within a side and across the sides. */
static int check_alike(const struct side *a, const struct side *b, int force) {
  const struct side *sides[2] = {a, b};
  for (int k = 0; k < 2; k++) {
    const struct side *s = sides[k];
    for (size_t i = 1; i < s->n; i++) {
      const struct ferry_run_summary *r0 = s->rows[0], *r = s->rows[i];
      if (!strcmp(r0->kind, r->kind) && same_text(r0->config_hash, r->config_hash)) continue;
      char diffs[600];
      config_differences(r0->config_json, r->config_json, diffs, sizeof diffs);
      if (!force)
        return cli_fail(FERRY_ERR_INVALID,
                        "diff %s: runs %lld and %lld of %s are not repeats of one measurement (%s %s, %s); pass "
                        "--force to pool them",
                        s->name, (long long)r0->id, (long long)r->id, s->path, r0->kind, r->kind, diffs);
      fprintf(stderr, "ferry: warning: %s pools runs of different configurations (%s)\n", s->name, diffs);
    }
  }
  const struct ferry_run_summary *ra = a->rows[0], *rb = b->rows[0];
  if (strcmp(ra->kind, rb->kind)) {
    if (!force)
      return cli_fail(FERRY_ERR_INVALID,
                      "diff: A is a %s run and B a %s run: a %s run does not predict a %s run's figures; compare "
                      "like with like, or pass --force",
                      ra->kind, rb->kind, ra->kind, rb->kind);
    fprintf(stderr, "ferry: warning: comparing a %s run with a %s run (--force)\n", ra->kind, rb->kind);
  }
  if (!same_text(ra->config_hash, rb->config_hash)) {
    char diffs[600];
    config_differences(ra->config_json, rb->config_json, diffs, sizeof diffs);
    if (!force)
      return cli_fail(FERRY_ERR_INVALID,
                      "diff: A and B ran different configurations (%s); a regression test compares the same "
                      "configuration on two builds. Pass --force to compare them anyway",
                      diffs);
    fprintf(stderr, "ferry: warning: A and B ran different configurations (--force): %s\n", diffs);
  }
  return 0;
}

static const char *change_text(double pct, char *buf, size_t len) {
  if (isinf(pct)) snprintf(buf, len, "%s", pct > 0 ? "+inf%" : "-inf%");
  else if (isnan(pct)) snprintf(buf, len, "n/a");
  else snprintf(buf, len, "%+.2f%%", pct);
  return buf;
}

/* Byte counts as integers, times and rates with three decimals. */
static const char *value_text(double v, char *buf, size_t len) {
  if (fabs(v) >= 1e6) snprintf(buf, len, "%.0f", v);
  else snprintf(buf, len, "%.3f", v);
  return buf;
}

static cJSON *side_json(const struct side *s) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "database", s->path);
  cJSON *ids = cJSON_AddArrayToObject(o, "runs");
  for (size_t i = 0; i < s->n; i++) cJSON_AddItemToArray(ids, cJSON_CreateNumber((double)s->ids[i]));
  cJSON_AddStringToObject(o, "kind", s->rows[0]->kind);
  cli_json_str(o, "config_hash", s->rows[0]->config_hash);
  cli_json_str(o, "repeat_group", s->n > 1 ? s->rows[0]->repeat_group : NULL);
  cli_json_str(o, "git_rev", s->rows[0]->git_rev);
  return o;
}

static int print_json(const struct db_diff_opts *o, const struct side *a, const struct side *b, double tol,
                      double alpha, const struct ferry_metric_delta *d, size_t n, enum ferry_verdict verdict,
                      int tested) {
  cJSON *doc = cJSON_CreateObject();
  cJSON_AddStringToObject(doc, "schema", "ferry.db.diff.v1");
  cJSON_AddItemToObject(doc, "a", side_json(a));
  cJSON_AddItemToObject(doc, "b", side_json(b));
  cJSON_AddNumberToObject(doc, "tolerance_pct", tol);
  cJSON_AddNumberToObject(doc, "alpha", alpha);
  cJSON_AddStringToObject(doc, "method", tested ? "mann-whitney-u" : "tolerance");
  cJSON_AddStringToObject(doc, "verdict", ferry_verdict_name(verdict));
  cJSON *arr = cJSON_AddArrayToObject(doc, "metrics");
  for (size_t i = 0; i < n; i++) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "name", d[i].name);
    cli_json_num(m, "a", d[i].a);
    cli_json_num(m, "b", d[i].b);
    if (isinf(d[i].change_pct)) cJSON_AddStringToObject(m, "change_pct", d[i].change_pct > 0 ? "+inf" : "-inf");
    else cli_json_num(m, "change_pct", d[i].change_pct);
    cJSON_AddBoolToObject(m, "higher_is_better", d[i].higher_is_better);
    cJSON_AddNumberToObject(m, "n_a", d[i].n_a);
    cJSON_AddNumberToObject(m, "n_b", d[i].n_b);
    cli_json_num(m, "p_value", d[i].p_value);
    cli_json_num(m, "effect", d[i].effect);
    cJSON_AddStringToObject(m, "verdict", ferry_verdict_name(d[i].verdict));
    cJSON_AddBoolToObject(m, "gated", d[i].gated);
    cJSON_AddItemToArray(arr, m);
  }
  int rc = cli_emit(stdout, doc, o->fmt == CLI_FORMAT_JSON ? NULL : "metrics", o->fmt);
  cJSON_Delete(doc);
  return rc;
}

static void print_text(const struct side *a, const struct side *b, double tol, double alpha,
                       const struct ferry_metric_delta *d, size_t n, enum ferry_verdict verdict, int tested) {
  const struct side *sides[2] = {a, b};
  for (int k = 0; k < 2; k++) {
    const struct side *s = sides[k];
    char ids[256], path[512];
    ids_text(s, ids, sizeof ids);
    snprintf(path, sizeof path, "%s", s->path);
    cli_scrub(path);
    printf("%s  %s run%s %s (%s%s%s, %zu run%s)\n", s->name, path, s->n > 1 ? "s" : "", ids, s->rows[0]->kind,
           s->rows[0]->config_hash ? ", config " : "", s->rows[0]->config_hash ? s->rows[0]->config_hash : "", s->n,
           s->n > 1 ? "s" : "");
  }
  if (tested)
    printf("one-sided Mann-Whitney U per metric: worse or better by more than %.2f%%, family-wise alpha %g\n"
           "(Holm) over the p50/p99 latencies, throughput, peak memory and bytes; (info) rows are shown only\n",
           tol, alpha);
  else if (a->n > 1 || b->n > 1)
    printf("medians compared with the tolerance alone: a test needs two runs or more on each side\n");
  if (tested)
    printf("%-20s %16s %16s %10s %9s %7s\n", "metric", "A median", "B median", "change", "p", "effect");
  else
    printf("%-20s %16s %16s %10s\n", "metric", "run A", "run B", "change");
  for (size_t i = 0; i < n; i++) {
    char change[32], p[32] = "", eff[32] = "", va[40], vb[40];
    value_text(d[i].a, va, sizeof va);
    value_text(d[i].b, vb, sizeof vb);
    change_text(d[i].change_pct, change, sizeof change);
    const char *mark = d[i].verdict == FERRY_VERDICT_REGRESSION    ? "  REGRESSION"
                       : d[i].verdict == FERRY_VERDICT_IMPROVEMENT ? "  improvement"
                       : !d[i].gated                               ? "  (info)"
                                                                   : "";
    if (tested) {
      if (!isnan(d[i].p_value)) snprintf(p, sizeof p, "%.4f", d[i].p_value);
      if (!isnan(d[i].effect)) snprintf(eff, sizeof eff, "%+.2f", d[i].effect);
      printf("%-20s %16s %16s %10s %9s %7s%s\n", d[i].name, va, vb, change, p, eff, mark);
    } else {
      printf("%-20s %16s %16s %10s%s\n", d[i].name, va, vb, change, mark);
    }
  }
  int regressed = 0, improved = 0;
  for (size_t i = 0; i < n; i++) {
    regressed += d[i].verdict == FERRY_VERDICT_REGRESSION;
    improved += d[i].verdict == FERRY_VERDICT_IMPROVEMENT;
  }
  if (verdict == FERRY_VERDICT_REGRESSION) {
    printf("%d metric%s regressed beyond %.2f%%\n", regressed, regressed == 1 ? "" : "s", tol);
    printf("verdict: regression (%s)\n", tested ? "significant, beyond the tolerance" : "beyond the tolerance");
  } else if (verdict == FERRY_VERDICT_IMPROVEMENT) {
    printf("no regression beyond %.2f%%\n", tol);
    printf("verdict: improvement (%d metric%s better by more than %.2f%%)\n", improved, improved == 1 ? "" : "s", tol);
  } else {
    printf("no regression beyond %.2f%%\n", tol);
    printf("verdict: no significant change\n");
  }
}

int db_diff(const struct db_diff_opts *o) {
  double tol, alpha = 0.05;
  int rc = db_parse_tolerance(o->tolerance, &tol);
  if (rc) return rc;
  if (o->alpha && cli_parse_double("--alpha", o->alpha, 1e-9, 0.5, &alpha)) return CLI_USAGE;
  struct side a = {.name = "A"}, b = {.name = "B"};
  if ((rc = parse_side(o->a, o->db, &a)) || (rc = parse_side(o->b, o->db, &b))) goto out;
  if ((rc = open_side(&a)) || (rc = open_side(&b))) goto out;
  const int64_t single_a = a.ids[0], single_b = b.ids[0];
  const size_t given_a = a.n, given_b = b.n;
  if (!o->single && ((rc = expand_group(&a)) || (rc = expand_group(&b)))) goto out;
  /* two runs of one repeat group in one database: the runs themselves are compared */
  if (given_a == 1 && given_b == 1 && a.n > 1 && a.n == b.n && ferry__same_file(a.path, b.path) == 1 &&
      !memcmp(a.ids, b.ids, a.n * sizeof *a.ids)) {
    fprintf(stderr, "ferry: warning: runs %lld and %lld are of one repeat group: comparing the two runs\n",
            (long long)single_a, (long long)single_b);
    a.ids[0] = single_a;
    b.ids[0] = single_b;
    a.n = b.n = 1;
  }
  if ((rc = load_side(&a, o->allow_incomplete)) || (rc = load_side(&b, o->allow_incomplete))) goto out;
  if ((rc = check_alike(&a, &b, o->force))) goto out;
  struct ferry_metric_delta d[FERRY_DB_MAX_METRICS];
  size_t n = 0;
  const int regressed = ferry_db_compare_groups(a.stats, a.n, b.stats, b.n, tol, alpha, d, &n);
  enum ferry_verdict verdict = regressed ? FERRY_VERDICT_REGRESSION : FERRY_VERDICT_NONE;
  for (size_t i = 0; !regressed && i < n; i++)
    if (d[i].verdict == FERRY_VERDICT_IMPROVEMENT) verdict = FERRY_VERDICT_IMPROVEMENT;
  const int tested = a.n >= 2 && b.n >= 2;
  if (o->fmt == CLI_FORMAT_TEXT) print_text(&a, &b, tol, alpha, d, n, verdict, tested);
  else if ((rc = print_json(o, &a, &b, tol, alpha, d, n, verdict, tested))) goto out;
  rc = regressed ? CLI_REGRESSION : CLI_OK;
out:
  side_free(&a);
  side_free(&b);
  return rc;
}
