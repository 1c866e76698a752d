/* `ferry db diff`: runs or repeat groups, in one database or two, compared metric by metric. */
#ifndef FERRY_CLI_DB_DIFF_H
#define FERRY_CLI_DB_DIFF_H

#include "cli/output.h"

struct db_diff_opts {
  const char *db;        /* --db: the database of a side given without DB: */
  const char *a, *b;     /* the sides, [DB:]RUNS */
  const char *tolerance; /* --tolerance as given, or NULL (5%) */
  const char *alpha;     /* --alpha as given, or NULL (0.05) */
  int allow_incomplete, force;
  int single; /* --single: the runs given, not their repeat groups */
  enum cli_format fmt;
};

/* Parse a tolerance: "5%" is five percent, and so is the fraction "0.05"; a number of 1 or
 * more without '%' is refused as ambiguous. 0 and *pct set, or CLI_USAGE after a message. */
int db_parse_tolerance(const char *text, double *pct);

/* The whole command; its exit code (CLI_REGRESSION when B regressed). */
int db_diff(const struct db_diff_opts *o);

#endif
