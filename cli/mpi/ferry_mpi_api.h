/* The interface of ferry's MPI module (ferry_mpi.so, cli/mpi/ferry_mpi.c): the few MPI calls
 * `ferry sweep` and `ferry plan` make, as a versioned table the command finds with dlsym, so
 * ferry itself links no MPI library. Counts are bytes; every call returns 0 or an MPI error
 * code. */
#ifndef FERRY_CLI_MPI_API_H
#define FERRY_CLI_MPI_API_H

#include <stddef.h>
#include <stdint.h>

#define FERRY_MPI_API_VERSION 1
#define FERRY_MPI_API_SYMBOL "ferry_mpi_api"
#define FERRY_MPI_ANY_SOURCE (-1)

struct ferry__mpi_api {
  int version; /* FERRY_MPI_API_VERSION */
  int (*init)(int *rank, int *size);
  int (*finalize)(void);
  void (*abort)(int code);
  int (*barrier)(void);
  int (*bcast)(void *buf, size_t bytes, int root);
  int (*send)(const void *buf, size_t bytes, int dest, int tag);
  /* src may be FERRY_MPI_ANY_SOURCE; *from receives the sender (may be NULL) */
  int (*recv)(void *buf, size_t bytes, int src, int tag, int *from);
  /* whether a message with this tag is waiting (from src, or any) */
  int (*iprobe)(int src, int tag, int *flag, int *from);
  /* element-wise maximum over the ranks, in place */
  int (*allreduce_max_i64)(int64_t *v, int n);
  /* element-wise sum over the ranks, in place */
  int (*allreduce_sum_i64)(int64_t *v, int n);
  /* the MPI library's own version text */
  const char *(*library_version)(void);
};

#endif
