#!/bin/sh
# The GPU check rehearsed without a GPU (scripts/gpu-check.sh with GPU_CHECK_REHEARSAL=1): every
# step, the sweep and the table run on the host executor, so a broken command, flag, budget or
# query fails here and not in the few minutes a GPU is lent. Usage: gpu_check_rehearsal.sh
# SOURCE_DIR BUILD_DIR OUT_DIR
set -eu
src=$1 build=$2 out=$3
rm -rf "$out"
if ! GPU_CHECK_REHEARSAL=1 GPU_CHECK_SKIP_BUILD=1 GPU_CHECK_BUILD="$build" GPU_CHECK_BUDGET_S=300 \
  bash "$src/scripts/gpu-check.sh" "$out" >"$out.log" 2>&1; then
  tail -n 40 "$out.log"
  echo "gpu_check_rehearsal: the script failed (log: $out.log)" >&2
  exit 1
fi
table="$out/table.md"
# six configurations, each with measured and simulated TTFT and TPOT and the streaming columns
rows=$(grep -c '^| b[124]_d[12] |' "$table" || true)
if [ "$rows" -ne 6 ]; then
  echo "gpu_check_rehearsal: $rows configuration rows in $table, expected 6" >&2
  cat "$table" >&2
  exit 1
fi
if grep '^| b[124]_d[12] |' "$table" | awk -F'|' '{ for (i = 3; i <= 11; i++) { gsub(/ /, "", $i); if ($i == "" || $i == "-") bad = 1 } } END { exit !bad }'; then
  echo "gpu_check_rehearsal: a row of $table has an empty column" >&2
  cat "$table" >&2
  exit 1
fi
if ! grep -q '^Goals (issue 8), rows meeting each: H2D >= 90% of the probe [0-9]/6; decode / floor <= 1.15 at prefetch depth >= 2 [0-9]/3; simulated TPOT within 10% [0-9]/6' "$table"; then
  echo "gpu_check_rehearsal: $table lacks the goal counts over 6, 3 and 6 rows" >&2
  exit 1
fi
# the rows beyond the sweep: nine (four simulated with the profile calibrate fitted), each with
# measured and simulated TTFT and TPOT
more="$out/table-more.md"
for tag in res_b4 res_b16 pageable_b1 int4_b1_d2 int4_res_b4 res_b4_fit res_b16_fit b1_d2_fit int4_res_b4_fit; do
  if ! grep "^| $tag |" "$more" 2>/dev/null | awk -F'|' '{ for (i = 3; i <= 8; i++) { gsub(/ /, "", $i); if ($i == "" || $i == "-") bad = 1 } n++ } END { exit bad || n != 1 }'; then
    echo "gpu_check_rehearsal: $more has no full row $tag" >&2
    cat "$more" >&2 2>/dev/null || true
    exit 1
  fi
done
grep -q '^Rows with the simulated TPOT within 10% of the measured: [0-9]/9' "$more" ||
  { echo "gpu_check_rehearsal: $more lacks the simulation goal's count over 9 rows" >&2; exit 1; }
[ -s "$out/fitted.json" ] || { echo "gpu_check_rehearsal: no fitted.json from ferry calibrate --db" >&2; exit 1; }
# where the time went: the host executor's kernels by name (no CUDA calls in a rehearsal)
for tag in res_b4 int4_res_b4 b1_d2; do
  grep -q 'kern_sum, as nsys cuda_gpu_kern_sum' "$out/stats-$tag.txt" 2>/dev/null &&
    grep -q '  attention$' "$out/stats-$tag.txt" &&
    grep -q 'api_sum, as nsys cuda_api_sum' "$out/stats-$tag.txt" ||
    { echo "gpu_check_rehearsal: $out/stats-$tag.txt lacks the kernel or CUDA-call summary" >&2; exit 1; }
done
for f in summary.md calibrated.json kernels.log; do
  [ -s "$out/$f" ] || { echo "gpu_check_rehearsal: $out/$f missing or empty" >&2; exit 1; }
done
echo "gpu_check_rehearsal: all steps ran; tables:"
cat "$table" "$more"
