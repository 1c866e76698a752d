/* Shared pieces of the `ferry` command: the subcommand signature, error reporting that
 * prints one line and returns a non-zero exit code, and option helpers. */
#ifndef FERRY_CLI_H
#define FERRY_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ferry/status.h"

/* Exit codes: 0 ok, 1 runtime failure, 2 usage error, 3 regression found (db diff). */
enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2, CLI_REGRESSION = 3 };

/* Print "ferry: <message>" (with ferry_last_error() when msg is NULL) and return CLI_FAIL. */
int cli_fail(ferry_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Print "ferry <cmd>: <message>\nTry 'ferry <cmd> --help'." and return CLI_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Option value parsers that report the option name on error (return 0 on success). */
int cli_parse_size(const char *opt, const char *text, uint64_t *out);
int cli_parse_int(const char *opt, const char *text, int64_t min, int64_t max, int64_t *out);
int cli_parse_double(const char *opt, const char *text, double min, double max, double *out);

struct option;
/* getopt_long() with whole option names only: an unknown or abbreviated --name prints
 * "unknown option '--name'; did you mean --x?" and returns '?' (getopt_long would quietly
 * take a prefix for the option it abbreviates). */
int cli_getopt_long(int argc, char *const argv[], const char *shortopts, const struct option *longopts, int *longindex);
/* ferry__check_paths over a command's paths (common/fsutil.h): 0, or CLI_USAGE after printing
 * why an output would overwrite an input or another output. Every command calls it once,
 * after parsing and before it opens anything for writing. */
struct ferry_path_use;
int cli_check_paths(const char *cmd, const struct ferry_path_use *uses, size_t n);

/* Text from a database on its way to a terminal or a message: each control character becomes
 * '?' in place (escape sequences could rewrite what the screen shows, a newline fake a line). */
void cli_scrub(char *text);

/* Room for one more element in a growing array v of *cap elements of `size` bytes holding n:
 * v itself, or v reallocated to twice *cap (`first` when empty) when full; NULL when out of
 * memory, v and *cap then as they were (the caller frees v). */
void *cli_room(void *v, size_t *cap, size_t n, size_t size, size_t first);

/* Whether stdout/stderr is a terminal (progress bars only then). */
int cli_is_tty(FILE *f);

struct ferry_hw_profile;
/* What a profile's rates, times and efficiencies rest on (ferry_hw_figures()), counted by basis,
 * with the estimates and ferry defaults named: `ferry hw show`, and what `ferry calibrate` left
 * unmeasured. */
void cli_print_bases(FILE *f, const struct ferry_hw_profile *p);

/* Subcommands. Each parses its own options (argv[0] is the subcommand name). */
int cmd_model(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_sim(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_model_gen(int argc, char **argv);
int cmd_model_quantize(int argc, char **argv);
int cmd_model_kv_error(int argc, char **argv);
int cmd_trace(int argc, char **argv);
int cmd_hw(int argc, char **argv);
int cmd_db(int argc, char **argv);
int cmd_sweep(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_trace_routing(int argc, char **argv);
int cmd_predictor(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_ctl(int argc, char **argv);
int cmd_model_manifest(int argc, char **argv);
/* `ferry hw kernel` (argv[0] "kernel"). */
int hw_kernel(int argc, char **argv);

#endif
