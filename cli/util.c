/* Error printing and option parsing shared by all subcommands. */
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/alloc.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/names.h"
#include "common/units.h"
#include "ferry/hw.h"

/* The message also becomes the thread's last error, so a caller running a command's code in
 * its own process (ferry plan's workers, with their output discarded) can say why it failed. */
int cli_fail(ferry_status status, const char *fmt, ...) {
  fputs("ferry: ", stderr);
  if (fmt) {
    char msg[FERRY_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fputs(msg, stderr);
    ferry__fail(status, "%s", msg);
  } else {
    const char *m = ferry_last_error();
    fputs(m && *m ? m : ferry_strerror(status), stderr);
  }
  fputc('\n', stderr);
  return CLI_FAIL;
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
  char msg[FERRY_ERRMSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "ferry %s: %s\nTry 'ferry %s --help'.\n", cmd, msg, cmd);
  ferry__fail(FERRY_ERR_INVALID, "%s", msg);
  return CLI_USAGE;
}

int cli_parse_size(const char *opt, const char *text, uint64_t *out) {
  if (ferry__parse_size(text, out) != FERRY_OK) {
    fprintf(stderr, "ferry: %s: %s\n", opt, ferry_last_error());
    return -1;
  }
  return 0;
}

int cli_parse_int(const char *opt, const char *text, int64_t min, int64_t max, int64_t *out) {
  int64_t v;
  if (ferry__parse_i64(text, &v) != FERRY_OK || v < min || v > max) {
    fprintf(stderr, "ferry: %s: '%s' is not an integer in [%lld, %lld]\n", opt, text, (long long)min,
            (long long)max);
    return -1;
  }
  *out = v;
  return 0;
}

int cli_parse_double(const char *opt, const char *text, double min, double max, double *out) {
  double v;
  if (ferry__parse_double(text, &v) != FERRY_OK || v < min || v > max) {
    fprintf(stderr, "ferry: %s: '%s' is not a number in [%g, %g]\n", opt, text, min, max);
    return -1;
  }
  *out = v;
  return 0;
}

int cli_check_paths(const char *cmd, const struct ferry_path_use *uses, size_t n) {
  if (ferry__check_paths(uses, n) == FERRY_OK) return 0;
  return cli_usage_error(cmd, "%s", ferry_last_error());
}

void cli_scrub(char *text) {
  for (; text && *text; text++)
    if ((unsigned char)*text < 0x20 || *text == 0x7f) *text = '?';
}

void *cli_room(void *v, size_t *cap, size_t n, size_t size, size_t first) {
  if (n < *cap) return v;
  const size_t grown = *cap ? 2 * *cap : first;
  void *nv = ferry__reallocarray(v, grown, size);
  if (nv) *cap = grown;
  return nv;
}

int cli_is_tty(FILE *f) { return isatty(fileno(f)); }

int cli_getopt_long(int argc, char *const argv[], const char *shortopts, const struct option *longopts, int *longindex) {
  /* the next option getopt_long will read: it skips (and permutes) plain arguments */
  int i = optind;
  while (i < argc && (argv[i][0] != '-' || !argv[i][1])) i++;
  if (i < argc && !strncmp(argv[i], "--", 2) && argv[i][2]) {
    const char *name = argv[i] + 2;
    const size_t len = strcspn(name, "=");
    size_t n = 0;
    int exact = 0;
    while (longopts[n].name) {
      exact |= strlen(longopts[n].name) == len && !strncmp(longopts[n].name, name, len);
      n++;
    }
    if (!exact) {
      /* getopt_long would take a prefix for the option it abbreviates */
      const char *names[64], *near[3];
      if (n > 64) n = 64;
      for (size_t k = 0; k < n; k++) names[k] = longopts[k].name;
      char word[128], list[256];
      snprintf(word, sizeof word, "%.*s", (int)len, name);
      const size_t got = ferry__nearest_names(word, names, n, 1, near, 3);
      fprintf(stderr, "ferry: unknown option '--%s'%s%s%s\n", word, got ? "; did you mean " : "",
              got ? ferry__join_names(near, got, "--", list, sizeof list) : "", got ? "?" : "");
      optind = i + 1;
      return '?';
    }
  }
  return getopt_long(argc, argv, shortopts, longopts, longindex);
}

/* What the rates, times and efficiencies rest on, counted, the unsourced ones named: the figures
 * to measure first (ferry sim --sensitivity says which of them a given answer hinges on). */
void cli_print_bases(FILE *f, const struct ferry_hw_profile *p) {
  struct ferry_hw_figure *v = NULL;
  size_t n = 0;
  if (ferry_hw_figures(p, &v, &n) != FERRY_OK) return;
  static const enum ferry_hw_basis order[] = {FERRY_HW_BASIS_SOURCED, FERRY_HW_BASIS_FITTED, FERRY_HW_BASIS_DERIVED,
                                              FERRY_HW_BASIS_ESTIMATE, FERRY_HW_BASIS_DEFAULT, FERRY_HW_BASIS_NONE};
  fprintf(f, "rates, times and efficiencies rest on:");
  const char *sep = " ";
  for (size_t b = 0; b < sizeof order / sizeof order[0]; b++) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += v[i].basis == order[b];
    if (k) fprintf(f, "%s%zu %s", sep, k, ferry_hw_basis_name(order[b])), sep = ", ";
  }
  fprintf(f, "%s\n", n ? "" : " (none)");
  static const struct {
    enum ferry_hw_basis basis;
    const char *label;
  } unsourced[] = {{FERRY_HW_BASIS_ESTIMATE, "estimates"},
                   {FERRY_HW_BASIS_DEFAULT, "ferry defaults, not measurements"},
                   {FERRY_HW_BASIS_NONE, "given without a source"}};
  for (size_t b = 0; b < sizeof unsourced / sizeof unsourced[0]; b++) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
      if (v[i].basis != unsourced[b].basis) continue;
      if (k++) fprintf(f, ", %s", v[i].path);
      else fprintf(f, "  %s: %s", unsourced[b].label, v[i].path);
    }
    if (k) fprintf(f, "\n");
  }
  ferry_hw_figures_free(v);
}
