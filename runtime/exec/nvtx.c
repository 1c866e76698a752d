/* NVTX ranges for profilers attached to the process. NVTX is header-only: until a tool
 * (Nsight Systems, or any library named by NVTX_INJECTION64_PATH) attaches, each call costs
 * one indirect call to a no-op. The headers ship with the CUDA toolkit; builds without them
 * (FERRY_NVTX=OFF, or no toolkit) make no NVTX calls. */
#include "nvtx.h"

#ifdef FERRY_HAVE_NVTX
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <nvtx3/nvToolsExt.h>

#include "ferry/activity.h"

static nvtxDomainHandle_t domain;
static pthread_once_t domain_once = PTHREAD_ONCE_INIT;

static void create_domain(void) { domain = nvtxDomainCreateA(FERRY_NVTX_DOMAIN); }

static nvtxDomainHandle_t ferry_domain(void) {
  pthread_once(&domain_once, create_domain);
  return domain;
}

/* One colour per kind of range, so a timeline reads at a glance. */
static uint32_t color_of(const char *name) {
  static const struct {
    const char *name;
    uint32_t argb;
  } colors[] = {{"step", 0xff808080u},        {"layer", 0xff4e79a7u},        {"block fetch", 0xfff28e2bu},
                {"expert fetch", 0xff59a14fu}, {"load weights", 0xffb07aa1u}};
  for (size_t i = 0; i < sizeof colors / sizeof colors[0]; i++)
    if (!strcmp(name, colors[i].name)) return colors[i].argb;
  return 0xff76b7b2u;
}

static nvtxEventAttributes_t attributes(const char *message, uint32_t argb) {
  nvtxEventAttributes_t a;
  memset(&a, 0, sizeof a);
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.colorType = NVTX_COLOR_ARGB;
  a.color = argb;
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = message;
  return a;
}

uint64_t ferry__nvtx_start(const char *name, int32_t step, int32_t layer, int32_t expert) {
  char msg[96];
  int n;
  if (layer < 0 && expert < 0 && step >= 0)
    n = snprintf(msg, sizeof msg, "%s %d", name, step);
  else
    n = snprintf(msg, sizeof msg, "%s", name);
  if (layer >= 0 && n >= 0 && (size_t)n < sizeof msg) n += snprintf(msg + n, sizeof msg - (size_t)n, " L%d", layer);
  if (expert >= 0 && n >= 0 && (size_t)n < sizeof msg) snprintf(msg + n, sizeof msg - (size_t)n, " E%d", expert);
  nvtxEventAttributes_t a = attributes(msg, color_of(name));
  if (step >= 0) {
    a.payloadType = NVTX_PAYLOAD_TYPE_INT64;
    a.payload.llValue = step;
  }
  return nvtxDomainRangeStartEx(ferry_domain(), &a);
}

void ferry__nvtx_end(uint64_t id) { nvtxDomainRangeEnd(ferry_domain(), id); }

void ferry__nvtx_push(const char *name) {
  nvtxEventAttributes_t a = attributes(name, color_of(name));
  nvtxDomainRangePushEx(ferry_domain(), &a);
}

void ferry__nvtx_pop(void) { nvtxDomainRangePop(ferry_domain()); }

#else /* !FERRY_HAVE_NVTX */

uint64_t ferry__nvtx_start(const char *name, int32_t step, int32_t layer, int32_t expert) {
  (void)name, (void)step, (void)layer, (void)expert;
  return 0;
}
void ferry__nvtx_end(uint64_t id) { (void)id; }
void ferry__nvtx_push(const char *name) { (void)name; }
void ferry__nvtx_pop(void) {}

#endif /* FERRY_HAVE_NVTX */
