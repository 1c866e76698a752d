#!/bin/sh
# docs/validation.md's tables of published results against what `ferry sim` predicts now: every
# row and source of rows.tsv, heldout-rows.tsv and oos-rows.tsv, in the section of the document
# marked for its file, as scripts/validate-published.sh measures it (the D6 kernel timings are
# left out: they read ../shared). Fails, naming the row, when a change of the physics moved a
# figure the document still gives as before. The three files run at once, with the out-of-sample
# kernel sets of tests/data/published/kernels-vidur/ and kernels-h200/ (the marked kernels-h100,
# kernels-a40, kernels-h200, kernels-h100-net and kernels-a40-host sections, each op's line), and
# checks --kernel-csv's line count.
# usage: check_validation_doc.sh SOURCE_DIR FERRY
set -eu
src=$1
ferry=$2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for rows in rows heldout-rows oos-rows; do
  (FERRY=$ferry /usr/bin/python3 "$src/scripts/validate_published.py" --no-kernels \
     --rows "$src/tests/data/published/$rows.tsv" --check-doc "$src/docs/validation.md" \
     >"$out/$rows.log" 2>&1 && touch "$out/$rows.ok") &
done
sets="h100 a40 h200 h100-net a40-host"
for set in $sets; do
  (FERRY=$ferry /usr/bin/python3 "$src/scripts/validate_published.py" --kernel-set $set \
     --check-doc "$src/docs/validation.md" --kernel-csv "$out/kernels-$set.csv" >"$out/kernels-$set.log" 2>&1 &&
     touch "$out/kernels-$set.ok") &
done
wait
status=0
# --kernel-csv: a header and one line per priced kernel, as many as the summary counts
for set in $sets; do
  [ -e "$out/kernels-$set.ok" ] || continue
  counted=$(sed -n 's/^ *K-[A-Za-z0-9-]* *\([0-9][0-9]*\) \(kernels\|steps\).*/\1/p' "$out/kernels-$set.log")
  lines=$(wc -l <"$out/kernels-$set.csv")
  if [ -z "$counted" ] || [ "$lines" -ne $((counted + 1)) ]; then
    echo "kernels-$set: --kernel-csv wrote $lines lines for ${counted:-?} kernels" >&2
    status=1
  fi
done
for rows in rows heldout-rows oos-rows $(for set in $sets; do printf 'kernels-%s ' "$set"; done); do
  if [ ! -e "$out/$rows.ok" ]; then
    echo "$rows:" >&2
    tail -n 20 "$out/$rows.log" >&2
    status=1
  fi
done
exit $status
