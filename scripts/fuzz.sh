#!/bin/sh
# Fuzz ferry's file parsers with libFuzzer (clang, AddressSanitizer, UndefinedBehaviorSanitizer):
#   fuzz_safetensors  the safetensors reader (tests/fuzz_safetensors.c)
#   fuzz_parsers      request traces, routing traces, config.json, hardware profiles
#                     (tests/fuzz_parsers.c; the first input byte picks the reader)
# Seeds come from tests/data and hw/. A crash leaves its input in OUT and exits non-zero.
# usage: scripts/fuzz.sh [SECONDS_PER_TARGET [OUT]]   (default 60 s, build/fuzz)
set -eu
secs=${1:-60}
out=${2:-build/fuzz}
command -v clang >/dev/null || { echo "fuzz.sh: clang is needed (apt-get install clang)" >&2; exit 1; }
mkdir -p "$out/seeds_st" "$out/seeds_parsers" "$out/corpus_st" "$out/corpus_parsers"
flags="-std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -I."
echo "== building fuzzers"
# shellcheck disable=SC2086
clang $flags tests/fuzz_safetensors.c $(ls runtime/store/*.c | grep -v '/gen\.c$') common/*.c -lcjson -lm -lpthread \
  -o "$out/fuzz_safetensors"
# shellcheck disable=SC2086
clang $flags tests/fuzz_parsers.c traces/*.c runtime/model/*.c sim/hw.c common/*.c -lcjson -lm -lpthread \
  -o "$out/fuzz_parsers"
# seeds: a selector byte (the reader's index in fuzz_parsers.c) then a file that reader knows
seed() { # seed SELECTOR FILE
  name=$(printf '%s' "$2" | tr '/' '_')
  { printf "\\$(printf '%03o' "$1")"; cat "$2"; } >"$out/seeds_parsers/$1_$name"
}
for f in tests/data/traces/azure_*.csv tests/data/traces/malformed/*azure*; do [ -f "$f" ] && seed 0 "$f"; done
for f in tests/data/traces/burstgpt*.csv tests/data/traces/malformed/*burst*; do [ -f "$f" ] && seed 1 "$f"; done
for f in tests/data/traces/mooncake*.jsonl tests/data/traces/malformed/*mooncake*; do [ -f "$f" ] && seed 2 "$f"; done
for f in tests/data/traces/ferry*.jsonl tests/data/traces/malformed/*jsonl*; do [ -f "$f" ] && seed 3 "$f"; done
for f in tests/data/routing/*.jsonl; do seed 4 "$f"; done
for f in $(find tests/data/configs -name config.json); do seed 5 "$f"; done
for f in hw/*.json; do seed 6 "$f"; done
cp tests/data/safetensors/*.safetensors "$out/seeds_st/" 2>/dev/null || true
find tests/data/safetensors -name '*.safetensors' -exec cp {} "$out/seeds_st/" \; 2>/dev/null || true
status=0
for t in safetensors parsers; do
  case $t in safetensors) c=st ;; *) c=parsers ;; esac
  echo "== fuzz_$t for $secs s"
  if ! "$out/fuzz_$t" -max_total_time="$secs" -print_final_stats=1 -artifact_prefix="$out/crash-$t-" \
    -rss_limit_mb=2048 "$out/corpus_$c" "$out/seeds_$c" 2>"$out/fuzz_$t.log"; then
    echo "fuzz_$t: FAILED, see $out/fuzz_$t.log and $out/crash-$t-*" >&2
    status=1
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$out/fuzz_$t.log" || true
done
exit $status
