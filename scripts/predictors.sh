#!/bin/sh
# Expert predictors on the host executor and in the simulator, on the `make demo` model:
# hit rate, prefetch precision, compute stall and TPOT per predictor, as a Markdown table.
# Needs `make demo` first (model, recorded routing, fitted hardware profile in build/demo).
# usage: scripts/predictors.sh [DEMO_DIR]   (default build/demo; about 1.5 min)
set -eu
demo=${1:-build/demo}
ferry=${FERRY:-build/ferry}
routing="$demo/routing.jsonl"
for f in "$demo/moe-demo/config.json" "$routing" "$demo/fitted.json"; do
  [ -f "$f" ] || { echo "predictors.sh: $f is missing: run make demo first" >&2; exit 1; }
done
mlp="$demo/mlp3.safetensors"
train="$demo/routing-train.jsonl" # other requests, recorded by make demo (held out)
[ -f "$train" ] || train="$routing"
"$ferry" predictor train --routing "$train" --variant mlp3 --out "$mlp" >/dev/null
set -- --model "$demo/moe-demo" --trace tests/data/traces/azure_conv_200.csv --max-requests 8 --rate-scale 10 \
  --device-budget 96MiB --block-layers 1 --prefetch-depth 1 --max-batch 4 --max-seq-tokens 4096 --quiet
echo "| predictor | executor | hit rate | prefetch precision | compute stall | mean TPOT |"
echo "|---|---|---|---|---|---|"
for p in none lru frequency gate-lookahead mlp3 oracle; do
  for ex in run sim; do
    extra=""
    [ "$p" = mlp3 ] && extra="--predictor-model $mlp"
    [ "$ex" = sim ] && extra="$extra --hw $demo/fitted.json --routing $routing"
    # the recorded trace, to the predictors that read it (ferry refuses an option it would ignore):
    # popularity for frequency, the future for a real run's oracle, and in the simulator the
    # lookahead choices and features the real run recorded
    case "$p/$ex" in
      frequency/*|oracle/run|gate-lookahead/sim|mlp3/sim) extra="$extra --predictor-routing $routing" ;;
    esac
    # shellcheck disable=SC2086
    out=$("$ferry" "$ex" "$@" --predictor "$p" $extra 2>&1) || { echo "$out" >&2; exit 1; }
    hit=$(echo "$out" | sed -n 's/.*(\([0-9.]*%\) hit rate).*/\1/p')
    prec=$(echo "$out" | sed -n 's/.*(precision \([0-9.]*%\)).*/\1/p')
    stall=$(echo "$out" | sed -n 's/^compute stall \([0-9.]* [a-z]*\);.*/\1/p')
    tpot=$(echo "$out" | awk '/^TPOT/ {print $2, $3}')
    [ "$ex" = run ] && name=host || name=sim
    echo "| $p | $name | ${hit:-0%} | ${prec:-–} | ${stall:-0} | $tpot |"
  done
done
