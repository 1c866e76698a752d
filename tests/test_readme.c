/* The README's examples run as written: every `build/ferry ...` command of its ```sh blocks
 * (continuation lines joined) runs in order, with /tmp/ a private folder, tests/data and the
 * shared Azure trace found from the source tree (its first 200 rows when ../shared is absent).
 * Each must exit 0 (3, a regression found, is also an answer for `db diff`), and a command
 * whose comment states a figure ("# TPOT 98.00 ms") must print it, within 2 %. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fsutil.h"
#include "testutil.h"

/* One command: the text after "build/ferry ", and the figure its comment states, if any. */
struct example {
  char args[4096];
  char unit[8];
  double tpot; /* 0: none stated */
};

/* Replace every `from` in s (size len) by `to`. */
static void replace_all(char *s, size_t len, const char *from, const char *to) {
  char out[8192];
  size_t o = 0;
  const size_t fl = strlen(from), tl = strlen(to);
  for (const char *p = s; *p && o + tl + 1 < sizeof out;) {
    if (!strncmp(p, from, fl)) {
      memcpy(out + o, to, tl);
      o += tl;
      p += fl;
    } else {
      out[o++] = *p++;
    }
  }
  out[o] = '\0';
  snprintf(s, len, "%s", out);
}

static size_t extract(const char *readme, struct example *ex, size_t max) {
  size_t n = 0;
  int in_sh = 0;
  char line[4096] = "";
  for (const char *p = readme; *p;) {
    const char *eol = strchr(p, '\n');
    size_t len = eol ? (size_t)(eol - p) : strlen(p);
    char cur[2048];
    snprintf(cur, sizeof cur, "%.*s", (int)(len < sizeof cur ? len : sizeof cur - 1), p);
    p = eol ? eol + 1 : p + len;
    if (!strncmp(cur, "```", 3)) {
      in_sh = !in_sh && !strncmp(cur, "```sh", 5);
      continue;
    }
    if (!in_sh) continue;
    /* continuation lines: a trailing backslash joins the next line */
    size_t cl = strlen(cur);
    const int more = cl && cur[cl - 1] == '\\';
    if (more) cur[cl - 1] = '\0';
    const char *text = cur;
    if (line[0]) while (*text == ' ') text++;
    strncat(line, text, sizeof line - strlen(line) - 2);
    if (more) {
      strncat(line, " ", sizeof line - strlen(line) - 1);
      continue;
    }
    if (!strncmp(line, "build/ferry ", 12) && n < max) {
      struct example *e = &ex[n++];
      memset(e, 0, sizeof *e);
      char *hash = strstr(line, "  #");
      if (hash) {
        const char *f = strstr(hash, "TPOT ");
        if (f && sscanf(f + 5, "%lf %7[a-z]", &e->tpot, e->unit) != 2) e->tpot = 0;
        *hash = '\0';
      }
      snprintf(e->args, sizeof e->args, "%s", line + 12);
    }
    line[0] = '\0';
  }
  return n;
}

/* The mean TPOT of a run summary, in the unit given. */
static double summary_tpot(const char *out, const char *unit) {
  const char *p = strstr(out, "\nTPOT ");
  if (!p) return NAN;
  double v;
  char u[8];
  if (sscanf(p + 6, "%lf %7s", &v, u) != 2) return NAN;
  const double to_ns = !strcmp(u, "s") ? 1e9 : !strcmp(u, "ms") ? 1e6 : !strcmp(u, "us") ? 1e3 : 1;
  const double from = !strcmp(unit, "s") ? 1e9 : !strcmp(unit, "ms") ? 1e6 : !strcmp(unit, "us") ? 1e3 : 1;
  return v * to_ns / from;
}

static void test_examples(void **state) {
  (void)state;
  const char *src = getenv("FERRY_SOURCE_DIR");
  char path[1024], *readme = NULL;
  size_t len;
  snprintf(path, sizeof path, "%s/README.md", src ? src : ".");
  assert_int_equal(ferry__read_file(path, 1 << 20, &readme, &len, NULL), FERRY_OK);
  static struct example ex[64];
  const size_t n = extract(readme, ex, 64);
  free(readme);
  assert_true(n >= 12); /* the figures, the example, regression testing */
  char *dir = tu_mkdtemp("readme");
  char tmp[600], data[1024], trace[1024];
  snprintf(tmp, sizeof tmp, "%s/", dir);
  snprintf(data, sizeof data, "%s/tests/data/", src ? src : ".");
  char *shared = tu_shared_path("traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv");
  snprintf(trace, sizeof trace, "%s", shared ? shared : "");
  if (!shared) snprintf(trace, sizeof trace, "%s/tests/data/traces/azure_conv_200.csv", src ? src : ".");
  free(shared);
  int figures = 0;
  for (size_t i = 0; i < n; i++) {
    /* /tmp/ private, tests/data/ the source tree's, the big trace as found; the trace last, as
     * its absolute path may hold /tmp/ or tests/data/ itself */
    char fixed[8192];
    const size_t al = strnlen(ex[i].args, sizeof ex[i].args - 1);
    memcpy(fixed, ex[i].args, al);
    fixed[al] = '\0';
    replace_all(fixed, sizeof fixed, "/tmp/", tmp);
    replace_all(fixed, sizeof fixed, "tests/data/", data);
    replace_all(fixed, sizeof fixed, "../shared/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv", trace);
    char *out = NULL;
    int rc = tu_run_ferry(fixed, &out);
    const int diff = !strncmp(ex[i].args, "db diff", 7);
    if (!(rc == 0 || (diff && rc == 3))) fail_msg("README example `build/ferry %s`: exit %d\n%s", ex[i].args, rc, out);
    if (ex[i].tpot > 0) {
      const double got = summary_tpot(out, ex[i].unit);
      if (!(fabs(got - ex[i].tpot) <= 0.02 * ex[i].tpot))
        fail_msg("README example `build/ferry %s` states TPOT %g %s, prints %g %s:\n%s", ex[i].args, ex[i].tpot,
                 ex[i].unit, got, ex[i].unit, out);
      figures++;
    }
    free(out);
  }
  assert_int_equal(figures, 7);
  tu_rmtree(dir);
  free(dir);
}

/* `ferry hw list --help` and the like: help after a subcommand is the help. */
static void test_help(void **state) {
  (void)state;
  static const char *const cmds[] = {"hw list --help", "hw show --help", "db diff --help", "db stats --help",
                                     "run --help", "sim --help"};
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    char *out = NULL;
    int rc = tu_run_ferry(cmds[i], &out);
    if (rc != 0 || !tu_contains(out, "Usage: ferry")) fail_msg("ferry %s: exit %d\n%s", cmds[i], rc, out);
    free(out);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_help),
      cmocka_unit_test(test_examples),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
