#!/usr/bin/env bash
# The experiments of docs/results.md, one after another on one GPU (configs/experiment.py).
# Usage: bash bench/experiment_runs.sh OUT_DIR L ARCH [ARCH ...]
# Each run trains into ${WORK:-/tmp/exp}/ARCH (checkpoints stay there) under a time limit of
# ${RUN_LIMIT:-290} s; OUT_DIR/ARCH gets its log, summary.json, metrics.jsonl, loss.png and eval/
# (all that `python -m launch.experiment --report=...` reads). Then the report over OUT_DIR's runs.
# EXTRA adds config overrides to every run (a CPU smoke test: EXTRA="--config.model.size=tiny
# --config.model.dtype=float32 --config.train.steps=3").
set -uo pipefail
OUT=$1; L=$2; shift 2
WORK=${WORK:-/tmp/exp}
mkdir -p "$OUT" "$WORK"
for arch in "$@"; do
  echo "=== $arch at L=$L ($(date -u +%T))"
  timeout "${RUN_LIMIT:-290}" python -m launch.experiment --config="configs/experiment.py:$arch,$L" \
    --out="$WORK/$arch" ${EXTRA:-} 2>&1 | grep -v "^I[0-9]" > "$OUT/$arch.log"
  echo "exit ${PIPESTATUS[0]}; $(tail -n 1 "$OUT/$arch.log")"
  mkdir -p "$OUT/$arch"
  [ -d "$WORK/$arch" ] && (cd "$WORK/$arch" && cp -r summary.json metrics.jsonl loss.png experiment.json eval \
    "$OUT/$arch/" 2>/dev/null)
done
runs=$(for a in "$@"; do [ -f "$OUT/$a/experiment.json" ] && printf '%s,' "$OUT/$a"; done)
if [ -n "$runs" ]; then
  python -m launch.experiment --report="${runs%,}" --out="$OUT/report" 2>&1 | grep -v "^I[0-9]"
fi
echo "=== done ($(date -u +%T))"
