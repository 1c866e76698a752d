/* The table of architecture families: each family's Hugging Face spellings (model_type,
 * architecture class) and the traits the checks, the layout and the reader key on, so adding a
 * family is one row here plus its layout and reader functions. */
#include <stdio.h>
#include <string.h>

#include "runtime/model/model_impl.h"

static const struct ferry_family_traits traits[] = {
    [FERRY_FAMILY_LLAMA] = {"llama", "LlamaForCausalLM", FERRY__NAMES_LLAMA, 0},
    [FERRY_FAMILY_MISTRAL] = {"mistral", "MistralForCausalLM", FERRY__NAMES_LLAMA, 0},
    [FERRY_FAMILY_MIXTRAL] = {"mixtral", "MixtralForCausalLM", FERRY__NAMES_LLAMA, 1},
    [FERRY_FAMILY_QWEN2] = {"qwen2", "Qwen2ForCausalLM", FERRY__NAMES_LLAMA, 0},
    [FERRY_FAMILY_QWEN2_MOE] = {"qwen2_moe", "Qwen2MoeForCausalLM", FERRY__NAMES_LLAMA, 1},
    [FERRY_FAMILY_OLMOE] = {"olmoe", "OlmoeForCausalLM", FERRY__NAMES_LLAMA, 1},
    [FERRY_FAMILY_OPT] = {"opt", "OPTForCausalLM", FERRY__NAMES_OPT, 0},
    [FERRY_FAMILY_QWEN3] = {"qwen3", "Qwen3ForCausalLM", FERRY__NAMES_LLAMA, 0},
    [FERRY_FAMILY_QWEN3_MOE] = {"qwen3_moe", "Qwen3MoeForCausalLM", FERRY__NAMES_LLAMA, 1},
    [FERRY_FAMILY_GEMMA2] = {"gemma2", "Gemma2ForCausalLM", FERRY__NAMES_LLAMA, 0},
    [FERRY_FAMILY_GEMMA3] = {"gemma3_text", "Gemma3ForCausalLM", FERRY__NAMES_LLAMA, 0},
    [FERRY_FAMILY_PHIMOE] = {"phimoe", "PhimoeForCausalLM", FERRY__NAMES_LLAMA, 1},
    [FERRY_FAMILY_GPT_NEOX] = {"gpt_neox", "GPTNeoXForCausalLM", FERRY__NAMES_NEOX, 0},
    [FERRY_FAMILY_LLAMA4] = {"llama4_text", "Llama4ForCausalLM", FERRY__NAMES_LLAMA, 1},
    [FERRY_FAMILY_DEEPSEEK_V2] = {"deepseek_v2", "DeepseekV2ForCausalLM", FERRY__NAMES_LLAMA, 1},
    [FERRY_FAMILY_DEEPSEEK_V3] = {"deepseek_v3", "DeepseekV3ForCausalLM", FERRY__NAMES_LLAMA, 1},
    [FERRY_FAMILY_GPT_OSS] = {"gpt_oss", "GptOssForCausalLM", FERRY__NAMES_LLAMA, 1},
    [FERRY_FAMILY_BLOOM] = {"bloom", "BloomForCausalLM", FERRY__NAMES_BLOOM, 0},
    [FERRY_FAMILY_GPTJ] = {"gptj", "GPTJForCausalLM", FERRY__NAMES_GPTJ, 0},
};
#define N_FAMILIES ((int)(sizeof traits / sizeof traits[0]))

int ferry__family_count(void) { return N_FAMILIES; }

const struct ferry_family_traits *ferry__family(enum ferry_family f) {
  return (int)f >= 0 && (int)f < N_FAMILIES ? &traits[f] : NULL;
}

const char *ferry_family_name(enum ferry_family family) {
  const struct ferry_family_traits *t = ferry__family(family);
  return t ? t->model_type : "?";
}

ferry_status ferry_family_parse(const char *name, enum ferry_family *out) {
  if (!name || !out) return FERRY_ERR_INVALID;
  for (int i = 0; i < N_FAMILIES; i++) {
    if (!strcmp(name, traits[i].model_type)) {
      *out = (enum ferry_family)i;
      return FERRY_OK;
    }
  }
  return FERRY_ERR_UNSUPPORTED;
}

void ferry__family_list(char *buf, size_t len) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < N_FAMILIES && used < len; i++) {
    int k = snprintf(buf + used, len - used, "%s%s", i ? ", " : "", traits[i].model_type);
    if (k < 0) break;
    used += (size_t)k;
  }
}
