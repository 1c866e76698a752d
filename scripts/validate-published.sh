#!/bin/sh
# Published offloading results (../shared/validation/published-dev.md) against `ferry sim`:
# every row of tests/data/published/rows.tsv that ferry can express is simulated, and the A100
# kernel timings (source D6) are priced with `ferry hw kernel`; prints published, predicted and
# error per row, the median |error| per source, and the rows that need a feature ferry lacks.
# usage: scripts/validate-published.sh [--markdown FILE] [--rows FILE] [--no-kernels | --kernel-set GPU [--kernel-csv FILE]] [--sensitivity PCT [--jobs N]]
#   [--check-doc docs/validation.md] (exit 1 unless the document's section for the rows file gives
#   every row and source as measured; ctest validation_doc runs it for all three files)
#   (FERRY=path/to/ferry, ROWS=rows file; about 30 s). The out-of-sample rows (figures the physics
#   was not developed against): --rows tests/data/published/oos-rows.tsv --no-kernels; the kernel
#   times of three more GPUs (Vidur's H100 and A40 measurements, tests/data/published/kernels-vidur/,
#   and this project's H200 products, tests/data/published/kernels-h200/):
#   --kernel-set h100 | a40 | h200 (kernels alone); NCCL all-reduces: --kernel-set a100-net | h100-net; a
#   Python serving engine's host time per step (Vidur's A100 and A40 machines) against the runtime
#   presets': --kernel-set a100-host | a40-host
set -eu
cd "$(dirname "$0")/.."
exec /usr/bin/python3 scripts/validate_published.py "$@"
