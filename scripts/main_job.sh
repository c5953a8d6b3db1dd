#!/usr/bin/env bash
# The main job: generation on the embedded default model.
set -euo pipefail
cd "$(dirname "$0")/.."
exec ./build/dflash generate --model testdata/tiny/qwen3-gqa4-untied-f32 --prompt-ids 1,2,3,4,5 --max-new-tokens 32
