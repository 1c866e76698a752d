#!/usr/bin/env bash
# The GPU check (docs/gpu-check.md): on a machine with one NVIDIA GPU, build ferry with CUDA,
# check the cuda executor's kernels and logits against the host executor, probe the link and
# GEMM throughput into a calibrated hardware profile, run a small offload sweep measured and
# simulated, then resident, pageable and int4 configurations the same way, time the GPU's own
# products through PyTorch where it is installed, and print the comparison tables. Designed to
# finish within 8 minutes on one H200 (the first run, sweep only, took 83 s).
#
# usage: scripts/gpu-check.sh OUT_DIR
# exit:  0 all checks passed; 1 a check failed; 2 the set-up failed (no GPU, no build, ...)
# env:   GPU_CHECK_BUDGET_S  wall-clock budget of the whole check (default 450 s): every step
#                            gets at most what is left, and after a step that hangs the GPU
#                            steps are skipped (a hang would otherwise eat the device time)
#        GPU_CHECK_WORK      folder for the generated models (default: a temporary folder,
#                            removed at exit; they are gigabytes, OUT_DIR stays small)
#        GPU_CHECK_SKIP_BUILD=1  use an existing build (built with FERRY_CUDA=ON)
#        GPU_CHECK_BUILD     that build's folder (default build-release), or a bundle made by
#                            scripts/gpu-bundle.sh for a machine without ferry's C dependencies
#        GPU_CHECK_KERNEL_TIMES=0  skip the PyTorch kernel times (about 30 s on an H200)
#        GPU_CHECK_REHEARSAL=1  rehearse without a GPU (CI does, through ctest): every step and the
#                            table run with the host executor in place of cuda, the harness
#                            self-tests (host against host, which must agree exactly) in place
#                            of the kernel and logit comparisons, `ferry calibrate --probe` in
#                            place of the GPU probe, and models small enough for a CI machine.
#                            It checks the script's plumbing, not the GPU.
set -euo pipefail

if [[ $# -ne 1 || $1 == -h || $1 == --help ]]; then
  echo "usage: $0 OUT_DIR   (results: OUT_DIR/summary.md, table.md, calibrated.json, logs)" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
if [[ -n ${GPU_CHECK_WORK:-} ]]; then
  WORK=$GPU_CHECK_WORK
else
  WORK=$(mktemp -d /tmp/ferry-gpu-check.XXXXXX)
  trap 'rm -rf "$WORK"' EXIT
fi
RUNS="$OUT/runs"
mkdir -p "$WORK" "$RUNS"
BUILD=${GPU_CHECK_BUILD:-$ROOT/build-release}
FERRY="$BUILD/ferry"
CHECK="$BUILD/bench/gpu_check"
JOBS=$(nproc 2>/dev/null || echo 4)
START=$(date +%s)
DEADLINE=$((START + ${GPU_CHECK_BUDGET_S:-450}))
HUNG=0
FAILED=0
# kernels load lazily by default (CUDA 12.2+): load them up front, so the first step of a run
# is not charged for it and TTFT compares with the simulator
export CUDA_MODULE_LOADING=EAGER
SUMMARY="$OUT/summary.md"
: >"$SUMMARY"
REHEARSAL=${GPU_CHECK_REHEARSAL:-0}
if [[ $REHEARSAL == 1 ]]; then
  BACKEND=host
  PROFILE=()               # CUPTI traces a GPU
  SELF_TEST=(--self-test)  # the harness, host against host
else
  BACKEND=cuda
  PROFILE=(--profile)      # the sweep's timelines come from CUPTI
  SELF_TEST=()
fi

say() { printf '== [%3ds] %s\n' "$(($(date +%s) - START))" "$*"; }
note() { printf -- '- %s\n' "$*" | tee -a "$SUMMARY"; }
fatal() { echo "gpu-check: $*" >&2; note "set-up failed: $*"; exit 2; }
# run NAME SECONDS CMD...: output to OUT/NAME.log (and the terminal); returns CMD's status.
# A step gets at most the time left before DEADLINE; after a timeout every later step is
# skipped (status 124), since a hung GPU would make each of them wait out its limit too.
run() {
  local name=$1 secs=$2
  shift 2
  local left=$((DEADLINE - $(date +%s)))
  if [[ $HUNG -ne 0 || $left -lt 15 ]]; then
    echo "gpu-check: $name skipped ($([[ $HUNG -ne 0 ]] && echo 'an earlier step hung' || echo 'time budget spent'))" |
      tee "$OUT/$name.log" >&2
    return 124
  fi
  [[ $secs -gt $left ]] && secs=$left
  local rc=0
  timeout --foreground -k 10 "$secs" "$@" 2>&1 | tee "$OUT/$name.log" || rc=${PIPESTATUS[0]}
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    HUNG=1
    echo "gpu-check: $name timed out after ${secs}s; later steps are skipped" | tee -a "$OUT/$name.log" >&2
  fi
  return "$rc"
}

# --- 0. the machine --------------------------------------------------------------------------
say "machine"
command -v cmake >/dev/null || fatal "cmake not found (scripts/setup-deps.sh installs the build dependencies)"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
  note "driver $(nvidia-smi --query-gpu=driver_version,name,memory.total --format=csv,noheader 2>/dev/null | head -n 1)" \
    "(CUDA 13 needs driver >= 580)"
else
  echo "gpu-check: nvidia-smi not available" >&2
fi
for dep in sqlite3.h cblas.h cjson/cJSON.h cmocka.h; do
  found=0
  for d in /usr/include /usr/include/*-linux-gnu /usr/include/openblas /usr/include/x86_64-linux-gnu/openblas-pthread; do
    [[ -f $d/$dep ]] && found=1
  done
  [[ $found -eq 1 ]] || note "warning: $dep not found; the build may fail (scripts/setup-deps.sh installs it)"
done
{ uname -a; nproc; free -g 2>/dev/null || true; } >"$OUT/machine.txt" 2>&1 || true

# --- 1. build with CUDA (release) -------------------------------------------------------------
if [[ ${GPU_CHECK_SKIP_BUILD:-0} == 1 ]]; then
  say "build skipped (GPU_CHECK_SKIP_BUILD=1)"
else
  say "build (release, FERRY_CUDA=ON)"
  run configure 120 cmake --preset release -DFERRY_CUDA="$([[ $REHEARSAL == 1 ]] && echo AUTO || echo ON)" -DFERRY_BUILD_TESTS=ON -DFERRY_BUILD_BENCH=ON >/dev/null ||
    fatal "cmake configure failed (see $OUT/configure.log)"
  run build 300 cmake --build --preset release -j"$JOBS" --target ferry bench_gpu_check test_exec_cuda test_exec >/dev/null ||
    fatal "build failed (see $OUT/build.log)"
fi
[[ -x $FERRY && -x $CHECK ]] || fatal "build produced no $FERRY or $CHECK"
# hardware profiles from this tree, wherever the binaries were built (a bundle built elsewhere
# has another tree's path compiled in)
export FERRY_HW_PATH="$ROOT/hw${FERRY_HW_PATH:+:$FERRY_HW_PATH}"
# a bundle (scripts/gpu-bundle.sh) carries its libraries; CUDA's come from this machine
if [[ -d $BUILD/lib ]]; then
  LIBS=$BUILD/lib
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/extras/CUPTI/lib64; do
    [[ -d $d ]] && LIBS+=":$d"
  done
  # CUDA's pip wheels, where the toolkit's libraries are not in the usual place
  for d in $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s, "lib") for p in nvidia.__path__ for s in ("cublas", "cuda_runtime", "cuda_cupti")))' 2>/dev/null || true); do
    [[ -d $d ]] && LIBS+=":$d"
  done
  export LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  note "bundle: $(head -n 1 "$BUILD/MANIFEST" 2>/dev/null || echo "$BUILD")"
fi
# CUDA's libraries are the CUDA module's (ferry_cuda.so, loaded when the cuda executor or CUPTI
# is used): check them there
MODULE=()
if [[ -f $BUILD/ferry_cuda.so ]]; then
  MODULE=("$BUILD/ferry_cuda.so")
  export FERRY_CUDA_MODULE="$BUILD/ferry_cuda.so"
elif [[ $REHEARSAL != 1 ]]; then
  fatal "no CUDA module $BUILD/ferry_cuda.so (build the ferry_cuda target with FERRY_CUDA=ON)"
fi
missing=$(ldd "$FERRY" "$CHECK" "$BUILD/tests/test_exec_cuda" "$BUILD/tests/test_exec" "${MODULE[@]}" 2>/dev/null | awk '/not found/ { print $1 }' | sort -u | tr '\n' ' ')
[[ -z $missing ]] || fatal "libraries not found: $missing(LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-})"

# --- 2. executor conformance and kernels against the host executor -----------------------------
say "cuda executor tests"
if [[ $REHEARSAL == 1 ]]; then
  note "REHEARSAL (GPU_CHECK_REHEARSAL=1): host executor in place of cuda; no figure below is a GPU's"
fi
if run test_exec_cuda 60 "$BUILD/tests/test_exec_cuda"; then
  if grep -q SKIPPED "$OUT/test_exec_cuda.log"; then
    [[ $REHEARSAL == 1 ]] || fatal "no CUDA device visible (test_exec_cuda skipped; see its log)"
    note "test_exec_cuda: skipped (no CUDA device)"
  else
    note "test_exec_cuda: passed"
  fi
else
  note "test_exec_cuda: FAILED (see test_exec_cuda.log)"
  FAILED=1
fi

# the conformance suite every executor runs in ctest (tests/test_exec.c): here cuda joins it
if run conformance 120 "$BUILD/tests/test_exec"; then
  if grep -q "executor cuda not here" "$OUT/conformance.log"; then
    [[ $REHEARSAL == 1 ]] || fatal "no CUDA device visible (the conformance suite ran without cuda; see its log)"
    note "conformance: passed without cuda (no device)"
  else
    note "conformance: every executor, the kernel cases and the contract, cuda included: passed"
  fi
else
  note "conformance: FAILED (see conformance.log)"
  FAILED=1
fi

say "kernels: cuda vs host"
rc=0
run kernels 60 "$CHECK" kernels "${SELF_TEST[@]}" || rc=$?
case $rc in
  0) note "kernels: all match the host executor" ;;
  77) fatal "no CUDA device (gpu_check kernels skipped)" ;;
  *) note "kernels: FAILED (see kernels.log)"; FAILED=1 ;;
esac

say "logits: cuda vs host on small fp16 models (greedy, same seed)"
LOGIT_MODELS=("tiny-moe:--preset tiny-moe" "tiny-qwen2-moe:--preset tiny-qwen2-moe"
  "llama-4l:--preset llama-2-7b --layers 4 --scale 0.25 --vocab 8000"
  "llama-4l-int4:quantize llama-4l int4-g64")
for spec in "${LOGIT_MODELS[@]}"; do
  name=${spec%%:*}
  args=${spec#*:}
  if [[ $args == quantize\ * ]]; then
    # a quantized model: the engine dequantizes every weight on the GPU before its product
    read -r _ from format <<<"$args"
    rm -rf "${WORK:?}/$name"
    run "gen-$name" 120 "$FERRY" model quantize --format "$format" "$WORK/$from" "$WORK/$name" >/dev/null ||
      fatal "ferry model quantize $name failed (see gen-$name.log)"
  else
    # shellcheck disable=SC2086
    run "gen-$name" 60 "$FERRY" model gen $args --dtype fp16 --out "$WORK/$name" --force --quiet >/dev/null ||
      fatal "ferry model gen $name failed (see gen-$name.log)"
  fi
  if run "logits-$name" 60 "$CHECK" logits "$WORK/$name" 1e-2 "${SELF_TEST[@]}"; then
    note "logits $name: $(tail -n 1 "$OUT/logits-$name.log")"
  else
    note "logits $name: FAILED: $(tail -n 1 "$OUT/logits-$name.log")"
    FAILED=1
  fi
done

# --- 3. probes -> calibrated profile -----------------------------------------------------------
say "probe: pinned H2D/D2H bandwidth, GEMM throughput"
if [[ $REHEARSAL == 1 ]]; then
  run probe 120 "$FERRY" calibrate --probe --out "$OUT/calibrated.json" --dir "$WORK" ||
    fatal "ferry calibrate --probe failed (see probe.log)"
else
  run probe 90 "$CHECK" probe "$OUT/calibrated.json" h200 pcie5-x16 ddr5 nvme-gen4 ||
    fatal "probe failed (see probe.log)"
fi
H2D=$(sed -n 's/.*"h2d_gbps":[[:space:]]*\([0-9.eE+-]*\).*/\1/p' "$OUT/calibrated.json" | head -n 1)
[[ -n $H2D ]] || fatal "no h2d_gbps in calibrated.json"
if [[ $REHEARSAL == 1 ]]; then
  note "probe (ferry calibrate --probe, this host): $(grep '^memcpy' "$OUT/probe.log" || true)"
  # the profile format the GPU probe writes, from made-up figures: it must load and simulate
  if run gpu-format-profile 30 "$CHECK" profile "$OUT/gpu-format.json" 50 50 0.7 0.8 h200 pcie5-x16 ddr5 nvme-gen4 &&
    run gpu-format-sim 60 "$FERRY" sim --model "$WORK/tiny-moe" --hw "$OUT/gpu-format.json" \
      --synthetic rate=1,n=1,prompt=4,output=2 --routing-synth zipf=0.5 --as-fast-as-possible --quiet; then
    note "the GPU probe's profile format loads and simulates"
  else
    note "the GPU probe's profile format: FAILED (see gpu-format-*.log)"
    FAILED=1
  fi
else
  note "probe: $(grep '^probe: pinned' "$OUT/probe.log" || true)"
fi

# --- 4. sweep: a model larger than the device budget, measured and simulated --------------------
say "sweep model (fp16, larger than its device budget)"
MODEL="$WORK/sweep-model"
SWEEP_SHAPE=(--layers 32 --scale 0.5 --vocab 16000)
BUDGET=2GiB
if [[ $REHEARSAL == 1 ]]; then
  SWEEP_SHAPE=(--layers 32 --scale 0.0625 --vocab 2000) # about 50 MiB
  BUDGET=40MiB
fi
run gen-sweep 180 "$FERRY" model gen --preset llama-2-7b "${SWEEP_SHAPE[@]}" --dtype fp16 \
  --out "$MODEL" --force --quiet >/dev/null || fatal "ferry model gen of the sweep model failed (see gen-sweep.log)"
# 2 requests of 32 + 16 tokens, the batch and the KV cache sized for exactly them
WORKLOAD=(--synthetic "rate=1000,n=2,prompt=32,output=16" --as-fast-as-possible --seed 3 --max-batch 2 --max-seq-tokens 64)

# `ferry sim` may be missing, or present without its executor ("not built yet"): a one-token
# simulated run tells.
SIM=0
if timeout 120 "$FERRY" sim --model "$MODEL" --hw "$OUT/calibrated.json" --synthetic rate=1,n=1,prompt=4,output=2 \
  --as-fast-as-possible --quiet >"$OUT/sim-probe.log" 2>&1; then
  SIM=1
else
  note "simulator: 'ferry sim' is not usable in this build yet ($(tail -n 1 "$OUT/sim-probe.log")); the sim columns stay empty"
fi

# measure TAG ARGS...: one configuration run for real (into ROWS with its simulation, when the
# simulator is usable); ARGS are `ferry run` options, the simulation gets the same
measure() {
  local tag=$1
  shift
  say "$tag: measured"
  rm -f "$RUNS/$tag-cuda.db" "$RUNS/$tag-sim.db"
  if run "run-$tag-cuda" 60 "$FERRY" run --backend "$BACKEND" "${PROFILE[@]}" --greedy "$@" --db "$RUNS/$tag-cuda.db" \
    --quiet; then :; else
    note "$tag ($BACKEND): FAILED (see run-$tag-cuda.log)"
    FAILED=1
  fi
  local simdb=-
  if [[ $SIM -eq 1 ]] && simulate "$tag-sim" "$OUT/calibrated.json" "$@"; then simdb="$RUNS/$tag-sim.db"; fi
  ROWS+=("$tag" "$RUNS/$tag-cuda.db" "$simdb")
}

# simulate NAME PROFILE ARGS...: `ferry sim` of ARGS on PROFILE into RUNS/NAME.db (log NAME's);
# a failure is noted and returned
simulate() {
  local name=$1 hw=$2
  shift 2
  say "$name: simulated"
  rm -f "$RUNS/$name.db"
  run "run-$name" 60 "$FERRY" sim --hw "$hw" "$@" --db "$RUNS/$name.db" --quiet && return 0
  note "$name: failed (see run-$name.log)"
  return 1
}

ROWS=()
for B in 1 2 4; do
  for D in 1 2; do
    measure "b${B}_d${D}" --model "$MODEL" "${WORKLOAD[@]}" --block-layers "$B" --prefetch-depth "$D" --device-budget "$BUDGET"
  done
done
SWEEP_ROWS=("${ROWS[@]}")

# --- 4b. beyond streaming: the simulator's kernel and host costs, its pageable and int4 paths ---
# The sweep is bound by the link, so it checks the link alone. These rows check what the link
# does not decide: the whole model resident (decode bound by the GPU's memory and the kernels'
# issue), prefill-heavy and batched; a pageable host tier (the driver's staged copies); int4
# weights streamed and dequantized on the GPU.
say "beyond the sweep: resident, pageable, int4"
ROWS=()
RESIDENT_BUDGET=16GiB
[[ $REHEARSAL == 1 ]] && RESIDENT_BUDGET=1GiB
# the workloads (the model apart: int4 runs RES_B4 too) measured, calibrated from and simulated
# again with the fit below
RES_B4=(--synthetic "rate=1000,n=4,prompt=512,output=32" --as-fast-as-possible --seed 3
  --max-batch 4 --resident all --device-budget "$RESIDENT_BUDGET")
RES_B16=(--synthetic "rate=1000,n=16,prompt=128,output=32" --as-fast-as-possible --seed 3
  --max-batch 16 --resident all --device-budget "$RESIDENT_BUDGET")
STREAM_B1_D2=(--model "$MODEL" "${WORKLOAD[@]}" --block-layers 1 --prefetch-depth 2 --device-budget "$BUDGET")
measure res_b4 --model "$MODEL" "${RES_B4[@]}"
measure res_b16 --model "$MODEL" "${RES_B16[@]}"
measure pageable_b1 --model "$MODEL" --synthetic "rate=1000,n=2,prompt=32,output=8" --as-fast-as-possible --seed 3 \
  --max-batch 2 --max-seq-tokens 40 --block-layers 1 --prefetch-depth 2 --device-budget "$BUDGET" --host-memory pageable
rm -rf "${WORK:?}/sweep-int4"
if run gen-sweep-int4 120 "$FERRY" model quantize --format int4-g64 "$MODEL" "$WORK/sweep-int4" >/dev/null; then
  # a quarter of the fp16 budget: the int4 model (about 0.27 of the fp16 bytes) streams too
  INT4_BUDGET=512MiB
  [[ $REHEARSAL == 1 ]] && INT4_BUDGET=12MiB
  measure int4_b1_d2 --model "$WORK/sweep-int4" "${WORKLOAD[@]}" --block-layers 1 --prefetch-depth 2 \
    --device-budget "$INT4_BUDGET"
  measure int4_res_b4 --model "$WORK/sweep-int4" "${RES_B4[@]}"
else
  note "ferry model quantize of the sweep model failed (see gen-sweep-int4.log); no int4 rows"
  FAILED=1
fi

# --- 4c. the simulator calibrated from this GPU's own timeline ---------------------------------
# `ferry calibrate --db` fits kernel, copy and host costs from runs the executor recorded itself
# (without --profile: CUPTI's records carry no ferry kinds or sizes); the resident rows, the
# sweep's b1_d2 and the int4 resident row are simulated again with that fit (`*_fit`). Their
# measured columns are the profiled runs', which CUPTI's tracing slows a little: the unprofiled
# runs' figures are noted.
say "calibrate from the executor's own timeline"
CAL_DB="$RUNS/calibration.db"
rm -f "$CAL_DB"
if run calib-resident 60 "$FERRY" run --backend "$BACKEND" --greedy --model "$MODEL" "${RES_B4[@]}" --db "$CAL_DB" --quiet &&
  run calib-stream 60 "$FERRY" run --backend "$BACKEND" --greedy "${STREAM_B1_D2[@]}" --db "$CAL_DB" --quiet &&
  run calibrate 60 "$FERRY" calibrate --db "$CAL_DB" --run all --base "$OUT/calibrated.json" --out "$OUT/fitted.json"; then
  note "calibrate --db: $(grep -c ' ops: ' "$OUT/calibrate.log" || true) kernel and copy fits, $(grep -c 'warning' "$OUT/calibrate.log" || true) warnings (calibrate.log, fitted.json)"
  for log in calib-resident calib-stream; do
    note "$log (unprofiled; the workload of $([[ $log == calib-resident ]] && echo res_b4 || echo b1_d2)): $(grep -E '^(TTFT|TPOT) ' "$OUT/$log.log" | awk '{ print $1, $2, $3 }' | tr '\n' ' ')"
  done
  if [[ $SIM -eq 1 ]]; then
    # simulate_fit TAG ARGS...: the measured TAG's workload simulated with the fitted profile
    simulate_fit() {
      local tag=$1
      shift
      if simulate "$tag-fit-sim" "$OUT/fitted.json" "$@"; then
        ROWS+=("${tag}_fit" "$RUNS/$tag-cuda.db" "$RUNS/$tag-fit-sim.db")
      fi
    }
    simulate_fit res_b4 --model "$MODEL" "${RES_B4[@]}"
    simulate_fit res_b16 --model "$MODEL" "${RES_B16[@]}"
    simulate_fit b1_d2 "${STREAM_B1_D2[@]}"
    # the int4 model too, where it was measured: the fit saw no dequantize op (its runs are fp16),
    # so this prices the executor's unfused expansion out of sample (the fit's fused_dequant is 0)
    [[ -f "$RUNS/int4_res_b4-cuda.db" ]] && simulate_fit int4_res_b4 --model "$WORK/sweep-int4" "${RES_B4[@]}"
  fi
else
  note "calibration from the executor's timeline: failed (see calib-*.log, calibrate.log)"
  FAILED=1
fi
EXTRA_ROWS=("${ROWS[@]}")

# --- 4d. the GPU's own GEMM times and copy rates through PyTorch, where it is installed ----------
# (scripts/gpu_kernel_times.py: the kernel set `validate-published.sh --kernel-set` prices)
KERNEL_TIMES_SKIPPED=
if [[ $REHEARSAL == 1 ]]; then KERNEL_TIMES_SKIPPED=rehearsal
elif [[ ${GPU_CHECK_KERNEL_TIMES:-1} == 0 ]]; then KERNEL_TIMES_SKIPPED=GPU_CHECK_KERNEL_TIMES=0
elif ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  KERNEL_TIMES_SKIPPED='no PyTorch with CUDA'
fi
if [[ -z $KERNEL_TIMES_SKIPPED ]]; then
  GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | sed 's/^NVIDIA //' |
    tr 'A-Z ' 'a-z-' | tr -cd 'a-z0-9-')
  say "kernel times through PyTorch (${GPU_NAME:-gpu})"
  if run kernel-times 120 python3 "$ROOT/scripts/gpu_kernel_times.py" "${GPU_NAME:-gpu}" "$OUT/kernels" --seconds 90; then
    note "kernel times: $(tail -n 1 "$OUT/kernel-times.log")"
  else
    note "kernel times: failed (see kernel-times.log); not a check of ferry"
  fi
else
  note "kernel times through PyTorch: skipped ($KERNEL_TIMES_SKIPPED)"
fi

# --- 5. the table -----------------------------------------------------------------------------
say "table"
"$CHECK" table --h2d-gbps "$H2D" "${SWEEP_ROWS[@]}" | tee "$OUT/table.md" || FAILED=1
{
  echo
  echo "Probed pinned H2D: $H2D GB/s. Goals (issue 8): H2D >= 90% of the probe while streaming;"
  echo "decode / floor <= 1.15 at prefetch depth >= 2; simulated TPOT within 10% of measured."
  echo "Elapsed: $(($(date +%s) - START)) s."
} | tee -a "$OUT/table.md"
cat "$OUT/table.md" >>"$SUMMARY"
if [[ ${#EXTRA_ROWS[@]} -gt 0 ]]; then
  {
    echo
    echo "Beyond the sweep (resident: the whole model on the device; pageable: copies staged by the driver;"
    echo "int4: int4-g64 weights dequantized on the device; _fit: simulated with the profile ferry calibrate"
    echo "fitted to the executor's own timeline, fitted.json). H2D is against the pinned probe:"
    echo
    "$CHECK" table --h2d-gbps "$H2D" --goals sim "${EXTRA_ROWS[@]}"
  } | tee "$OUT/table-more.md" || FAILED=1
  cat "$OUT/table-more.md" >>"$SUMMARY"
fi

# --- 6. where the time went: per kernel, and per CUDA call on the host (CUPTI; none in a rehearsal) --
# (session 23 read these by hand: an attention kernel at 68 % of a resident run's GPU time, two
# event records per op beside each launch)
STATS=()
for tag in res_b4 int4_res_b4 b1_d2; do
  [[ -f $RUNS/$tag-cuda.db ]] || continue
  if { "$FERRY" db stats --report kern_sum --run 1 --db "$RUNS/$tag-cuda.db" && echo &&
    "$FERRY" db stats --report api_sum --run 1 --db "$RUNS/$tag-cuda.db"; } >"$OUT/stats-$tag.txt" 2>&1; then
    STATS+=("stats-$tag.txt")
  fi
done
[[ ${#STATS[@]} -gt 0 ]] && note "time per kernel and per CUDA call (ferry db stats kern_sum, api_sum): ${STATS[*]}"

say "done: results in $OUT (summary.md, table.md, table-more.md, stats-*.txt, calibrated.json, runs/, *.log)"
if [[ $FAILED -ne 0 ]]; then
  echo "gpu-check: some checks FAILED (see $SUMMARY)" >&2
  exit 1
fi
