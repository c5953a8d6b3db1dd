#!/usr/bin/env bash
# One call on the GPU machine (the workplace's nvidia-h200 device): build with the CUDA
# backend, run the GPU tests, `dflash doctor`, and the benchmarks; everything lands in $OUT
# (at most 8 files come back: keep it to log, tests, doctor, bench_q8b.{txt,json}, bench_pycode,
# forced, hf_side_by_side.json, ncu). Run from the repository root:
#
#   scripts/gpu_run.sh            # all steps
#   REQUIRE_CARD=H200 scripts/gpu_run.sh   # only on an H200; any other card: stop at once
#   STEPS="build doctor" scripts/gpu_run.sh
#   STEPS="build prefill" PREFILL_LENS="512 4096" PREFILL_AB="DFLASH_ATTN_PREFILL=rows" scripts/gpu_run.sh
#   STEPS="build bench ab" AB="DFLASH_CUDA_PDL=0|" scripts/gpu_run.sh   # A/B under settings
#   STEPS="build ab" AB_PROMPT_LEN="512 4096" AB="|X=1" scripts/gpu_run.sh   # the A/B at two prompt lengths
#   STEPS="build ab" AB="|--warmup=0" scripts/gpu_run.sh   # words starting with -- are bench options
#   STEPS="build bench ab" AB="||" AB_TREE=ab_prev scripts/gpu_run.sh   # A/B of a code change: ab_prev holds
#                                             # the changed files as they were (an untracked folder)
#   DOCTOR_ARGS=--bandwidth-sweep STEPS="build doctor" scripts/gpu_run.sh   # read-bandwidth sweep too
#   STEPS="build tests" TEST_AB="DFLASH_CUDA_PDL=0" scripts/gpu_run.sh   # tests again under settings
#   STEPS="build ncu" NCU_SOURCE="split_kernel:5" scripts/gpu_run.sh   # Nsight Compute (step "ncu")
#   STEPS="timeline" scripts/gpu_run.sh      # device-side timeline of every kernel (a second build)
#   STEPS="timeline" AB_TREE=ab_prev TL_AB="DFLASH_SKINNY_PERSIST=0" scripts/gpu_run.sh   # of both trees
#   STEPS="timeline" TL_AB="--warmup=4 --warmup-tokens=64" scripts/gpu_run.sh   # and sustained (bench options)
#   BUILD_TESTS= STEPS="build bench" scripts/gpu_run.sh   # build dflash alone, not dflash_tests (or BUILD_TESTS=0)
#
# The device image is Ubuntu with CUDA, CMake 4 and g++ 13 but may lack the engine's system
# libraries (nlohmann-json, CLI11, PCRE2, utf8proc, OpenMP OpenBLAS, GoogleTest). Those come
# as Debian 12 packages unpacked here into .debs/deps.tar.xz (ignored by git, carried with
# the call; `scripts/gpu_run.sh --pack-deps` makes it on a Debian 12 machine) and are
# unpacked into /opt/deps there.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

if [[ "${1:-}" == "--pack-deps" ]]; then
  # On Debian 12: the packages, minus static libraries and docs the build does not use.
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download nlohmann-json3-dev libcli11-dev libpcre2-dev libpcre2-8-0 libutf8proc-dev \
    libutf8proc2 libopenblas-openmp-dev libopenblas0-openmp libopenblas-dev libgfortran5 libquadmath0 \
    libgtest-dev libgmock-dev pkgconf pkgconf-bin libpkgconf3 libcpp-httplib-dev libcpp-httplib0.11 libbrotli1 \
    libbrotli-dev libssl-dev zlib1g-dev)
  mkdir -p "$tmp/root"
  for f in "$tmp"/*.deb; do dpkg -x "$f" "$tmp/root"; done
  L="$tmp/root/usr/lib/x86_64-linux-gnu"
  find "$tmp/root" -name '*.a' ! -name 'libgtest*' ! -name 'libgmock*' -delete
  rm -f "$L"/openblas-openmp/liblapack* \
    "$L"/openblas-openmp/libblas* "$L"/libpcre2-16* "$L"/libpcre2-32* "$L"/libpcre2-posix*
  rm -rf "$tmp/root/usr/share/doc" "$tmp/root/usr/share/man" "$tmp/root/usr/share/lintian" "$tmp/root/usr/src"
  mkdir -p .debs
  tar -C "$tmp/root" -cJf .debs/deps.tar.xz usr
  grep -qx '/.debs/' .git/info/exclude 2>/dev/null || echo /.debs/ >>.git/info/exclude
  rm -rf "$tmp"
  ls -la .debs
  exit 0
fi

OUT=${OUT:-/tmp/dflash-gpu-out}
mkdir -p "$OUT"
# REQUIRE_CARD=H200: run only where the card's name holds that text, and otherwise stop at once
# (status 0) so the caller can give the machine back. A call that asks for an H200 may be given
# an H100, and the issue's figures are for the H200.
if [[ -n ${REQUIRE_CARD:-} ]]; then
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  if [[ $card != *"$REQUIRE_CARD"* ]]; then
    echo "REQUIRE_CARD=$REQUIRE_CARD: this card is '${card:-none found}'; nothing run" | tee "$OUT/log.txt"
    exit 0
  fi
fi
STEPS=${STEPS:-"env build tests doctor pycode bench prefill forced sampled hf"}
Q8B=${Q8B:-build-gpu/q8b}  # synthesised weights: kept between calls while the machine stays warm
TEST_FILTER=${TEST_FILTER:-'*Cuda*'}
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-16}
exec > >(tee -a "$OUT/log.txt") 2>&1
step() { echo; echo "=== $(date -u +%H:%M:%S) $*"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }
# The B tree of an A/B (AB_TREE): this tree with AB_TREE's files laid over it, in /tmp/ab-tree,
# made afresh once a call (a warm machine may still hold an earlier call's).
TL=${TL_BUILD:-build-timeline}
ab_tree_made=
make_ab_tree() {
  [[ -n $ab_tree_made ]] && return
  rm -rf /tmp/ab-tree && mkdir -p /tmp/ab-tree
  tar --exclude="./$BUILD" --exclude=./.debs --exclude="./$AB_TREE" --exclude="./$TL" -cf - . | tar -C /tmp/ab-tree -xf -
  cp -r "$AB_TREE"/. /tmp/ab-tree/
  ab_tree_made=1
}
# One setting of AB or TEST_AB ("A=1 B=2", shell quoting allowed: "DFLASH_CUDA_PDL_SKIP='matmul (skinny)'")
# as words for env.
# A setting's words; of them, those starting with "--" are bench options (arg_words), the rest
# environment assignments (env_words).
setting_words() {
  eval "words=($1)"
  env_words=() arg_words=()
  local w
  for w in "${words[@]}"; do if [[ $w == --* ]]; then arg_words+=("$w"); else env_words+=("$w"); fi; done
}
status=0

DEPS=${DEPS:-/opt/deps}
if [[ -f .debs/deps.tar.xz ]]; then
  mkdir -p $DEPS && tar -C $DEPS -xJf .debs/deps.tar.xz
  # The .pc files name /usr; point them at the unpacked copy.
  find $DEPS -name '*.pc' -exec sed -i "s|=/usr|=$DEPS/usr|g" {} +
  ARCH_LIB=$DEPS/usr/lib/x86_64-linux-gnu
  export PKG_CONFIG_PATH=$ARCH_LIB/pkgconfig:$DEPS/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export LD_LIBRARY_PATH=$ARCH_LIB:$ARCH_LIB/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  command -v pkg-config >/dev/null || export PATH=$PATH:$DEPS/usr/bin
  # cpp-httplib is linked by bare name and its header pulls OpenSSL, zlib and Brotli headers:
  # the compiler's and linker's own search paths cover those.
  export CPATH=$DEPS/usr/include:$DEPS/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}
  export LIBRARY_PATH=$ARCH_LIB${LIBRARY_PATH:+:$LIBRARY_PATH}
  CMAKE_DEPS=(-DCMAKE_PREFIX_PATH=$DEPS/usr
              -DOPENBLAS_OPENMP_LIBRARY=$ARCH_LIB/openblas-openmp/libopenblas.so
              -DOPENBLAS_OPENMP_INCLUDE=$DEPS/usr/include/x86_64-linux-gnu/openblas-openmp)
else
  CMAKE_DEPS=()
fi

if has env; then
  step "environment"
  nvidia-smi || status=1
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu --format=csv || true
  uname -a; nproc; free -g | head -2; df -h /tmp | tail -1
  # transformers at batch 1 is bound by the host CPU: its model goes with the hf step's figures.
  lscpu | grep -E "^(Model name|Socket|Core|Thread|CPU MHz|CPU max MHz)" || true
  cmake --version | head -1; g++ --version | head -1; nvcc --version | tail -1
  dpkg -l 2>/dev/null | grep -E "nlohmann|cli11|pcre2|utf8proc|openblas|gtest|pkgconf" | awk '{print $2, $3}'
fi

if has build; then
  step "configure + build ($BUILD, -DDFLASH_CUDA=ON)"
  # -lineinfo: source lines for ncu's per-line counters (debug info only; the code is the same).
  cmake -S . -B "$BUILD" -DDFLASH_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
    -DCMAKE_CUDA_FLAGS=-lineinfo "${CMAKE_DEPS[@]}" >"$OUT/configure.txt" 2>&1 \
    || { tail -40 "$OUT/configure.txt"; echo "configure FAILED"; exit 1; }
  t0=$(date +%s)
  # The whole log to a file (a `| head` here would kill the build with SIGPIPE), then its errors.
  # BUILD_TESTS empty or 0: dflash alone; unset or anything else: the tests too (BUILD_TESTS=1
  # once named a make target "1" and failed the call's build).
  tests_target=dflash_tests
  [[ ${BUILD_TESTS-1} == "" || ${BUILD_TESTS-1} == 0 ]] && tests_target=
  cmake --build "$BUILD" -j"$JOBS" --target dflash $tests_target >/tmp/dflash-build.log 2>&1
  grep -E "error|Error" /tmp/dflash-build.log | grep -v avx512fintrin | head -60
  [[ -x "$BUILD/dflash" && ( -z $tests_target || -x "$BUILD/tests/dflash_tests" ) ]] || { echo "build FAILED"; exit 1; }
  echo "built in $(( $(date +%s) - t0 )) s"
  rm -f "$OUT/configure.txt"
  if [[ -n ${AB_TREE:-} ]]; then
    # A second `dflash` from this tree with AB_TREE's files laid over it (the code before a
    # change, say): the ab step runs both, alternating, so a code change gets its A/B in one run.
    step "configure + build the B tree (this tree with $AB_TREE over it)"
    make_ab_tree
    cmake -S /tmp/ab-tree -B /tmp/ab-tree/build -DDFLASH_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_POLICY_VERSION_MINIMUM=3.5 "${CMAKE_DEPS[@]}" >/tmp/ab-configure.txt 2>&1 \
      || { tail -20 /tmp/ab-configure.txt; echo "B configure FAILED"; exit 1; }
    cmake --build /tmp/ab-tree/build -j"$JOBS" --target dflash >/tmp/ab-build.log 2>&1 \
      || { grep -E "error" /tmp/ab-build.log | head -20; echo "B build FAILED"; exit 1; }
    echo "B built"
  fi
fi

if has tests; then
  # TEST_AB ("|"-separated environment settings, as AB below) runs the tests again under each.
  IFS='|' read -ra test_settings <<<"${TEST_AB:-}"
  for setting in "" "${test_settings[@]}"; do
    step "GPU tests (dflash_tests --gtest_filter='$TEST_FILTER') ${setting:-default}"
    echo "=== ${setting:-default}" >>"$OUT/tests.txt"
    setting_words "$setting"
    env "${words[@]}" timeout 150 "$BUILD/tests/dflash_tests" --gtest_filter="$TEST_FILTER" >>"$OUT/tests.txt" 2>&1 || status=1
    sed -n '/^=== '"${setting:-default}"'$/,$p' "$OUT/tests.txt" \
      | grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED|cuda) |Failure|Expected|Which is|actual|error"
  done
fi

if has doctor; then
  step "dflash doctor"
  timeout 200 "$BUILD/dflash" doctor --require-gpu --bandwidth-gib 4 ${DOCTOR_ARGS:-} --model models/qwen3-pycode-15m --model testdata/tiny/qwen3-yarn-bf16 2>&1 | tee "$OUT/doctor.txt"
  [[ ${PIPESTATUS[0]} == 0 ]] || status=1
fi

if has tune; then
  step "skinny matmul K-split target (DFLASH_SKINNY_TARGET_WARPS) against doctor's matmul rows"
  for tw in 512 1024 2048 4096 8192; do
    echo "--- DFLASH_SKINNY_TARGET_WARPS=$tw"
    DFLASH_SKINNY_TARGET_WARPS=$tw timeout 120 "$BUILD/dflash" doctor --require-gpu 2>&1 | grep -E "^matmul +x\[(1|16)," 
  done
fi

if has pycode; then
  step "shipped pair (models/qwen3-pycode-15m + dflash), held-out prompts, CUDA"
  if [[ -f models/qwen3-pycode-15m/config.json ]]; then
    # PYCODE_AB ("|"-separated settings, as AB below) runs the pair again under each.
    IFS='|' read -ra pycode_settings <<<"${PYCODE_AB:-}"
    # With AB_TREE (see build), the B binary runs each setting too, right after the A one.
    pycode_binaries=("$BUILD/dflash")
    [[ -n ${AB_TREE:-} ]] && pycode_binaries+=(/tmp/ab-tree/build/dflash)
    for setting in "" "${pycode_settings[@]}"; do
      setting_words "$setting"
      for mode in --no-adaptive ""; do  # block 16 fixed, then as the controller chooses
        for bin in "${pycode_binaries[@]}"; do
          echo "--- ${mode:-adaptive} ${setting:-default}${AB_TREE:+ ($bin)}" | tee -a "$OUT/bench_pycode.txt"
          env "${words[@]}" timeout 90 "$bin" bench --device cuda --model models/qwen3-pycode-15m \
            --draft models/qwen3-pycode-15m-dflash --prompts models/prompts/heldout.jsonl -n 128 $mode 2>&1 \
            | grep -vE "^line " | tee -a "$OUT/bench_pycode.txt"
        done
      done
    done
  fi
fi

# N random token ids (comma-separated) from seed SEED: random_ids N SEED
random_ids() { python3 -c "import random; r=random.Random($2); print(','.join(str(r.randrange(151000)) for _ in range($1)))"; }
# The 8B-shaped runs' prompt: N (512 unless given) random ids, always from seed 7.
q8b_prompt() { random_ids "${1:-512}" 7; }

# Every step that runs the 8B-shaped pair needs it (an `ab` alone once found none and ran nothing).
if has bench || has sampled || has prefill || has ab || has forced || has hf; then
  step "synth Qwen3-8B-shaped random bf16 checkpoints"
  t0=$(date +%s)
  if [[ ! -f $Q8B/config.json ]]; then
    "$BUILD/dflash" synth --preset qwen3-8b --out $Q8B --draft-out $Q8B-dflash || status=1
  fi
  echo "synth took $(( $(date +%s) - t0 )) s"; du -sh $Q8B $Q8B-dflash
fi

if has bench; then
  # The per-op profiler (DFLASH_CUDA_PROFILE=1, the default here) prints its table to stderr at exit.
  # It times every op with events, which a graph capture cannot hold, so the graph probe runs only
  # with PROFILE=0.
  profile=${PROFILE:-1}
  probe=(); [[ $profile == 0 ]] && probe=(--graph-probe)
  # BENCH_PROMPT_LEN: the prompt's tokens (512 unless set).
  step "bench Qwen3-8B shapes: ${BENCH_PROMPT_LEN:=512}-token prompt, 64 new tokens, plain vs speculative (block 16, no adaptation)${probe:+, graph probe}"
  DFLASH_CUDA_PROFILE=$profile timeout 150 "$BUILD/dflash" bench --device cuda --model $Q8B --draft $Q8B-dflash \
    --prompt-ids "$(q8b_prompt "$BENCH_PROMPT_LEN")" -n 64 --ignore-eos --no-adaptive --bandwidth "${probe[@]}" --json "$OUT/bench_q8b.json" 2>&1 \
    | tee "$OUT/bench_q8b.txt"
  [[ ${PIPESTATUS[0]} == 0 ]] || status=1

  step "roofline"
  python3 - "$OUT" <<'EOF'
import json, re, sys
out = sys.argv[1]
doc = open(f"{out}/doctor.txt").read() if __import__("os").path.exists(f"{out}/doctor.txt") else ""
m = re.search(r"device copy bandwidth: ([0-9.]+) GB/s", doc)
b = json.load(open(f"{out}/bench_q8b.json"))
wb = b["weight_bytes_per_token"]
plain = b["plain_total"]
tps = plain.get("decode_tokens_per_second") or plain.get("tokens_per_second")
print(f"weight bytes per token: {wb/1e9:.2f} GB")
if m:
    bw = float(m.group(1)) * 1e9
    bound = bw / wb
    print(f"device copy bandwidth {bw/1e9:.0f} GB/s -> plain-decode bound {bound:.1f} tokens/s")
    if tps:
        print(f"plain decode {tps:.1f} tokens/s = {100*tps/bound:.1f}% of the bound")
EOF
fi

if has prefill; then
  # Prefill alone at longer prompts (target only, 4 new tokens): the bench's "prefill" line is
  # the median of a few forward passes over the prompt. DFLASH_ATTN_PREFILL=rows is the attention
  # kernel before the tensor-core one (slow at long prompts: run where it stays short).
  step "prefill at Qwen3-8B shapes: ${PREFILL_LENS:=512 2048 8192} tokens"
  for n in $PREFILL_LENS; do
    ids=$(random_ids $n $n)
    for setting in "" ${PREFILL_AB:-}; do
      [[ $setting == *=rows && $n -gt 2048 ]] && continue  # minutes
      echo "--- $n tokens ${setting:-default}" | tee -a "$OUT/prefill.txt"
      setting_words "$setting"
      env "${words[@]}" timeout 150 "$BUILD/dflash" bench --device cuda --model $Q8B --prompt-ids "$ids" -n 4 --ignore-eos \
        2>&1 | grep -E "^prefill|^time" | tee -a "$OUT/prefill.txt"
    done
  done
  # Where a prompt's time goes: the per-op profiler's rows of prompt-sized ops at the first length
  # (its mean leaves each shape's first call out).
  n=${PREFILL_LENS%% *}
  ids=$(random_ids $n $n)
  echo "--- $n tokens, per-op profile (DFLASH_CUDA_PROFILE=1)" | tee -a "$OUT/prefill.txt"
  DFLASH_CUDA_PROFILE=1 timeout 150 "$BUILD/dflash" bench --device cuda --model $Q8B --prompt-ids "$ids" -n 4 --ignore-eos \
    2>&1 | grep -E "^op |^[a-z_]+.* (T)?$n[x ]" | tee -a "$OUT/prefill.txt"
fi

if has ab; then
  # The same Qwen3-8B-shaped bench under each setting of AB ("|"-separated; each a list of
  # environment assignments, an empty one the default build): the A/B of a change in one run.
  # AB_PROMPT_LEN: the prompt's tokens (512, as the bench step's, unless set); several lengths
  # ("512 4096") run the whole list once at each.
  # SMI_LOG=1: the GPU's clocks, power and throttle reasons every 50 ms while the A/B runs
  # (nvidia-smi only reads them), into $OUT/smi.csv, with each run's start and end marked.
  smi_pid=
  if [[ -n ${SMI_LOG:-} ]] && command -v nvidia-smi >/dev/null; then
    : >"$OUT/smi.csv"
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
      --format=csv -lms 50 >>"$OUT/smi.csv" 2>&1 &
    smi_pid=$!
  fi
  smi_mark() { [[ -n $smi_pid ]] && echo "# $(date -u +%Y/%m/%d\ %H:%M:%S.%3N) $*" >>"$OUT/smi.csv"; return 0; }
  for ab_len in ${AB_PROMPT_LEN:=512}; do
    step "A/B at Qwen3-8B shapes, ${ab_len}-token prompt: ${AB:=DFLASH_CUDA_PDL=0|DFLASH_ATTN_MMA=0|}"
    ab_prompt=$(q8b_prompt "$ab_len")
    IFS='|' read -ra settings <<<"$AB|"
    binaries=("$BUILD/dflash")
    [[ -n ${AB_TREE:-} ]] && binaries+=(/tmp/ab-tree/build/dflash)
    for setting in "${settings[@]}"; do
      for bin in "${binaries[@]}"; do
        echo "--- ${setting:-default}${AB_TREE:+ ($bin)}"
        setting_words "$setting"
        smi_mark "start ${setting:-default}"
        env "${env_words[@]}" timeout 120 "$bin" bench --device cuda --model $Q8B --draft $Q8B-dflash \
          --prompt-ids "$ab_prompt" -n 64 --ignore-eos --no-adaptive --bandwidth "${arg_words[@]}" 2>&1 \
          | grep -E "^ALL|^DFlash step|^plain decode|^time|^verifications|^CUDA graphs|^prefill|^graph probe"
        smi_mark "end ${setting:-default}"
      done
    done
  done
  if [[ -n $smi_pid ]]; then
    kill "$smi_pid"
    python3 tools/smi_report.py "$OUT/smi.csv"
  fi
fi

if has forced; then
  step "Qwen3-8B shapes, BENCHMARK-ONLY forced acceptance (every step commits K tokens; not the target's output)"
  for k in 3 5 7; do
    timeout 120 "$BUILD/dflash" bench --device cuda --model $Q8B --draft $Q8B-dflash --prompt-ids "$(q8b_prompt)" \
      -n 64 --ignore-eos --no-adaptive --forced-acceptance $k 2>&1 | grep -E "^ALL|^time|steps" | tee -a "$OUT/forced.txt"
  done
fi

if has sampled; then
  step "sampled decoding (Qwen3's defaults: temperature 0.6, top-k 20, top-p 0.95; top-p 0.9 alone; temperature alone; min-p alone; penalties)"
  # SAMPLED_OPTS="opts|opts" runs only those settings.
  if [[ -n ${SAMPLED_OPTS:-} ]]; then IFS='|' read -r -a sampled_opts <<<"$SAMPLED_OPTS"
  else sampled_opts=("--temperature 0.6 --top-k 20 --top-p 0.95" "--temperature 0.7 --top-p 0.9"
      "--temperature 0.7 --top-p 0.9 whole" "--temperature 1.0" "--temperature 1.0 whole"
      "--temperature 1.0 --min-p 0.1" "--temperature 1.0 --min-p 0.1 whole"
      "--temperature 0.7 --top-p 0.9 --presence-penalty 1.5" "--temperature 0.7 --top-p 0.9 --presence-penalty 1.5 whole"
      "--repetition-penalty 1.1" "--repetition-penalty 1.1 whole"); fi
  for opts in "${sampled_opts[@]}"; do
    # "whole": the same, every row read whole (DFLASH_LOGIT_ROWS=whole), to compare within the run;
    # "serial": the same on one host thread (OMP_NUM_THREADS=1: the laws of rows read whole one by one)
    [[ "$opts" == *whole ]] && export DFLASH_LOGIT_ROWS=whole && opts=${opts% whole} || unset DFLASH_LOGIT_ROWS
    [[ "$opts" == *serial ]] && export OMP_NUM_THREADS=1 && opts=${opts% serial} || unset OMP_NUM_THREADS
    label="${DFLASH_LOGIT_ROWS:+ (rows read whole)}${OMP_NUM_THREADS:+ (one host thread)}"
    if [[ -f models/qwen3-pycode-15m/config.json ]]; then
      echo "--- shipped pair, $opts$label" | tee -a "$OUT/sampled.txt"
      timeout 90 "$BUILD/dflash" bench --device cuda --model models/qwen3-pycode-15m \
        --draft models/qwen3-pycode-15m-dflash --prompts models/prompts/heldout.jsonl -n 128 --no-adaptive $opts --seed 1 \
        2>&1 | grep -E "^ALL|^time|^DFlash" | tee -a "$OUT/sampled.txt"
    fi
    if [[ -f $Q8B/config.json ]]; then
      echo "--- Qwen3-8B shapes, $opts$label" | tee -a "$OUT/sampled.txt"
      timeout 120 "$BUILD/dflash" bench --device cuda --model $Q8B --draft $Q8B-dflash --prompt-ids "$(q8b_prompt)" \
        -n 64 --ignore-eos --no-adaptive $opts --seed 1 2>&1 | grep -E "^ALL|^time|^DFlash" | tee -a "$OUT/sampled.txt"
    fi
  done
  unset DFLASH_LOGIT_ROWS OMP_NUM_THREADS
fi

if has ncu; then
  # Nsight Compute on the doctor's Qwen3-8B-shaped cases (--quick: 5 launches a case): by
  # default the short kernels of a layer (q/k-norm/RoPE/store, split attention, merge), each
  # launch alone (ncu serialises them, so PDL overlap is not in these times). The clocks are
  # left as they are (--clock-control none). NCU_KERNELS / NCU_COUNT choose what and how many,
  # NCU_SECTIONS which sections (names as `ncu --list-sections` prints them).
  step "Nsight Compute: ${NCU_KERNELS:=split_kernel|split_merge|qk_norm_rope}"
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout ${NCU_TIMEOUT:-200} "$NCU" --clock-control none -k "regex:$NCU_KERNELS" --launch-count ${NCU_COUNT:-70} \
    $(for s in ${NCU_SECTIONS:-SpeedOfLight LaunchStats Occupancy WarpStateStats SchedulerStats SourceCounters}; do
      echo --section "$s"; done) \
    "$BUILD/dflash" doctor --require-gpu --quick --bandwidth-gib 0 >"$OUT/ncu.txt" 2>&1
  echo "ncu exit $?, $(wc -l <"$OUT/ncu.txt") lines"; grep -E "^  [a-z_].*\(|Duration" "$OUT/ncu.txt" | head -20
  # NCU_SOURCE="kernel:skip …": per-SASS-line counters (stall samples, instructions executed)
  # of that kernel's launch after `skip` of its launches (with --quick the doctor launches each
  # of its cases 5 times: split_kernel:0 is one row, split_kernel:5 16 rows).
  for pick in ${NCU_SOURCE:-}; do
    kernel=${pick%%:*} skip=${pick##*:}
    echo "=== $kernel after $skip launches" >>"$OUT/ncu_src.txt"
    timeout 120 "$NCU" --clock-control none -k "regex:$kernel" --launch-skip "$skip" --launch-count 1 \
      --section SourceCounters --page source --print-source ${NCU_PRINT:-sass} --csv \
      "$BUILD/dflash" doctor --require-gpu --quick --bandwidth-gib 0 >>"$OUT/ncu_src.txt" 2>&1
    echo "ncu source exit $?"
  done
fi

if has timeline; then
  # A second dflash whose kernels stamp a device-side timeline (timeline.h), run on the
  # Qwen3-8B shapes (one speculative bench: plain decoding, then DFlash); tools/timeline_report.py
  # says per kernel what it costs on the critical path and how the products' blocks start and
  # end. Compare the timeline build's tokens/s with the bench step's (the stamps' own cost).
  # With AB_TREE, the B tree gets a timeline build too, and TL_AB ("|"-separated settings)
  # adds timelines of this tree under those settings. TL_ARGS=--blocks also brings back the
  # block records of a few forwards (mind the 8 files that come back).
  step "timeline build (-DDFLASH_CUDA_TIMELINE=ON) and runs at Qwen3-8B shapes"
  tl_build() {  # source dir, build dir
    cmake -S "$1" -B "$2" -DDFLASH_CUDA=ON -DDFLASH_CUDA_TIMELINE=ON -DDFLASH_TESTS=OFF -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_POLICY_VERSION_MINIMUM=3.5 "${CMAKE_DEPS[@]}" >/tmp/tl-configure.txt 2>&1 \
      && cmake --build "$2" -j"$JOBS" --target dflash >/tmp/tl-build.log 2>&1 \
      || { tail -5 /tmp/tl-configure.txt; grep -E "error" /tmp/tl-build.log | head -20; echo "timeline build FAILED"; return 1; }
  }
  tl_run() {  # label, binary, "draft" or "", settings, report options
    local label=$1 bin=$2 draft=${3:+--draft $Q8B-dflash}
    setting_words "${4:-}"
    env "${env_words[@]}" DFLASH_CUDA_TIMELINE_RECORDS=${TL_RECORDS:-25000000} DFLASH_CUDA_TIMELINE_OUT=/tmp/tl_$label.bin timeout 150 \
      "$bin" bench --device cuda --model $Q8B $draft --prompt-ids "$(q8b_prompt)" -n 64 --ignore-eos --no-adaptive \
      "${arg_words[@]}" 2>&1 | grep -E "^ALL"
    echo "=== timeline $label (${4:-default})" >>"$OUT/timeline.txt"
    python3 tools/timeline_report.py ${TL_ARGS:-} ${5:-} /tmp/tl_$label.bin --save "$OUT/timeline_$label.npz" 2>&1 \
      | tee -a "$OUT/timeline.txt" | grep -E "^== |^(q/k/v|o|gate/up|down|LM head) |^sum"
    rm -f /tmp/tl_$label.bin
  }
  if tl_build . "$TL"; then
    [[ -f $Q8B/config.json ]] || "$TL/dflash" synth --preset qwen3-8b --out $Q8B --draft-out $Q8B-dflash
    # A speculative bench runs plain decoding first: one timeline holds decode, draft and verify.
    [[ ${TL_DEFAULT:-1} == 0 ]] || tl_run spec "$TL/dflash" draft  # TL_DEFAULT=0: only the TL_AB runs
    IFS='|' read -ra tl_settings <<<"${TL_AB:-}"
    i=0
    for setting in "${tl_settings[@]}"; do
      # TL_AB_REPORT: report options for these runs only (e.g. --skip 130 past warm-up forwards).
      [[ -n $setting ]] && tl_run "ab$((i++))" "$TL/dflash" draft "$setting" "${TL_AB_REPORT:-}"
    done
    [[ -n ${AB_TREE:-} ]] && make_ab_tree
    if [[ -n ${AB_TREE:-} ]] && tl_build /tmp/ab-tree /tmp/ab-tree/build-timeline; then
      tl_run B /tmp/ab-tree/build-timeline/dflash draft
    fi
  else
    status=1
  fi
fi

if has golden; then
  step "sampling warpers golden (transformers)"
  python3 tools/make_sampling_golden.py --out "$OUT/warpers_golden.json" | tail -30
fi

if has hf; then
  step "transformers side by side on the same weights (generate + a transformers DFlash loop)"
  timeout 400 python3 tools/hf_side_by_side.py --target $Q8B --draft $Q8B-dflash --prompt-len 512 --new-tokens 64 \
    --block 16 --steps 32 --device cuda --dtype bfloat16 --json "$OUT/hf_side_by_side.json" 2>&1 | tail -40
  [[ ${PIPESTATUS[0]} == 0 ]] || status=1
fi

step "done (status $status)"
ls -la "$OUT"
exit $status
