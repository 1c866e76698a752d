#!/bin/sh
# The main job (make demo): a synthetic Mixtral-shaped MoE model larger than its device budget,
# its memory plan, and an offloaded run on the host executor over a slice of the Azure 2023
# conversation trace, written to a result database.
set -eu
out=${1:-build/demo}
ferry=${FERRY:-build/ferry}
mkdir -p "$out"
model="$out/moe-demo"
if [ ! -f "$model/config.json" ]; then
  echo "== generating a Mixtral-shaped synthetic model (4 layers, 8 experts, skewed routing) into $model"
  "$ferry" model gen --preset mixtral-8x7b --layers 4 --scale 0.125 --vocab 4096 --dtype fp16 --seed 1 \
    --router-skew 0.5 --router-locality 0.6 --quiet --out "$model"
fi
echo "== the model"
"$ferry" model show "$model" | sed -n '/^parameters/,/^share/p'
policy="--device-budget 96MiB --block-layers 1 --prefetch-depth 1 --max-batch 4 --max-seq-tokens 4096"
echo
echo "== memory plan: $policy"
# shellcheck disable=SC2086
"$ferry" run --model "$model" --plan-only $policy
echo
echo "== serving the first 16 requests of the Azure 2023 conversation trace (10x faster), offloaded"
rm -f "$out/demo.db"
# shellcheck disable=SC2086
"$ferry" run --model "$model" --trace tests/data/traces/azure_conv_200.csv --max-requests 16 --rate-scale 10 \
  --quiet $policy --db "$out/demo.db"
echo
echo "== the run in the result database ($out/demo.db)"
"$ferry" db list --db "$out/demo.db"
