#!/bin/sh
# Fuzz every parser of untrusted input with libFuzzer (clang, AddressSanitizer and
# UndefinedBehaviorSanitizer): the targets of tests/fuzz/ (one per input kind, README there),
# built with the `fuzz` CMake preset into build-fuzz/, run one after the other, each for
# SECONDS, starting from its seed corpus tests/fuzz/NAME/. What a run learns goes to
# OUT/corpus/NAME/ (kept between runs); a crash, leak, timeout or out-of-memory input is left as
# OUT/NAME-crash-*, -timeout-*, -oom-* or -leak-*, and the script exits non-zero. Add such an
# input to tests/fuzz/NAME/ once the bug is fixed, so that `make test` replays it.
#   usage: scripts/fuzz.sh [SECONDS_PER_TARGET [OUT [TARGET...]]]   (default 60 s, build-fuzz/out, all)
# An input running longer than FUZZ_TIMEOUT seconds (default 30; generous, as a loaded machine
# stalls for seconds) is a timeout. FUZZ_FLAGS adds libFuzzer options (e.g. FUZZ_FLAGS=-jobs=2);
# a summary line per target gives executions, coverage and the result, as docs/fuzzing.md
# records them.
set -eu
secs=${1:-60}
out=${2:-build-fuzz/out}
[ $# -gt 2 ] && shift 2 || set --
cd "$(dirname "$0")/.."
root=$(pwd)

if ! command -v clang >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "fuzz.sh: installing clang (libFuzzer)"
    apt-get install -y -q clang >/dev/null
  else
    echo "fuzz.sh: clang is needed (apt-get install clang)" >&2
    exit 1
  fi
fi
echo "== building the fuzz targets (cmake --preset fuzz)"
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "${FUZZ_BUILD_JOBS:-2}" >/dev/null

targets=${*:-$(sed -n 's/^ferry_fuzz(\([a-z0-9_]*\) .*/\1/p' tests/fuzz/CMakeLists.txt)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
status=0
printf '%-16s %10s %8s %8s %7s  %s\n' target execs exec/s cov ft result
for t in $targets; do
  bin=$root/build-fuzz/tests/fuzz/fuzz_$t
  [ -x "$bin" ] || { echo "fuzz.sh: no target $t" >&2; exit 2; }
  mkdir -p "$out/corpus/$t"
  log=$out/$t.log
  # stdout and stderr of the target closed: the readers' error messages are not findings
  # shellcheck disable=SC2086
  if "$bin" -max_total_time="$secs" -print_final_stats=1 -close_fd_mask=3 -timeout="${FUZZ_TIMEOUT:-30}" -rss_limit_mb=2048 \
    -artifact_prefix="$out/$t-" ${FUZZ_FLAGS:-} "$out/corpus/$t" "$root/tests/fuzz/$t" >"$log" 2>&1; then
    result=ok
  else
    result="FAILED (see $log and $out/$t-*)"
    status=1
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -Eo 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  ft=$(grep -Eo 'ft: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  printf '%-16s %10s %8s %8s %7s  %s\n' "$t" "${execs:--}" "${rate:--}" "${cov:--}" "${ft:--}" "$result"
done
exit $status
