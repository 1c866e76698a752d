#!/bin/sh
# The main job (make demo): generate a small synthetic MoE model whose routers behave like a
# trained model's (routing profile mixtral); calibrate this machine; record its routing and
# compare the expert predictors on it with confidence intervals; sweep block layers x prefetch
# depth on the host executor and in the simulator over a slice of the Azure 2023 conversation
# trace; simulate the same workload at full Mixtral-8x7B size on three catalogue GPUs; write the
# report and print a short summary. Takes a few minutes.
set -eu
out=${1:-build/demo}
ferry=${FERRY:-build/ferry}
trace=tests/data/traces/azure_conv_200.csv
mkdir -p "$out"
out=$(cd "$out" && pwd)
model="$out/moe-demo"
db="$out/study.db"
start=$(date +%s)
step() { printf '\n== [%3ss] %s\n' "$(($(date +%s) - start))" "$*"; }

if [ ! -f "$model/config.json" ]; then
  step "generating a Mixtral-shaped synthetic model (4 layers, 8 experts, routers shaped like Mixtral's) into $model"
  "$ferry" model gen --preset mixtral-8x7b --layers 4 --scale 0.125 --vocab 4096 --dtype fp16 --seed 1 \
    --routing-profile mixtral --quiet --out "$model"
fi
"$ferry" model show "$model" | sed -n '/^parameters/,/^  tensors/p'

step "calibrating this machine (ferry calibrate --probe), then fitting kernel costs to a calibration run"
"$ferry" calibrate --probe --out "$out/host.json" --dir "$out" | head -1
rm -f "$out/calib.db"
"$ferry" run --model "$model" --trace "$trace" --time-window 35:62 --max-requests 6 --rate-scale 10 \
  --device-budget 64MiB --max-batch 4 --max-seq-tokens 4096 --quiet --db "$out/calib.db" >/dev/null
"$ferry" calibrate --db "$out/calib.db" --run 1 --base "$out/host.json" --out "$out/fitted.json" | grep "^wrote"

step "recording the routing of the evaluated requests, so the simulator sees the experts the real runs see"
# with mlp3 features and the gate-lookahead choices made from the real routers, for the predictors
"$ferry" run --model "$model" --trace "$trace" --max-requests 8 --rate-scale 10 --device-budget 64MiB --max-batch 4 \
  --max-seq-tokens 4096 --quiet --record-routing "$out/routing.jsonl" --record-features mlp3 \
  --predictor gate-lookahead >/dev/null
# other requests (the calibration slice) to train the MLPs and count popularity on: held out
"$ferry" run --model "$model" --trace "$trace" --time-window 35:62 --max-requests 6 --rate-scale 10 \
  --device-budget 64MiB --max-batch 4 --max-seq-tokens 4096 --quiet --record-routing "$out/routing-train.jsonl" \
  --record-features mlp3 >/dev/null
"$ferry" trace routing stats "$out/routing.jsonl" | sed -n '3,7p'

step "expert predictors on the recorded routing (trained on other requests; 95% bootstrap intervals)"
"$ferry" predictor eval --routing "$out/routing.jsonl" --train-routing "$out/routing-train.jsonl" \
  --variant frequency,mlp3,mlp7,gate-lookahead,oracle 2>/dev/null | tee "$out/predictors.txt"

step "sweep: block layers x prefetch depth, host executor and simulator (first 8 requests, 10x faster)"
cat >"$out/sweep.json" <<JSON
{"executor": ["host", "sim"], "hw": ["$out/fitted.json"], "routing": ["$out/routing.jsonl"],
 "model": ["$model"], "trace": ["$trace"],
 "max_requests": [8], "rate_scale": [10], "device_budget": ["64MiB"], "max_batch": [4],
 "max_seq_tokens": [4096], "block_layers": [1, 2], "prefetch_depth": [0, 1, 2]}
JSON
"$ferry" sweep --spec "$out/sweep.json" --db "$db"

step "what if: the same workload at full Mixtral-8x7B size on three GPUs (simulated, each with its default budget)"
# no device_budget: each GPU gets 90 % of its own memory, so an 80 GB card is not judged as a 24 GB one
cat >"$out/whatif.json" <<JSON
{"executor": ["sim"], "hw": ["l4", "a100-80gb-sxm", "h100-pcie"], "model": ["mixtral-8x7b"], "trace": ["$trace"],
 "max_requests": [8], "rate_scale": [10], "max_batch": [4],
 "max_seq_tokens": [4096], "block_layers": [1], "prefetch_depth": [1]}
JSON
"$ferry" sweep --spec "$out/whatif.json" --db "$db" -j 3

step "expert predictors in the simulator (the recorded routing replayed; the report's predictor tables)"
"$ferry" predictor train --routing "$out/routing-train.jsonl" --variant mlp3 --out "$out/mlp3.safetensors" >/dev/null
for spec in predictors predictors-lru predictors-mlp3; do
  # lru reads no routing trace and the simulator's oracle knows the replayed routing (both refuse
  # one); the others read the recorded one
  case $spec in
    predictors) extra="\"predictor\": [\"frequency\", \"gate-lookahead\"], \"predictor_routing\": [\"$out/routing.jsonl\"]" ;;
    predictors-lru) extra='"predictor": ["lru", "oracle"]' ;;
    *) extra="\"predictor\": [\"mlp3\"], \"predictor_model\": [\"$out/mlp3.safetensors\"], \"predictor_routing\": [\"$out/routing.jsonl\"]" ;;
  esac
  cat >"$out/$spec.json" <<JSON
{"executor": ["sim"], "hw": ["$out/fitted.json"], "routing": ["$out/routing.jsonl"],
 "model": ["$model"], "trace": ["$trace"],
 "max_requests": [8], "rate_scale": [10], "device_budget": ["64MiB"], "max_batch": [4],
 "max_seq_tokens": [4096], "block_layers": [1], "prefetch_depth": [1], $extra}
JSON
  "$ferry" sweep --spec "$out/$spec.json" --db "$db" --quiet
done

step "report"
"$ferry" report --db "$db" --out "$out/report" >/dev/null
echo "summary (mean latencies per run):"
sqlite3 -column -header "$db" "
  SELECT r.id AS run, r.kind, json_extract(r.config_json, '$.hw') AS hw,
         json_extract(r.config_json, '$.block_layers') AS block, json_extract(r.config_json, '$.prefetch_depth') AS depth,
         printf('%.0f', AVG(q.first_token_ns - q.arrival_ns) / 1e6) AS ttft_ms,
         printf('%.1f', AVG((q.finish_ns - q.first_token_ns) * 1.0 / MAX(q.output_tokens - 1, 1)) / 1e6) AS tpot_ms
  FROM runs r JOIN requests q ON q.runId = r.id WHERE r.complete = 1
  GROUP BY r.id ORDER BY r.id;"
step "done: open $out/report/index.html"
