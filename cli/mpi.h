/* MPI for `ferry sweep` and `ferry plan` when mpirun starts several ranks: ferry's MPI module
 * (ferry_mpi.so, built where CMake finds an MPI library) is loaded with dlopen only then, so
 * ferry links no MPI library and everything else runs the same without one (cli/mpi.c). */
#ifndef FERRY_CLI_MPI_H
#define FERRY_CLI_MPI_H

#include "cli/mpi/ferry_mpi_api.h"

struct cli_mpi {
  int rank, size; /* 0 and 1 when not under mpirun */
  const struct ferry__mpi_api *api;
};

/* Message tags of the commands. */
enum { CLI_MPI_TAG_FILE = 1, CLI_MPI_TAG_JOB, CLI_MPI_TAG_RESULT };

/* The ranks this process is one of: m->size 1 outside mpirun (or with one rank). Under mpirun
 * with several ranks and no module: CLI_FAIL with a message (every rank would otherwise do all
 * of the work); `cmd` names the command in it. */
int cli_mpi_start(const char *cmd, struct cli_mpi *m);
/* MPI_Finalize when started. */
void cli_mpi_stop(struct cli_mpi *m);
/* Abort every rank (after an error one rank cannot recover from). */
void cli_mpi_abort(struct cli_mpi *m, int code);
/* A whole file to rank dest, and its receipt into path (written, then renamed). 0 or CLI_FAIL. */
int cli_mpi_send_file(struct cli_mpi *m, const char *path, int dest);
int cli_mpi_recv_file(struct cli_mpi *m, const char *path, int src);

#endif
