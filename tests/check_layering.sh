#!/bin/sh
# The module views (CMakeLists.txt, ferry_module) enforce DESIGN.md's module table: an include
# a module may not make does not compile, what it may still does. Each line below is
# MODULE EXPECTATION HEADER.
# usage: check_layering.sh CC VIEWS_DIR
set -u
cc=$1
views=$2
failed=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
while read -r module expect header; do
  [ -z "$module" ] && continue
  printf '#include "%s"\n' "$header" >"$tmp/t.c"
  if "$cc" -std=c11 -fsyntax-only -I "$views/$module" "$tmp/t.c" 2>/dev/null; then got=compiles; else got=refused; fi
  if [ "$got" != "$expect" ]; then
    echo "$module including $header: $got, expected $expect"
    failed=1
  fi
done <<LIST
ferry_policy refused ferry/db.h
ferry_policy refused ferry/exec.h
ferry_policy refused runtime/engine/engine_impl.h
ferry_policy compiles ferry/predict.h
ferry_policy compiles runtime/policy/policy.h
ferry_exec refused runtime/engine/engine_impl.h
ferry_exec refused ferry/engine.h
ferry_exec compiles runtime/quant/quant_impl.h
ferry_engine refused ferry/sim.h
ferry_engine refused ferry/db.h
ferry_engine compiles ferry/engine.h
ferry_reports refused ferry/engine.h
ferry_reports refused runtime/exec/exec_impl.h
ferry_reports compiles ferry/db.h
ferry_profiler refused ferry/exec.h
ferry_traces refused ferry/model.h
ferry_common refused ferry/model.h
ferry_sim refused ferry/engine.h
ferry_sim compiles runtime/exec/exec_impl.h
ferry_backends compiles ferry/sim.h
ferry_prefetch compiles ferry/routing.h
ferry_prefetch refused cli/cli.h
LIST
[ $failed = 0 ] && echo "every module sees what it may use and nothing else"
exit $failed
