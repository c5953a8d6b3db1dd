#!/usr/bin/env bash
# Builds (through setup.sh) and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")"
./setup.sh --no-run
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 900
if [[ -x scripts/run_fuzzers.sh ]]; then
  ./scripts/run_fuzzers.sh
fi
