#!/bin/sh
# libferry.so exports the public API and nothing else: every FERRY_API function of
# include/ferry, no internal ferry__ helper (the objects are built with -fvisibility=hidden).
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
echo "$(printf '%s\n' "$api" | wc -l) API functions, $missing not exported; $internal internal symbols exported"
[ "$internal" = 0 ] && [ "$missing" = 0 ]
