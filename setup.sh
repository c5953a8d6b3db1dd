#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds dflash, and (unless --no-run) runs the main job:
# DFlash generation on the model pair embedded under models/.
#   ./setup.sh            install, build, run
#   ./setup.sh --no-run   install and build only (used by ./test.sh)
#   DFLASH_CUDA=ON ./setup.sh --no-run   also build the CUDA backend (needs nvcc)
set -euo pipefail
cd "$(dirname "$0")"

run_main=1
[[ "${1:-}" == "--no-run" ]] && run_main=0

packages=(
  build-essential cmake pkg-config git
  libopenblas-openmp-dev libpcre2-dev libutf8proc-dev
  nlohmann-json3-dev libcli11-dev libcpp-httplib-dev
  libgtest-dev libgmock-dev
  clang libclang-rt-14-dev
  python3 python3-venv
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo_cmd=""
  [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}"
fi

# Test tooling from PyPI (the official openai client for the server tests, numpy for the timeline
# report's test) lives in its own venv.
if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
if ! .venv/bin/python -c "import openai, requests, numpy" 2>/dev/null; then
  .venv/bin/pip install -q -r tools/requirements-test.txt
fi

jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DDFLASH_CUDA="${DFLASH_CUDA:-OFF}" >/dev/null
cmake --build build -j"$jobs"

if ((run_main)); then
  exec ./scripts/main_job.sh
fi
