#!/usr/bin/env bash
# The main job: DFlash speculative generation on the embedded default pair, with the
# acceptance statistics and the speedup over plain decoding.
set -euo pipefail
cd "$(dirname "$0")/.."
exec ./build/dflash generate \
  --model testdata/tiny/qwen3-gqa4-untied-f32 --draft testdata/tiny/dflash-qwen3-gqa4-untied-f32 \
  --prompt-ids 80,128,158,187,70,173,121,13,235,147 --max-new-tokens 64 --ignore-eos --compare-plain "$@"
