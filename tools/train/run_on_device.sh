#!/usr/bin/env bash
# Driver for training the shipped model pair on the GPU machine.
#
#   run_on_device.sh pipeline      run everything in the foreground (tokenizer + target, drafter, eval)
#   run_on_device.sh start         launch the pipeline in the background (setsid), log to $STAGE/logs
#   run_on_device.sh wait SECS     wait until the pipeline ends or SECS pass; print the log's tail
#   run_on_device.sh collect       copy the artefacts into $OUT (<= 8 files, each < 16 MiB)
#
# Typical device calls:  start; wait 570; collect   (then, if not done: wait 500; collect)
# Budgets (seconds) can be overridden through the environment: TARGET_SECONDS, GEN_SECONDS,
# DRAFT_SECONDS; extra arguments through TARGET_ARGS, DRAFT_ARGS, EVAL_ARGS (used for toy runs on a CPU).
# The local repo layout after unpacking the collected files:
#   models/qwen3-pycode-15m/  models/qwen3-pycode-15m-dflash/  models/prompts/heldout.jsonl
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
STAGE="${STAGE:-/tmp/dflash_train}"
WORK="$STAGE/work"
TARGET_DIR="$STAGE/models/qwen3-pycode-15m"
DRAFT_DIR="$STAGE/models/qwen3-pycode-15m-dflash"
PROMPTS="$STAGE/models/prompts/heldout.jsonl"
LOGS="$STAGE/logs"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true

pipeline() {
  mkdir -p "$WORK" "$LOGS" "$STAGE/models/prompts"
  rm -f "$STAGE/DONE" "$STAGE/FAILED"
  local t0=$SECONDS
  {
    echo "== $(date -u) pipeline start"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    "$PY" -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)'
  } 2>&1 | tee -a "$LOGS/pipeline.log"
  set -o pipefail
  "$PY" "$HERE/train_target.py" --work "$WORK" --out "$TARGET_DIR" \
      --train-seconds "${TARGET_SECONDS:-210}" ${TARGET_ARGS:-} 2>&1 | tee "$LOGS/train_target.log" || { echo "target failed" | tee -a "$LOGS/pipeline.log"; touch "$STAGE/FAILED"; return 1; }
  echo "== target done at +$((SECONDS - t0))s" | tee -a "$LOGS/pipeline.log"
  "$PY" "$HERE/train_dflash.py" --work "$WORK" --target "$TARGET_DIR" --out "$DRAFT_DIR" \
      --gen-seconds "${GEN_SECONDS:-60}" --train-seconds "${DRAFT_SECONDS:-165}" ${DRAFT_ARGS:-} 2>&1 | tee "$LOGS/train_dflash.log" || { echo "drafter failed" | tee -a "$LOGS/pipeline.log"; touch "$STAGE/FAILED"; return 1; }
  echo "== drafter done at +$((SECONDS - t0))s" | tee -a "$LOGS/pipeline.log"
  "$PY" "$HERE/eval_acceptance.py" --work "$WORK" --target "$TARGET_DIR" --drafter "$DRAFT_DIR" \
      --prompts-out "$PROMPTS" --results "$STAGE/models/eval_results.json" ${EVAL_ARGS:-} 2>&1 | tee "$LOGS/eval_acceptance.log" || { echo "eval failed" | tee -a "$LOGS/pipeline.log"; touch "$STAGE/FAILED"; return 1; }
  cp "$WORK/target_stats.json" "$WORK/dflash_stats.json" "$STAGE/models/" 2>/dev/null || true
  echo "== $(date -u) pipeline done at +$((SECONDS - t0))s" | tee -a "$LOGS/pipeline.log"
  touch "$STAGE/DONE"
}

start() {
  mkdir -p "$LOGS"
  rm -f "$STAGE/DONE" "$STAGE/FAILED"
  cd "$REPO" || exit 1
  setsid nohup bash "$HERE/run_on_device.sh" pipeline > "$LOGS/driver.out" 2>&1 < /dev/null &
  echo "started pipeline pid $!"
}

wait_for() {
  local limit="${1:-560}" t0=$SECONDS
  while (( SECONDS - t0 < limit )); do
    [[ -e "$STAGE/DONE" || -e "$STAGE/FAILED" ]] && break
    sleep 5
  done
  echo "== waited $((SECONDS - t0))s; DONE=$([[ -e $STAGE/DONE ]] && echo yes || echo no) FAILED=$([[ -e $STAGE/FAILED ]] && echo yes || echo no)"
  tail -n 60 "$LOGS/driver.out" 2>/dev/null
}

collect() {
  : "${OUT:?OUT is not set}"
  local meta="$STAGE/meta"
  rm -rf "$meta"; mkdir -p "$meta"
  cp -r "$LOGS" "$meta/" 2>/dev/null || true
  # big files travel one by one; everything small goes into one tarball
  local n=0
  ( cd "$STAGE" && find models -type f -size +1048576c | sort ) > "$meta/big_files.txt"
  while read -r f; do
    local d; d="$OUT/$(basename "$(dirname "$f")")"
    mkdir -p "$d" && cp "$STAGE/$f" "$d/" && n=$((n + 1))
  done < "$meta/big_files.txt"
  ( cd "$STAGE" && find models -type f ! -size +1048576c | sort | tar czf "$OUT/small_files.tgz" -T - logs meta/big_files.txt )
  echo "collected $n big files + small_files.tgz:"
  ( cd "$OUT" && find . -type f -exec ls -l {} + )
  [[ -e "$STAGE/DONE" ]] && echo "pipeline DONE" || echo "pipeline NOT done"
}

case "${1:-}" in
  pipeline) pipeline ;;
  start) start ;;
  wait) wait_for "${2:-560}" ;;
  collect) collect ;;
  *) echo "usage: $0 pipeline|start|wait SECS|collect" >&2; exit 2 ;;
esac
