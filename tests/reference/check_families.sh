#!/bin/sh
# Generates a small model of each family ferry computes (a tiny preset or a small config from
# tests/data/configs/tiny), runs it offloaded on the host executor
# with --dump-logits, and compares every generated token's logits with the numpy re-implementation
# of the Hugging Face forward pass (hf_reference.py). Needs /usr/bin/python3 with numpy.
set -eu
ferry=${FERRY_BIN:?FERRY_BIN is not set}
src=${FERRY_SOURCE_DIR:?FERRY_SOURCE_DIR is not set}
py=/usr/bin/python3
if ! $py -c 'import numpy' 2>/dev/null; then
  echo "SKIP: python3-numpy is not installed (scripts/setup-deps.sh installs it)"
  exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ferry-ref-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
check() { # name, gen args...
  name=$1
  shift
  "$ferry" model gen --quiet --out "$tmp/$name" --dtype fp32 --seed 5 "$@" >/dev/null
  "$ferry" run --quiet --model "$tmp/$name" --synthetic rate=100,n=4,prompt=uniform:3:12,output=4 \
    --as-fast-as-possible --max-batch 3 --max-step-tokens 8 --device-budget 12M --block-layers 1 \
    --prefetch-depth 1 --greedy --dump-logits "$tmp/$name.jsonl" >/dev/null
  $py "$src/tests/reference/hf_reference.py" "$tmp/$name" "$tmp/$name.jsonl"
}
check llama --preset tiny-dense
check mixtral --preset tiny-moe
check qwen2_moe --preset tiny-qwen2-moe
check olmoe --preset tiny-olmoe
check qwen2 --preset "$src/tests/data/configs/qwen2" --layers 2 --scale 0.25 --vocab 256
check mistral --preset "$src/tests/data/configs/mistral" --layers 2 --scale 0.0625 --vocab 256
# the families of 2024-26, small shapes of their real configurations (tests/data/configs/tiny)
tiny="$src/tests/data/configs/tiny"
check qwen3 --preset "$tiny/qwen3"
check qwen3_moe --preset "$tiny/qwen3_moe"
check gemma2 --preset "$tiny/gemma2"
check gemma3 --preset "$tiny/gemma3"
check phimoe --preset "$tiny/phimoe"
check gpt_neox --preset "$tiny/gpt_neox"
check gpt_neox_seq --preset "$tiny/gpt_neox_seq"
check llama4 --preset "$tiny/llama4"
check deepseek_v2 --preset "$tiny/deepseek_v2"
check deepseek_v3 --preset "$tiny/deepseek_v3"
check gpt_oss --preset "$tiny/gpt_oss"
check bloom --preset "$tiny/bloom"
check gptj --preset "$tiny/gptj"
# quantized checkpoints in their published layouts (written by quantize_published.py): ferry
# reads the packed parts and must match the reference run on the weights they dequantize to
check_quant() { # name, format, gen args...
  name=$1
  fmt=$2
  shift 2
  "$ferry" model gen --quiet --out "$tmp/$name-src" --dtype fp32 --seed 5 "$@" >/dev/null
  $py "$src/tests/reference/quantize_published.py" "$tmp/$name-src" "$fmt" "$tmp/$name" "$tmp/$name-ref" >/dev/null
  "$ferry" run --quiet --model "$tmp/$name" --synthetic rate=100,n=4,prompt=uniform:3:12,output=4 \
    --as-fast-as-possible --max-batch 3 --max-step-tokens 8 --device-budget 12M --block-layers 1 \
    --prefetch-depth 1 --greedy --dump-logits "$tmp/$name.jsonl" >/dev/null
  printf '%s ' "$fmt"
  $py "$src/tests/reference/hf_reference.py" "$tmp/$name-ref" "$tmp/$name.jsonl"
}
check_quant qwen3-gptq gptq --preset "$tiny/qwen3"
check_quant qwen3-awq awq --preset "$tiny/qwen3"
check_quant qwen3-ct ct --preset "$tiny/qwen3"
check_quant gpt_oss-mxfp4 mxfp4 --preset "$tiny/gpt_oss"
check_quant deepseek_v3-fp8 fp8 --preset "$tiny/deepseek_v3"
