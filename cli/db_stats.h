/* `ferry db stats`: nsys-style summaries of a run's timeline. */
#ifndef FERRY_CLI_DB_STATS_H
#define FERRY_CLI_DB_STATS_H

#include "cli/output.h"
#include "ferry/db.h"

/* The whole command (options as given, NULL when missing); its exit code. */
int db_stats(const char *db_path, const char *report, const char *run_text, enum cli_format fmt);

#endif
