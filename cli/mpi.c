/* Loading ferry's MPI module when mpirun started this process with several ranks (cli/mpi.h).
 * Open MPI announces its ranks in OMPI_COMM_WORLD_SIZE, MPICH and PMIx launchers in PMI_SIZE
 * and PMIX_RANK; the module is looked for in $FERRY_MPI_MODULE, beside the program, in
 * lib/ferry/ beside its folder, then where this build put it. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/mpi.h"
#include "common/alloc.h"

#define MODULE_NAME "ferry_mpi.so"

static int env_int(const char *name) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : 0;
}

static void *open_module(char *tried, size_t len) {
  char dir[4096], path[4200];
  const char *candidates[6];
  char storage[6][4200];
  int n = 0;
  const char *env = getenv("FERRY_MPI_MODULE");
  if (env && *env) candidates[n++] = env;
  ssize_t k = readlink("/proc/self/exe", dir, sizeof dir - 1);
  if (k > 0) {
    dir[k] = '\0';
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    snprintf(storage[n], sizeof storage[n], "%s/" MODULE_NAME, dir);
    candidates[n] = storage[n], n++;
    snprintf(storage[n], sizeof storage[n], "%s/../lib/ferry/" MODULE_NAME, dir);
    candidates[n] = storage[n], n++;
  }
#ifdef FERRY_MPI_MODULE_DIR
  candidates[n++] = FERRY_MPI_MODULE_DIR "/" MODULE_NAME;
#endif
#ifdef FERRY_MPI_INSTALL_DIR
  candidates[n++] = FERRY_MPI_INSTALL_DIR "/" MODULE_NAME;
#endif
  size_t used = 0;
  tried[0] = '\0';
  for (int i = 0; i < n; i++) {
    snprintf(path, sizeof path, "%s", candidates[i]);
    used += (size_t)snprintf(tried + used, used < len ? len - used : 0, "%s%s", used ? ", " : "", path);
    if (used >= len) used = len - 1;
    if (access(path, F_OK) != 0) continue;
    /* global: Open MPI loads its own plugins, which look for its symbols in the process */
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (h) return h;
    const char *e = dlerror();
    snprintf(tried + used, used < len ? len - used : 0, " (%s)", e ? e : "cannot load");
    return NULL;
  }
  return NULL;
}

int cli_mpi_start(const char *cmd, struct cli_mpi *m) {
  memset(m, 0, sizeof *m);
  m->size = 1;
  int size = env_int("OMPI_COMM_WORLD_SIZE");
  if (!size) size = env_int("PMI_SIZE");
  if (!size && getenv("PMIX_RANK")) size = 2; /* a PMIx launch: MPI_Init says how many */
  if (size <= 1) return CLI_OK;
  char tried[2048];
  void *h = open_module(tried, sizeof tried);
  const struct ferry__mpi_api *api = h ? dlsym(h, FERRY_MPI_API_SYMBOL) : NULL;
  if (!api || api->version != FERRY_MPI_API_VERSION)
    return cli_fail(FERRY_ERR_UNSUPPORTED,
                    "%s: started by mpirun with %d ranks, but ferry's MPI module %s (looked for %s); every rank "
                    "would do all of the work. Build ferry where an MPI library is installed (Debian: libopenmpi-dev, "
                    "scripts/setup-deps.sh), or run without mpirun",
                    cmd, size, h ? "is of another version" : "was not found or did not load", tried);
  int rank = 0;
  if (api->init(&rank, &size) != 0) return cli_fail(FERRY_ERR_INTERNAL, "%s: MPI_Init failed", cmd);
  m->api = api;
  m->rank = rank;
  m->size = size;
  return CLI_OK;
}

void cli_mpi_stop(struct cli_mpi *m) {
  if (m->api) m->api->finalize();
  m->api = NULL;
}

void cli_mpi_abort(struct cli_mpi *m, int code) {
  if (m->api) m->api->abort(code);
}

int cli_mpi_send_file(struct cli_mpi *m, const char *path, int dest) {
  int fd = open(path, O_RDONLY);
  struct stat sb;
  int64_t size = -1;
  char *buf = NULL;
  if (fd >= 0 && fstat(fd, &sb) == 0 && (buf = ferry__calloc((size_t)sb.st_size + 1, 1))) {
    size_t got = 0;
    while (got < (size_t)sb.st_size) {
      ssize_t k = read(fd, buf + got, (size_t)sb.st_size - got);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) break;
      got += (size_t)k;
    }
    if (got == (size_t)sb.st_size) size = (int64_t)got;
  }
  if (fd >= 0) close(fd);
  /* the size goes first, -1 when the file could not be read, so the receiver never waits */
  int rc = m->api->send(&size, sizeof size, dest, CLI_MPI_TAG_FILE);
  if (rc == 0 && size > 0) rc = m->api->send(buf, (size_t)size, dest, CLI_MPI_TAG_FILE);
  ferry_free(buf);
  if (size < 0) return cli_fail(FERRY_ERR_IO, "rank %d: cannot read %s to send it", m->rank, path);
  return rc ? cli_fail(FERRY_ERR_IO, "rank %d: sending %s failed (MPI error %d)", m->rank, path, rc) : CLI_OK;
}

int cli_mpi_recv_file(struct cli_mpi *m, const char *path, int src) {
  int64_t size = 0;
  int rc = m->api->recv(&size, sizeof size, src, CLI_MPI_TAG_FILE, NULL);
  if (rc) return cli_fail(FERRY_ERR_IO, "receiving from rank %d failed (MPI error %d)", src, rc);
  if (size < 0) return cli_fail(FERRY_ERR_IO, "rank %d could not read its database", src);
  char *buf = ferry__calloc((size_t)size + 1, 1);
  if (!buf) return cli_fail(FERRY_ERR_NOMEM, "out of memory for %lld bytes from rank %d", (long long)size, src);
  if (size > 0 && (rc = m->api->recv(buf, (size_t)size, src, CLI_MPI_TAG_FILE, NULL))) {
    ferry_free(buf);
    return cli_fail(FERRY_ERR_IO, "receiving from rank %d failed (MPI error %d)", src, rc);
  }
  FILE *f = fopen(path, "wb");
  const int ok = f && fwrite(buf, 1, (size_t)size, f) == (size_t)size;
  if (f && fclose(f) != 0 && ok) rc = -1;
  ferry_free(buf);
  if (!ok || rc) return cli_fail(FERRY_ERR_IO, "cannot write %s", path);
  return CLI_OK;
}
