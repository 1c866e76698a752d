#!/bin/sh
# Fidelity of the simulator against the host executor on this machine.
#   1. a synthetic Mixtral-shaped model and a slice of the Azure 2023 conversation trace;
#   2. calibration: `ferry calibrate --probe`, then calibration runs (FIDELITY_REPEATS of them,
#      one per round of step 3) on a *different* slice of the trace; `ferry calibrate --db --run
#      all` fits per-kernel-kind costs to the timelines of all of them together;
#   3. 12 configurations (block layers x prefetch depth x device budget), each run for real
#      (`ferry run`, host executor) and simulated (`ferry sim` with the fitted profile and the
#      routing the real run recorded, so both see the same experts);
#   4. a table per configuration: measured and simulated mean TTFT, mean TPOT and P99
#      end-to-end latency with their errors, and the median absolute error of each.
# Real runs on a shared machine vary by several percent from one run to the next: each
# configuration runs FIDELITY_REPEATS times for real (default 3) and the table takes the
# median of each measured figure; the spread column is the TPOT range over the repeats.
# Exits 1, naming them, when the medians miss the goals (5 % for mean TTFT and TPOT, 10 % for P99
# end-to-end), and warns when the calibration runs are more than FIDELITY_MAX_PACE_SPREAD % apart
# (default 10) or a configuration's real rounds a median of more than FIDELITY_MAX_ROUND_SPREAD %
# (default 10) apart in TPOT: the machine was not quiet.
# usage: scripts/fidelity.sh [OUT_DIR]   (default build/fidelity; takes about 15 minutes on 2 cores)
set -eu
out=${1:-build/fidelity}
ferry=${FERRY:-build/ferry}
shared=../shared/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv
if [ -z "${FIDELITY_TRACE:-}" ] && [ -f "$shared" ]; then FIDELITY_TRACE=$shared; fi
trace=${FIDELITY_TRACE:-tests/data/traces/azure_conv_200.csv}
mkdir -p "$out"
model="$out/model"
if [ ! -f "$model/config.json" ]; then
  "$ferry" model gen --preset mixtral-8x7b --layers 4 --scale 0.125 --vocab 4096 --dtype fp16 --seed 3 \
    --router-skew 0.5 --router-locality 0.6 --quiet --out "$model"
fi
common="--max-batch 4 --max-step-tokens 128 --max-seq-tokens 2048 --seed 7 --quiet"
# evaluation and calibration on different requests of the trace (the slice spans 61 s)
eval_slice="--max-requests 12 --time-window 0:30 --rate-scale 4"
calib_slice="--max-requests 8 --time-window 35:62 --rate-scale 4"
db="$out/fidelity.db"
repeats=${FIDELITY_REPEATS:-3}
rm -f "$db" "$out/calib.db" "$out/sim-stderr.txt"

# other work on the machine slows real runs and not simulated ones: say how busy it was
echo "== load average at start: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null) on $(nproc 2>/dev/null) cores"
echo "== calibrating: probe (calibration runs, on another slice of the trace, go in the rounds below)"
"$ferry" calibrate --probe --out "$out/host.json" --dir "$out" >/dev/null
configs="48MiB:1:0 48MiB:1:1 48MiB:1:2 48MiB:2:0 48MiB:2:1 48MiB:2:2 80MiB:1:0 80MiB:1:1 80MiB:1:2 80MiB:2:0 80MiB:2:1 80MiB:2:2"
policy_of() { # BUDGET:BLOCK:DEPTH -> ferry options
  echo "$1" | awk -F: '{ printf "--device-budget %s --block-layers %s --prefetch-depth %s", $1, $2, $3 }'
}
metrics() { # db run -> "mean_ttft mean_tpot p99_e2e" in ms
  sqlite3 "$1" "
    WITH r AS (SELECT first_token_ns - arrival_ns AS ttft, finish_ns - arrival_ns AS e2e,
                      CASE WHEN output_tokens > 1 THEN (finish_ns - first_token_ns) * 1.0 / (output_tokens - 1) END AS tpot
               FROM requests WHERE runId = $2 AND finish_ns >= 0),
         o AS (SELECT e2e, ROW_NUMBER() OVER (ORDER BY e2e) AS k, COUNT(*) OVER () AS n FROM r)
    SELECT printf('%.3f %.3f %.3f', (SELECT AVG(ttft) FROM r) / 1e6, (SELECT AVG(tpot) FROM r) / 1e6,
                  (SELECT e2e FROM o WHERE k = MAX(1, CAST(ROUND(0.99 * (n - 1)) AS INTEGER) + 1)) / 1e6);"
}
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
range_pct() { sort -n | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.1f", (hi - lo) / lo * 100 }'; } # (max - min) / min
errs="$out/errors.txt"
: >"$errs"
# Real runs go in rounds: each round runs the calibration slice once and then every configuration
# once, so a machine that gets busier or quieter during the study (other work starting or ending,
# the CPU's clock) moves every configuration and the calibration alike instead of whichever ran
# in that stretch (the first version ran all repeats of one configuration, the 48 MiB ones first,
# and its 48/80 MiB split followed the load average down).
echo "== calibration runs and 12 configurations, real, in $repeats rounds"
for rep in $(seq 1 "$repeats"); do
  # shellcheck disable=SC2086
  "$ferry" run --model "$model" --trace "$trace" $calib_slice $common --device-budget 64MiB \
    --block-layers 1 --prefetch-depth 1 --db "$out/calib.db" >/dev/null
  for cfg in $configs; do
    name=$(echo "$cfg" | tr : -)
    record=""
    [ "$rep" -eq 1 ] && { : >"$out/real-$name.txt"; record="--record-routing $out/routing-$name.jsonl"; }
    # shellcheck disable=SC2086
    "$ferry" run --model "$model" --trace "$trace" $eval_slice $common $(policy_of "$cfg") --db "$db" $record >/dev/null
    metrics "$db" "$(sqlite3 "$db" "SELECT MAX(id) FROM runs")" >>"$out/real-$name.txt"
  done
  echo "   round $rep of $repeats done (load average $(cut -d' ' -f1 /proc/loadavg 2>/dev/null))"
done
# The fit pools every calibration run: the machine's pace differs from one round to the next by
# several percent, and a fit to one run carried that run's pace into every simulation (fitting
# the run of median length still left the simulated figures 4-8 % off in a whole study whose
# median run was a fast one).
"$ferry" calibrate --db "$out/calib.db" --run all --base "$out/host.json" --out "$out/fitted.json" >/dev/null
# how far the machine's pace moved between rounds: the calibration runs are the same work
paces=$(sqlite3 "$out/calib.db" "SELECT printf('%.2f', (MAX(end_ns) - MIN(start_ns)) / 1e9) FROM steps GROUP BY runId ORDER BY runId")
pace_spread=$(echo "$paces" | range_pct)
echo "   fitted to all $repeats calibration runs together; they took $(echo "$paces" | paste -sd, - | sed 's/,/, /g') s" \
  "($pace_spread % apart)"
# the host executor's queue threads sleep in a wait: how long one took to run on after its event
wake_ns=$(sed -n 's/.*"event_wake_ns":[[:space:]]*\([0-9][0-9]*\).*/\1/p' "$out/fitted.json" | head -n 1)
[ -n "$wake_ns" ] && echo "   a queue blocked in a wait ran on a median $(awk -v w="$wake_ns" 'BEGIN { printf "%.1f", w / 1000 }') us" \
  "after its event in those runs (host.event_wake_ns)"
# Quiet rounds put the calibration runs 2-7 % apart (sessions 16-18); one study whose runs were
# 27.5 % apart (other work on the machine) fitted a pace the configurations' rounds did not share
# and missed every goal by 8-13 points, where a rerun on the quiet machine met them.
max_pace_spread=${FIDELITY_MAX_PACE_SPREAD:-10}
if awk -v s="$pace_spread" -v m="$max_pace_spread" 'BEGIN { exit !(s > m) }'; then
  echo "warning: the calibration runs are $pace_spread % apart (more than $max_pace_spread %): the machine's pace" \
    "moved between rounds, and the fit carries their average; rerun on a quiet machine before trusting the table" >&2
fi

echo "== simulated"
printf '%-26s %10s %10s %7s %10s %10s %7s %10s %10s %7s %9s\n' "config" "TTFT real" "TTFT sim" "err%" \
  "TPOT real" "TPOT sim" "err%" "p99 real" "p99 sim" "err%" "spread%"
for cfg in $configs; do
  name=$(echo "$cfg" | tr : -)
  reals="$out/real-$name.txt"
  real="$(cut -d' ' -f1 "$reals" | median) $(cut -d' ' -f2 "$reals" | median) $(cut -d' ' -f3 "$reals" | median)"
  spread=$(cut -d' ' -f2 "$reals" | range_pct)
  # shellcheck disable=SC2086
  "$ferry" sim --model "$model" --hw "$out/fitted.json" --trace "$trace" $eval_slice $common $(policy_of "$cfg") \
    --routing "$out/routing-$name.jsonl" --db "$db" >/dev/null 2>>"$out/sim-stderr.txt" || { tail -3 "$out/sim-stderr.txt"; exit 1; }
  sim_id=$(sqlite3 "$db" "SELECT MAX(id) FROM runs")
  # shellcheck disable=SC2086
  set -- $real $(metrics "$db" "$sim_id")
  line=$(awk -v a="$1" -v b="$2" -v c="$3" -v d="$4" -v e="$5" -v f="$6" 'BEGIN {
    ea = (d - a) / a * 100; eb = (e - b) / b * 100; ec = (f - c) / c * 100;
    printf "%10.1f %10.1f %+7.1f %10.2f %10.2f %+7.1f %10.1f %10.1f %+7.1f|%f %f %f", a, d, ea, b, e, eb, c, f, ec,
           (ea < 0 ? -ea : ea), (eb < 0 ? -eb : eb), (ec < 0 ? -ec : ec) }')
  printf '%-26s %s %9s\n' "$(echo "$cfg" | awk -F: '{ printf "%s b%s d%s", $1, $2, $3 }')" "${line%%|*}" "$spread"
  echo "${line##*|} $spread" >>"$errs"
done
ttft_err=$(cut -d' ' -f1 "$errs" | median)
tpot_err=$(cut -d' ' -f2 "$errs" | median)
p99_err=$(cut -d' ' -f3 "$errs" | median)
printf '\nmedian absolute error: mean TTFT %.1f%%, mean TPOT %.1f%%, P99 end-to-end %.1f%% (goals: 5%%, 5%%, 10%%)\n' \
  "$ttft_err" "$tpot_err" "$p99_err"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
echo "runs and timelines: $db"
# The calibration runs can agree while the machine's pace moves under the configurations: session
# 21's runs had calibration runs 2-3 % apart and a configuration's rounds up to 55 % apart (its
# compute 20 % slower in one round than in another), and the sign of the errors followed the
# rounds' pace. Say so when the rounds of a typical configuration are that far apart.
round_spread=$(cut -d' ' -f4 "$errs" | median)
max_round_spread=${FIDELITY_MAX_ROUND_SPREAD:-10}
if awk -v s="$round_spread" -v m="$max_round_spread" 'BEGIN { exit !(s > m) }'; then
  echo "warning: a configuration's real rounds are a median $round_spread % apart in TPOT (more than" \
    "$max_round_spread %): the machine's pace moved during the study and the measured medians carry it;" \
    "rerun on a quiet machine before reading the errors as the simulator's" >&2
fi
# exit 1 when a goal is missed, naming it
missed=$(awk -v a="$ttft_err" -v b="$tpot_err" -v c="$p99_err" 'BEGIN {
  m = ""; if (a > 5) m = m " mean TTFT"; if (b > 5) m = m " mean TPOT"; if (c > 10) m = m " P99 end-to-end"; print m }')
if [ -n "$missed" ]; then
  echo "fidelity: goals missed:$missed" >&2
  exit 1
fi
