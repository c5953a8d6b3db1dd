#!/usr/bin/env bash
# Builds (through setup.sh) and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")"
./setup.sh --no-run
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 900
# The CUDA backend is compiled and linked wherever nvcc is (the GPU tests above skip without a
# GPU; scripts/gpu_run.sh runs them on one); `dflash doctor` then says whether a GPU is there.
NVCC=$(command -v nvcc || { [[ -x /usr/local/cuda/bin/nvcc ]] && echo /usr/local/cuda/bin/nvcc; } || true)
if [[ -n "$NVCC" ]]; then
  echo "== CUDA backend: compile and link with $NVCC"
  cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DDFLASH_CUDA=ON -DDFLASH_TESTS=OFF \
    -DCMAKE_CUDA_COMPILER="$NVCC" >/dev/null
  cmake --build build-cuda -j"$(nproc)" --target dflash
  build-cuda/dflash doctor
else
  echo "== CUDA backend: nvcc not found, not compiled"
fi
if [[ -x scripts/run_fuzzers.sh ]]; then
  ./scripts/run_fuzzers.sh
fi
