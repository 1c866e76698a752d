/* Safetensors write and read throughput: writes a synthetic model with the streaming writer,
 * then reads it back by tensor with buffered pread (page cache dropped first), with
 * FERRY_READ_DIRECT, and hot from the page cache. Prints GB/s; not a pass/fail test.
 * Usage: store_read [--size 1G] [--tensor 16M] [--dir DIR]   (DIR defaults to $TMPDIR or /tmp) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/fsutil.h"
#include "common/units.h"
#include "ferry/store.h"

static double gbps(uint64_t bytes, int64_t ns) { return ns > 0 ? (double)bytes / (double)ns : 0.0; }

/* Read every tensor; returns elapsed ns or -1. */
static int64_t read_all(ferry_store *s, void *buf, uint64_t cap, unsigned flags) {
  int64_t t0 = ferry__mono_ns();
  for (size_t i = 0; i < ferry_store_tensor_count(s); i++) {
    const struct ferry_store_tensor *t = ferry_store_tensor_at(s, i);
    uint64_t shift;
    if (ferry_store_read_range(s, t->file, t->offset, t->nbytes, buf, cap, flags, &shift) != FERRY_OK) {
      fprintf(stderr, "store_read: %s\n", ferry_store_errmsg(s));
      return -1;
    }
  }
  return ferry__mono_ns() - t0;
}

int main(int argc, char **argv) {
  uint64_t size = 1ull << 30, tensor = 16ull << 20;
  const char *base = getenv("TMPDIR");
  if (!base || !*base) base = "/tmp";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--size") && i + 1 < argc && ferry__parse_size(argv[i + 1], &size) == FERRY_OK) i++;
    else if (!strcmp(argv[i], "--tensor") && i + 1 < argc && ferry__parse_size(argv[i + 1], &tensor) == FERRY_OK) i++;
    else if (!strcmp(argv[i], "--dir") && i + 1 < argc) base = argv[++i];
    else {
      fprintf(stderr, "usage: store_read [--size 1G] [--tensor 16M] [--dir DIR]\n");
      return 2;
    }
  }
  if (tensor == 0 || tensor > size) tensor = size;
  char *dir = ferry__asprintf("%s/ferry-store-bench-%ld", base, (long)getpid());
  if (!dir || ferry__mkdir_p(dir, NULL) != FERRY_OK) {
    fprintf(stderr, "store_read: cannot create %s\n", dir ? dir : "folder");
    return 1;
  }
  int rc = 1;
  size_t ntensors = (size_t)(size / tensor);
  uint64_t cap = ferry_store_direct_span(FERRY_DIRECT_ALIGN - 1, tensor);
  char *buf = ferry__aligned_alloc(FERRY_DIRECT_ALIGN, (size_t)cap);
  ferry_store_writer *w = NULL;
  ferry_store *s = NULL;
  if (!buf) goto out;
  memset(buf, 0x5a, (size_t)cap);

  int64_t t0 = ferry__mono_ns();
  if (ferry_store_writer_create(&w, dir, 0) != FERRY_OK) goto out_err;
  for (size_t i = 0; i < ntensors; i++) {
    char name[64];
    int64_t shape[1] = {(int64_t)tensor};
    snprintf(name, sizeof name, "layers.%zu.weight", i);
    if (ferry_store_writer_add(w, name, FERRY_DTYPE_U8, 1, shape) != FERRY_OK) goto out_err;
  }
  for (size_t i = 0; i < ntensors; i++)
    if (ferry_store_writer_write(w, buf, (size_t)tensor) != FERRY_OK) goto out_err;
  if (ferry_store_writer_finish(w) != FERRY_OK) goto out_err;
  int64_t write_ns = ferry__mono_ns() - t0;
  uint64_t total = (uint64_t)ntensors * tensor;
  printf("folder %s: %zu tensors x %llu bytes\n", dir, ntensors, (unsigned long long)tensor);
  printf("write (incl. fsync):     %6.2f GB/s\n", gbps(total, write_ns));

  if (ferry_store_open(&s, dir) != FERRY_OK) goto out_err;
  printf("O_DIRECT supported:      %s\n", ferry_store_direct_supported(s) ? "yes" : "no (buffered fallback)");
  int64_t ns = read_all(s, buf, cap, FERRY_READ_DROP_CACHE); /* drops pages as it goes */
  ns = read_all(s, buf, cap, FERRY_READ_DROP_CACHE);
  printf("pread, cache dropped:    %6.2f GB/s\n", gbps(total, ns));
  ns = read_all(s, buf, cap, FERRY_READ_DIRECT);
  printf("O_DIRECT:                %6.2f GB/s\n", gbps(total, ns));
  read_all(s, buf, cap, 0);
  ns = read_all(s, buf, cap, 0);
  printf("pread, page cache hot:   %6.2f GB/s\n", gbps(total, ns));
  if (ns >= 0) rc = 0;
  goto out;
out_err:
  fprintf(stderr, "store_read: %s\n", ferry_last_error());
out:
  ferry_store_close(s);
  ferry_store_writer_free(w);
  ferry_free(buf);
  if (dir) ferry__rm_rf(dir);
  ferry_free(dir);
  return rc;
}
