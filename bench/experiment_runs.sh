#!/usr/bin/env bash
# The experiments of docs/results.md on one GPU (configs/experiment.py).
# Usage: bash bench/experiment_runs.sh OUT_DIR L RUN [RUN ...]
# RUN is an ARCH of configs/experiment.py, or NAME:ARCH:OVERRIDES (a variant named NAME, with
# config overrides separated by spaces, e.g. "aw50:transformer:--config.data.retrieval_answer_weight=50").
# Each run trains into ${WORK:-/tmp/exp}/ARCH (checkpoints stay there) under a time limit of
# ${RUN_LIMIT:-290} s; OUT_DIR/ARCH gets its log, summary.json, metrics.jsonl, loss.png and eval/
# (all that `python -m launch.experiment --report=...` reads). Then the report over OUT_DIR's runs.
# PARALLEL=1 runs them all at once (the tokenizer and token cache are built first; no memory
# preallocation); their tokens/s then measure a shared GPU, not one run.
# EXTRA adds config overrides to every run (a CPU smoke test: EXTRA="--config.model.size=tiny
# --config.model.dtype=float32 --config.train.steps=3").
set -uo pipefail
OUT=$1; L=$2; shift 2
WORK=${WORK:-/tmp/exp}
mkdir -p "$OUT" "$WORK"

run_one() {
  local name=${1%%:*} spec=$1 arch over=""
  arch=$name
  if [[ $spec == *:* ]]; then IFS=: read -r name arch over <<< "$spec"; fi
  echo "=== $name ($arch $over) at L=$L ($(date -u +%T))"
  timeout "${RUN_LIMIT:-290}" python -m launch.experiment --config="configs/experiment.py:$arch,$L" \
    --out="$WORK/$name" $over ${EXTRA:-} 2>&1 | grep -v "^I[0-9]" > "$OUT/$name.log"
  echo "=== $name exit ${PIPESTATUS[0]} ($(date -u +%T)): $(tail -n 1 "$OUT/$name.log")"
  mkdir -p "$OUT/$name"
  [ -d "$WORK/$name" ] && (cd "$WORK/$name" && cp -r summary.json metrics.jsonl loss.png \
    experiment.json eval "$OUT/$name/" 2>/dev/null)
}

if [ "${PARALLEL:-0}" = 1 ]; then
  export XLA_PYTHON_CLIENT_PREALLOCATE=false   # else the first run takes 75% of the GPU's memory
  first=$1; [[ $first == *:* ]] && { first=${first#*:}; first=${first%%:*}; }
  python -c "
from configs.experiment import get_config
from hwh_jax.data.pipeline import build_splits
from hwh_jax.training.specs import run_specs
c = get_config('$first,$L'); print(build_splits(run_specs(c).data, c.seq_len).train)"
  for run in "$@"; do run_one "$run" & done
  wait
else
  for run in "$@"; do run_one "$run"; done
fi
runs=$(for r in "$@"; do a=${r%%:*}; [ -f "$OUT/$a/experiment.json" ] && printf '%s,' "$OUT/$a"; done)
if [ -n "$runs" ]; then
  python -m launch.experiment --report="${runs%,}" --out="$OUT/report" 2>&1 | grep -v "^I[0-9]"
fi
echo "=== done ($(date -u +%T))"
