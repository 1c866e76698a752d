#!/bin/sh
# libferry.so exports the public API and nothing else: every FERRY_API function of
# include/ferry, no internal ferry__ helper (the objects are built with -fvisibility=hidden),
# and no function declared in a public header without FERRY_API (it would be hidden).
# usage: check_exports.sh LIBFERRY_SO INCLUDE_DIR   (skips, 77, without nm)
set -u
command -v nm >/dev/null 2>&1 || exit 77
so=$1
inc=$2
exported=$(nm -D --defined-only "$so" | awk '{print $3}')
internal=$(printf '%s\n' "$exported" | grep -c '^ferry__')
api=$(grep -ho 'FERRY_API[^(]*ferry_[a-z0-9_]*(' "$inc"/ferry/*.h | grep -o 'ferry_[a-z0-9_]*($' | tr -d '(' | sort -u)
missing=0
for f in $api; do
  printf '%s\n' "$exported" | grep -qx "$f" || { echo "not exported: $f"; missing=$((missing + 1)); }
done
# a function declared in a public header without FERRY_API would be hidden: name it
unmarked=$(grep -nE '^(const |struct |enum |unsigned |void|int|double|float|size_t|uint|char|ferry_status|bool)[^;(]*ferry_[a-z0-9_]+\(' \
  "$inc"/ferry/*.h | grep -v FERRY_API)
[ -n "$unmarked" ] && printf 'declared without FERRY_API:\n%s\n' "$unmarked"
echo "$(printf '%s\n' "$api" | wc -l) API functions, $missing not exported; $internal internal symbols exported"
[ "$internal" = 0 ] && [ "$missing" = 0 ] && [ -z "$unmarked" ]
