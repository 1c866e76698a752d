/* What tests/nvtx_inject.c (an NVTX tool, loaded by NVTX from NVTX_INJECTION64_PATH) saw. */
#ifndef FERRY_TEST_NVTX_INJECT_H
#define FERRY_TEST_NVTX_INJECT_H

#include <stdint.h>

enum nvtx_seen_kind { NVTX_SEEN_START, NVTX_SEEN_END, NVTX_SEEN_PUSH, NVTX_SEEN_POP };

struct nvtx_seen {
  enum nvtx_seen_kind kind;
  uint64_t id;          /* start/end: the range id */
  char message[96];     /* start/push */
  int has_payload;
  int64_t payload;
  uint32_t color;
  int domain_ok;        /* the call named the domain created as "ferry" */
};

struct nvtx_seen_log {
  int domains_created;  /* nvtxDomainCreateA("ferry") calls */
  int64_t n;            /* events kept (at most NVTX_SEEN_MAX) */
  int64_t dropped;      /* events beyond NVTX_SEEN_MAX */
  struct nvtx_seen *events;
};

#define NVTX_SEEN_MAX 65536

/* Exported by the tool: the events so far (reset clears them). */
typedef const struct nvtx_seen_log *(*nvtx_seen_fn)(int reset);

#endif
