#!/usr/bin/env bash
# Prepare the GPU check for a machine that cannot install packages. The GPU machines lent to
# this project have CUDA 13, CMake and a driver, but no network and none of ferry's C
# dependencies (SQLite, cJSON, OpenBLAS, cmocka): building there would fail at configure.
# So build here, with CUDA, and bundle the three programs the check runs, ferry's CUDA module
# they load for the cuda executor and CUPTI, and the shared libraries they need beyond glibc,
# libstdc++ and CUDA (those come from the GPU machine):
#
#   gpu-bundle/ferry, gpu-bundle/ferry_cuda.so, gpu-bundle/bench/gpu_check,
#   gpu-bundle/tests/test_exec_cuda, gpu-bundle/tests/test_exec, gpu-bundle/lib/
#
# then, on the GPU machine (the bundle travels with the working tree, about 12 MB):
#
#   GPU_CHECK_BUILD=gpu-bundle GPU_CHECK_SKIP_BUILD=1 scripts/gpu-check.sh OUT
#
# gpu-check.sh puts gpu-bundle/lib and the CUDA library folders on LD_LIBRARY_PATH and stops
# at once, naming them, if a library is still missing. The binaries need glibc 2.34 or newer.
# usage: scripts/gpu-bundle.sh [OUT_DIR]   (default gpu-bundle; builds build-release)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$ROOT/gpu-bundle}
cd "$ROOT"
echo "gpu-bundle: building build-release with CUDA"
cmake --preset release -DFERRY_CUDA=ON -DFERRY_BUILD_TESTS=ON -DFERRY_BUILD_BENCH=ON >/dev/null
cmake --build --preset release -j"$(nproc 2>/dev/null || echo 2)" --target ferry ferry_cuda bench_gpu_check test_exec_cuda test_exec >/dev/null
rm -rf "$OUT"
mkdir -p "$OUT/bench" "$OUT/tests" "$OUT/lib"
install -m 755 -s build-release/ferry "$OUT/ferry"
install -m 755 -s build-release/bench/gpu_check "$OUT/bench/gpu_check"
install -m 755 -s build-release/tests/test_exec_cuda "$OUT/tests/test_exec_cuda"
install -m 755 -s build-release/tests/test_exec "$OUT/tests/test_exec"
# the programs find the module beside them (or one folder up)
install -m 755 -s build-release/ferry_cuda.so "$OUT/ferry_cuda.so"
bins=("$OUT/ferry" "$OUT/bench/gpu_check" "$OUT/tests/test_exec_cuda" "$OUT/tests/test_exec" "$OUT/ferry_cuda.so")
# every library the loader resolves to a path, except the system's and CUDA's
ldd "${bins[@]}" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u | while read -r lib; do
  case $(basename "$lib") in
    libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | libutil.so* | libgcc_s.so* | libstdc++.so* | ld-linux*) ;;
    libcuda.so* | libcudart.so* | libcublas*.so* | libcupti.so* | libnvidia*) ;;
    *) cp -L "$lib" "$OUT/lib/" ;;
  esac
done
missing=$(LD_LIBRARY_PATH="$OUT/lib" ldd "${bins[@]}" | grep 'not found' || true)
[[ -z $missing ]] || { echo "gpu-bundle: unresolved libraries: $missing" >&2; exit 1; }
glibc=$(objdump -T "${bins[@]}" "$OUT"/lib/* 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -t. -k2,2n -k3,3n -u | tail -n 1)
{
  echo "ferry GPU check bundle, $(git describe --always --dirty 2>/dev/null || echo unknown), built $(date -u +%FT%TZ)"
  echo "needs: ${glibc:-glibc}, a CUDA 13 driver, libcudart/libcublas/libcublasLt/libcupti 13 on the machine"
  (cd "$OUT" && find . -type f -printf '%P %s\n' | sort)
} >"$OUT/MANIFEST"
echo "gpu-bundle: $OUT ($(du -sh "$OUT" | cut -f1)); needs ${glibc:-glibc}; libraries: $(ls "$OUT/lib" | tr '\n' ' ')"
