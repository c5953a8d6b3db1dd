#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/fuzz_*.cc) with clang and runs each for
# FUZZ_SECONDS (default 60), starting from tests/fuzz/corpus/<target>/ when it exists.
# Fails if a target does not build or if any run finds a crash, leak or sanitizer error.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-60}"
build=build-fuzz
CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDFLASH_FUZZ=ON \
  -DDFLASH_TESTS=OFF >/dev/null
mapfile -t targets < "$build/fuzz_targets.txt"
if ((${#targets[@]} == 0)); then
  echo "run_fuzzers: no fuzz targets" >&2
  exit 1
fi
status=0
for t in "${targets[@]}"; do
  [[ -n "$t" ]] || continue
  echo "run_fuzzers: building $t"
  if ! cmake --build "$build" -j"$(nproc)" --target "$t" >"$build/$t.build.log" 2>&1; then
    tail -30 "$build/$t.build.log" >&2
    echo "run_fuzzers: $t failed to build" >&2
    status=1
    continue
  fi
  # Work on a scratch copy so that runs never modify the committed seed corpus.
  work="$build/corpus/$t"
  rm -rf "$work" && mkdir -p "$work"
  [[ -d "tests/fuzz/corpus/$t" ]] && cp -r "tests/fuzz/corpus/$t/." "$work/"
  echo "run_fuzzers: running $t for ${seconds}s"
  if ! (cd "$build" && "./tests/fuzz/$t" -max_total_time="$seconds" -max_len=4096 -timeout=30 \
        -rss_limit_mb=4096 -print_final_stats=1 "corpus/$t" >"$t.fuzz.log" 2>&1); then
    tail -60 "$build/$t.fuzz.log" >&2
    echo "run_fuzzers: $t FAILED (artifacts in $build/)" >&2
    status=1
  else
    grep -E "stat::number_of_executed_units|Done" "$build/$t.fuzz.log" | tail -2
  fi
done
exit $status
