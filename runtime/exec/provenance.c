/* The facts of ferry_provenance_collect(): the build's from compile-time definitions (the
 * generated ferry_buildinfo.h holds git describe), OpenBLAS's own configuration string, the
 * machine's from /proc, sysconf and uname, and the GPU's from the cuda executor and the NVIDIA
 * kernel module. Each reader is best effort: a fact that cannot be read is left out. */
#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cblas.h>

#include "ferry_buildinfo.h"
#include "ferry/provenance.h"
#include "runtime/exec/exec_impl.h"

const char *ferry_build_git_describe(void) { return FERRY_GIT_DESCRIBE; }

static void add(struct ferry_provenance *p, const char *name, const char *value) {
  if (!value || !*value || p->count >= FERRY_PROVENANCE_MAX) return;
  struct ferry_provenance_item *it = &p->items[p->count++];
  snprintf(it->name, sizeof it->name, "%s", name);
  /* one line, no control characters: values come from files and drivers */
  size_t k = 0;
  for (const unsigned char *c = (const unsigned char *)value; *c && k + 1 < sizeof it->value; c++)
    it->value[k++] = (char)(*c < 0x20 || *c == 0x7f ? ' ' : *c);
  while (k && it->value[k - 1] == ' ') k--;
  it->value[k] = '\0';
  if (!k) p->count--;
}

/* The value after "key<spaces>:" on the first line of `path` that starts with key. */
static int read_keyed(const char *path, const char *key, char sep, char *out, size_t len) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char line[512];
  int found = 0;
  size_t klen = strlen(key);
  while (!found && fgets(line, sizeof line, f)) {
    if (strncmp(line, key, klen) != 0) continue;
    char *v = strchr(line + klen, sep);
    if (!v) continue;
    v++;
    while (*v == ' ' || *v == '\t' || *v == '"') v++;
    size_t n = strcspn(v, "\"\n");
    snprintf(out, len, "%.*s", (int)n, v);
    found = 1;
  }
  fclose(f);
  return found;
}

static void machine(struct ferry_provenance *p) {
  char buf[256];
  if (read_keyed("/proc/cpuinfo", "model name", ':', buf, sizeof buf)) add(p, "MACHINE_CPU_MODEL", buf);
  long cores = sysconf(_SC_NPROCESSORS_ONLN), pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (cores > 0) {
    snprintf(buf, sizeof buf, "%ld", cores);
    add(p, "MACHINE_CPU_CORES", buf);
  }
  if (pages > 0 && page > 0) {
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)pages * (unsigned long long)page);
    add(p, "MACHINE_MEMORY_BYTES", buf);
  }
  struct utsname u;
  if (uname(&u) == 0) {
    snprintf(buf, sizeof buf, "%s %s %s", u.sysname, u.release, u.machine);
    add(p, "MACHINE_KERNEL", buf);
  }
  if (read_keyed("/etc/os-release", "PRETTY_NAME", '=', buf, sizeof buf)) add(p, "MACHINE_OS", buf);
}

/* "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 ..." -> 550.54.15 */
static void nvidia_driver(struct ferry_provenance *p) {
  char buf[256];
  if (!read_keyed("/proc/driver/nvidia/version", "NVRM version", ':', buf, sizeof buf)) return;
  char *m = strstr(buf, "Module");
  if (!m) return;
  m += 6;
  while (*m == ' ') m++;
  m[strcspn(m, " ")] = '\0';
  add(p, "GPU_DRIVER", m);
}

static void cuda_version(char *buf, size_t len, int v) { snprintf(buf, len, "%d.%d", v / 1000, (v % 1000) / 10); }

void ferry_provenance_collect(ferry_exec *ex, struct ferry_provenance *out) {
  memset(out, 0, sizeof *out);
  char buf[256];
  add(out, "BUILD_GIT_DESCRIBE", FERRY_GIT_DESCRIBE);
  add(out, "BUILD_FERRY_VERSION", FERRY_VERSION);
  add(out, "BUILD_COMPILER", FERRY_COMPILER);
  add(out, "BUILD_TYPE", *FERRY_BUILD_TYPE ? FERRY_BUILD_TYPE : "(none)");
  add(out, "BUILD_BLAS", openblas_get_config());
  add(out, "BUILD_CUDA_TOOLKIT", FERRY_CUDA_TOOLKIT);
  machine(out);
  if (!ex || strcmp(ferry_exec_name(ex), "cuda") != 0) return;
  struct ferry_device_info d;
  if (ferry_exec_device_info(ex, &d) == FERRY_OK) add(out, "GPU_NAME", d.name);
  nvidia_driver(out);
  int driver = 0, runtime = 0;
  ferry__exec_cuda_versions(&driver, &runtime);
  if (driver) {
    cuda_version(buf, sizeof buf, driver);
    add(out, "CUDA_DRIVER_API", buf);
  }
  if (runtime) {
    cuda_version(buf, sizeof buf, runtime);
    add(out, "CUDA_RUNTIME", buf);
  }
}

const char *ferry_provenance_value(const struct ferry_provenance *p, const char *name) {
  for (size_t i = 0; p && name && i < p->count; i++)
    if (!strcmp(p->items[i].name, name)) return p->items[i].value;
  return NULL;
}
