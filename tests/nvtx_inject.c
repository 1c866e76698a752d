/* A minimal NVTX tool for the tests: NVTX loads it from NVTX_INJECTION64_PATH at the process's
 * first NVTX call, exactly as it loads Nsight Systems' injection, and it records every range
 * call of the core domain API so a test can check what a profiler would have shown. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <nvtx3/nvToolsExt.h>

#include "nvtx_inject.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct nvtx_seen events[NVTX_SEEN_MAX];
static struct nvtx_seen_log seen = {.events = events};
static uint64_t next_id = 1;
static char ferry_domain; /* its address is the handle of the domain "ferry" */
static char other_domain;

static void record(enum nvtx_seen_kind kind, nvtxDomainHandle_t d, uint64_t id, const nvtxEventAttributes_t *a) {
  pthread_mutex_lock(&mu);
  if (seen.n < NVTX_SEEN_MAX) {
    struct nvtx_seen *s = &events[seen.n++];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->id = id;
    s->domain_ok = d == (nvtxDomainHandle_t)(void *)&ferry_domain;
    if (a) {
      if (a->messageType == NVTX_MESSAGE_TYPE_ASCII && a->message.ascii)
        snprintf(s->message, sizeof s->message, "%s", a->message.ascii);
      if (a->payloadType == NVTX_PAYLOAD_TYPE_INT64) {
        s->has_payload = 1;
        s->payload = a->payload.llValue;
      }
      if (a->colorType == NVTX_COLOR_ARGB) s->color = a->color;
    }
  } else {
    seen.dropped++;
  }
  pthread_mutex_unlock(&mu);
}

static nvtxDomainHandle_t NVTX_API domain_create(const char *name) {
  if (name && !strcmp(name, "ferry")) {
    pthread_mutex_lock(&mu);
    seen.domains_created++;
    pthread_mutex_unlock(&mu);
    return (nvtxDomainHandle_t)(void *)&ferry_domain;
  }
  return (nvtxDomainHandle_t)(void *)&other_domain;
}

static nvtxRangeId_t NVTX_API range_start(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) {
  pthread_mutex_lock(&mu);
  uint64_t id = next_id++;
  pthread_mutex_unlock(&mu);
  record(NVTX_SEEN_START, d, id, a);
  return id;
}

static void NVTX_API range_end(nvtxDomainHandle_t d, nvtxRangeId_t id) { record(NVTX_SEEN_END, d, id, NULL); }

static int NVTX_API range_push(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) {
  record(NVTX_SEEN_PUSH, d, 0, a);
  return 0;
}

static int NVTX_API range_pop(nvtxDomainHandle_t d) {
  record(NVTX_SEEN_POP, d, 0, NULL);
  return 0;
}

__attribute__((visibility("default"))) const struct nvtx_seen_log *ferry_test_nvtx_seen(int reset) {
  pthread_mutex_lock(&mu);
  if (reset) {
    seen.n = 0;
    seen.dropped = 0;
  }
  pthread_mutex_unlock(&mu);
  return &seen;
}

__attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_table) {
  const NvtxExportTableCallbacks *cb = (const NvtxExportTableCallbacks *)get_table(NVTX_ETID_CALLBACKS);
  NvtxFunctionTable table = NULL;
  unsigned int size = 0;
  if (!cb || !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) || size <= NVTX_CBID_CORE2_DomainCreateA)
    return 0;
  *table[NVTX_CBID_CORE2_DomainCreateA] = (NvtxFunctionPointer)domain_create;
  *table[NVTX_CBID_CORE2_DomainRangeStartEx] = (NvtxFunctionPointer)range_start;
  *table[NVTX_CBID_CORE2_DomainRangeEnd] = (NvtxFunctionPointer)range_end;
  *table[NVTX_CBID_CORE2_DomainRangePushEx] = (NvtxFunctionPointer)range_push;
  *table[NVTX_CBID_CORE2_DomainRangePop] = (NvtxFunctionPointer)range_pop;
  return 1;
}
