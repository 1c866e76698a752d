/* ferry's MPI module: the calls of ferry_mpi_api.h over the MPI library it links (Open MPI).
 * `ferry` loads it with dlopen only when mpirun started it with several ranks. */
#include <mpi.h>
#include <stdio.h>

#include "ferry_mpi_api.h"

/* MPI counts are int: large buffers go in pieces of this many bytes. */
#define PIECE (1 << 30)

static int m_init(int *rank, int *size) {
  int rc = MPI_Init(NULL, NULL);
  if (rc != MPI_SUCCESS) return rc;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  if ((rc = MPI_Comm_rank(MPI_COMM_WORLD, rank)) != MPI_SUCCESS) return rc;
  return MPI_Comm_size(MPI_COMM_WORLD, size);
}

static int m_finalize(void) { return MPI_Finalize(); }
static void m_abort(int code) { MPI_Abort(MPI_COMM_WORLD, code); }
static int m_barrier(void) { return MPI_Barrier(MPI_COMM_WORLD); }

static int m_bcast(void *buf, size_t bytes, int root) {
  for (size_t off = 0; off < bytes; off += PIECE) {
    const size_t n = bytes - off < PIECE ? bytes - off : PIECE;
    int rc = MPI_Bcast((char *)buf + off, (int)n, MPI_BYTE, root, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return rc;
  }
  return MPI_SUCCESS;
}

static int m_send(const void *buf, size_t bytes, int dest, int tag) {
  size_t off = 0;
  do {
    const size_t n = bytes - off < PIECE ? bytes - off : PIECE;
    int rc = MPI_Send((const char *)buf + off, (int)n, MPI_BYTE, dest, tag, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return rc;
    off += n;
  } while (off < bytes);
  return MPI_SUCCESS;
}

static int m_recv(void *buf, size_t bytes, int src, int tag, int *from) {
  size_t off = 0;
  int who = src;
  do {
    const size_t n = bytes - off < PIECE ? bytes - off : PIECE;
    MPI_Status status;
    int rc = MPI_Recv((char *)buf + off, (int)n, MPI_BYTE, who == FERRY_MPI_ANY_SOURCE ? MPI_ANY_SOURCE : who, tag,
                      MPI_COMM_WORLD, &status);
    if (rc != MPI_SUCCESS) return rc;
    who = status.MPI_SOURCE; /* the rest of a large message comes from the same sender */
    off += n;
  } while (off < bytes);
  if (from) *from = who;
  return MPI_SUCCESS;
}

static int m_iprobe(int src, int tag, int *flag, int *from) {
  MPI_Status status;
  int rc = MPI_Iprobe(src == FERRY_MPI_ANY_SOURCE ? MPI_ANY_SOURCE : src, tag, MPI_COMM_WORLD, flag, &status);
  if (rc == MPI_SUCCESS && *flag && from) *from = status.MPI_SOURCE;
  return rc;
}

static int m_allreduce_max_i64(int64_t *v, int n) {
  return MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
}

static int m_allreduce_sum_i64(int64_t *v, int n) {
  return MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
}

static const char *m_library_version(void) {
  static char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  if (MPI_Get_library_version(text, &len) != MPI_SUCCESS) return "unknown";
  /* the first line is enough */
  for (int i = 0; i < len; i++)
    if (text[i] == '\n') {
      text[i] = '\0';
      break;
    }
  return text;
}

__attribute__((visibility("default"))) const struct ferry__mpi_api ferry_mpi_api = {
    .version = FERRY_MPI_API_VERSION,
    .init = m_init,
    .finalize = m_finalize,
    .abort = m_abort,
    .barrier = m_barrier,
    .bcast = m_bcast,
    .send = m_send,
    .recv = m_recv,
    .iprobe = m_iprobe,
    .allreduce_max_i64 = m_allreduce_max_i64,
    .allreduce_sum_i64 = m_allreduce_sum_i64,
    .library_version = m_library_version,
};
