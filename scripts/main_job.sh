#!/usr/bin/env bash
# The main job: DFlash speculative generation on the embedded pair (a Qwen3-architecture
# Python-code model and its drafter, models/), printing the text, the acceptance statistics
# and the speedup over plain decoding of the same request.
# --no-adaptive keeps every step drafting, so the statistics describe the whole request (on a
# small CPU without AMX this 15 M-parameter target is arithmetic-bound and a 16-token block does
# not pay, which the default adaptive mode would detect and switch off: docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/.."
prompt='import os
import sys


def read_lines(path):
    """Return the lines of a text file without their newlines."""
'
exec ./build/dflash generate \
  --model models/qwen3-pycode-15m --draft models/qwen3-pycode-15m-dflash \
  --prompt "$prompt" --max-new-tokens 160 --no-adaptive --compare-plain "$@"
