/* Mixed quantization plans: which format each tensor class gets ("attn=int4-g64,
 * expert=int3-g64,default=int8"), the class of every model tensor role, and the canonical text
 * form of a plan for run configs and reports. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "common/error.h"
#include "runtime/quant/quant_impl.h"

static const char *const class_names[FERRY_QCLASS_COUNT] = {
    [FERRY_QCLASS_ATTN] = "attn",         [FERRY_QCLASS_EXPERT] = "expert",
    [FERRY_QCLASS_SHARED] = "shared",     [FERRY_QCLASS_ROUTER] = "router",
    [FERRY_QCLASS_DENSE_FFN] = "dense_ffn", [FERRY_QCLASS_EMBED] = "embed",
    [FERRY_QCLASS_HEAD] = "head",         [FERRY_QCLASS_NORM] = "norm",
};

#define EXPECTED_CLASSES "attn, expert, shared, router, dense_ffn, embed, head, norm or default"

const char *ferry_quant_class_name(enum ferry_qclass cls) {
  return (unsigned)cls < FERRY_QCLASS_COUNT ? class_names[cls] : "?";
}

static int class_lookup(const char *name, size_t len) {
  for (int c = 0; c < FERRY_QCLASS_COUNT; c++) {
    if (strlen(class_names[c]) == len && strncasecmp(name, class_names[c], len) == 0) return c;
  }
  return -1;
}

ferry_status ferry_quant_class_parse(const char *name, enum ferry_qclass *out) {
  int c = name ? class_lookup(name, strlen(name)) : -1;
  if (c < 0)
    return ferry__fail(FERRY_ERR_INVALID, "quant plan: unknown tensor class '%s'; expected %s",
                       name ? name : "(null)", EXPECTED_CLASSES);
  *out = (enum ferry_qclass)c;
  return FERRY_OK;
}

static int is_float_format(enum ferry_qformat f) {
  return f == FERRY_QFORMAT_FP32 || f == FERRY_QFORMAT_FP16 || f == FERRY_QFORMAT_BF16;
}

void ferry_quant_plan_init(struct ferry_qplan *plan, const struct ferry_qspec *spec) {
  for (int c = 0; c < FERRY_QCLASS_COUNT; c++) plan->spec[c] = *spec;
  if (!is_float_format(spec->format))
    plan->spec[FERRY_QCLASS_NORM] = (struct ferry_qspec){.format = FERRY_QFORMAT_FP32};
}

static int is_space(char ch) { return ch == ' ' || ch == '\t'; }

ferry_status ferry_quant_plan_parse(const char *text, struct ferry_qplan *out) {
  if (!text || !out) return ferry__fail(FERRY_ERR_INVALID, "quant plan: NULL plan text");
  struct ferry_qplan plan;
  struct ferry_qspec fp16 = {.format = FERRY_QFORMAT_FP16};
  ferry_quant_plan_init(&plan, &fp16);
  plan.spec[FERRY_QCLASS_NORM] = (struct ferry_qspec){.format = FERRY_QFORMAT_FP32};
  int set[FERRY_QCLASS_COUNT] = {0}, have_default = 0, entries = 0;
  struct ferry_qspec def = fp16;
  const char *p = text;
  for (;;) {
    const char *start = p;
    while (*p && *p != ',') p++;
    const char *end = p;
    while (start < end && is_space(*start)) start++;
    while (end > start && is_space(end[-1])) end--;
    size_t off = (size_t)(start - text), len = (size_t)(end - start);
    char entry[128];
    if (len == 0)
      return ferry__fail(FERRY_ERR_INVALID,
                         "quant plan '%s': empty entry at offset %zu; expected class=format", text, off);
    if (len >= sizeof entry)
      return ferry__fail(FERRY_ERR_INVALID, "quant plan '%s': entry at offset %zu is too long", text, off);
    memcpy(entry, start, len);
    entry[len] = '\0';
    char *eq = strchr(entry, '=');
    const char *cls_name = "default", *fmt_name = entry;
    if (eq) {
      *eq = '\0';
      char *ce = eq;
      while (ce > entry && is_space(ce[-1])) *--ce = '\0';
      fmt_name = eq + 1;
      while (is_space(*fmt_name)) fmt_name++;
      cls_name = entry;
    } else if (entries > 0 || *p == ',') {
      return ferry__fail(FERRY_ERR_INVALID,
                         "quant plan '%s': entry '%s' at offset %zu has no '='; expected class=format",
                         text, entry, off);
    }
    struct ferry_qspec spec;
    if (ferry_quant_spec_parse(fmt_name, &spec) != FERRY_OK)
      return ferry__fail(FERRY_ERR_INVALID,
                         "quant plan '%s': unknown format '%s' for class '%s' at offset %zu; expected "
                         "fp32, fp16, bf16, int8, int4-g<G>, int3-g<G>, int2-g<G> or nf4",
                         text, fmt_name, cls_name, off);
    if (strcasecmp(cls_name, "default") == 0) {
      if (have_default)
        return ferry__fail(FERRY_ERR_INVALID, "quant plan '%s': 'default' given twice (offset %zu)",
                           text, off);
      have_default = 1;
      def = spec;
    } else {
      int c = class_lookup(cls_name, strlen(cls_name));
      if (c < 0)
        return ferry__fail(FERRY_ERR_INVALID,
                           "quant plan '%s': unknown tensor class '%s' at offset %zu; expected %s",
                           text, cls_name, off, EXPECTED_CLASSES);
      if (set[c])
        return ferry__fail(FERRY_ERR_INVALID, "quant plan '%s': class '%s' given twice (offset %zu)",
                           text, class_names[c], off);
      if (c == FERRY_QCLASS_NORM && !is_float_format(spec.format))
        return ferry__fail(FERRY_ERR_INVALID,
                           "quant plan '%s': norm=%s at offset %zu; norms stay fp32, fp16 or bf16",
                           text, fmt_name, off);
      set[c] = 1;
      plan.spec[c] = spec;
    }
    entries++;
    if (*p == '\0') break;
    p++;
  }
  if (have_default) {
    for (int c = 0; c < FERRY_QCLASS_COUNT; c++) {
      if (set[c]) continue;
      if (c == FERRY_QCLASS_NORM) {
        if (is_float_format(def.format)) plan.spec[c] = def;
        continue;
      }
      plan.spec[c] = def;
    }
  }
  *out = plan;
  return FERRY_OK;
}

char *ferry_quant_plan_format(const struct ferry_qplan *plan, char *buf, size_t size) {
  if (!buf || size == 0) return buf;
  size_t used = 0;
  buf[0] = '\0';
  for (int c = 0; c < FERRY_QCLASS_COUNT && used < size; c++) {
    char name[FERRY_QSPEC_NAME_MAX];
    int w = snprintf(buf + used, size - used, "%s%s=%s", c ? "," : "", class_names[c],
                     ferry_quant_spec_name(&plan->spec[c], name, sizeof name));
    if (w < 0) break;
    used += (size_t)w;
  }
  return buf;
}

ferry_status ferry_quant_plan_lookup(const struct ferry_qplan *plan, const char *class_name,
                                     struct ferry_qspec *out) {
  enum ferry_qclass c;
  ferry_status st = ferry_quant_class_parse(class_name, &c);
  if (st != FERRY_OK) return st;
  *out = plan->spec[c];
  return FERRY_OK;
}

enum ferry_qclass ferry_quant_class_of_role(enum ferry_tensor_role role) {
  switch (role) {
    case FERRY_ROLE_EMBED:
    case FERRY_ROLE_POS_EMBED: return FERRY_QCLASS_EMBED;
    case FERRY_ROLE_ATTN_Q:
    case FERRY_ROLE_ATTN_K:
    case FERRY_ROLE_ATTN_V:
    case FERRY_ROLE_ATTN_O:
    case FERRY_ROLE_ATTN_QKV: /* BLOOM's and GPT-NeoX's fused query_key_value */
    case FERRY_ROLE_MLA_Q_A:  /* DeepSeek's latent attention projections */
    case FERRY_ROLE_MLA_Q_B:
    case FERRY_ROLE_MLA_KV_A:
    case FERRY_ROLE_MLA_KV_B: return FERRY_QCLASS_ATTN;
    case FERRY_ROLE_FFN_GATE:
    case FERRY_ROLE_FFN_UP:
    case FERRY_ROLE_FFN_DOWN: return FERRY_QCLASS_DENSE_FFN;
    case FERRY_ROLE_ROUTER:
    case FERRY_ROLE_SHARED_EXPERT_GATE: return FERRY_QCLASS_ROUTER;
    case FERRY_ROLE_EXPERT_GATE:
    case FERRY_ROLE_EXPERT_UP:
    case FERRY_ROLE_EXPERT_DOWN:
    case FERRY_ROLE_EXPERT_GATE_UP: return FERRY_QCLASS_EXPERT; /* gpt-oss's and Llama 4's fused gate/up */
    case FERRY_ROLE_SHARED_GATE:
    case FERRY_ROLE_SHARED_UP:
    case FERRY_ROLE_SHARED_DOWN: return FERRY_QCLASS_SHARED;
    case FERRY_ROLE_LM_HEAD: return FERRY_QCLASS_HEAD;
    default: return FERRY_QCLASS_NORM; /* norms, q/k norms and every bias */
  }
}
