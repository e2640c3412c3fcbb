#!/usr/bin/env bash
# RoPE Transformers (small, 12 x 640) trained at several context lengths on the same tokens,
# then analysed together with launch.analyze: where the GPBand sits and whether it moves.
# Usage: bash bench/gpband_runs.sh OUT_DIR [STEPS] [TOKENS_PER_STEP] [LENGTHS...]
# Workdirs (checkpoints) go to ${WORK:-/tmp/gpband}; OUT_DIR gets logs, summaries, plots.
# WINDOW=N analyses every model over N tokens (one window longer than every training length,
# so a band's edge is not bounded by the window); unset, each over its own training length.
# NUM_SAMPLES=N analyses N held-out windows (default 8; the held-out split holds 6 of 4096).
# SEED=S trains with --config.seed=S (initialisation and data order; default 0).
set -euo pipefail
OUT=$1; STEPS=${2:-300}; TPS=${3:-32768}; shift 3 || true
LENGTHS=${*:-256 512 1024}
WORK=${WORK:-/tmp/gpband}
mkdir -p "$OUT" "$WORK"
ckpts=()
for L in $LENGTHS; do
  echo "=== transformer_small at seq_len $L: $STEPS steps x $TPS tokens ($(date -u +%T))"
  python -m launch.train --config=configs/base.py:transformer_small --workdir="$WORK/tf_$L" \
    --config.seq_len="$L" --config.seed="${SEED:-0}" --config.train.batch_size=$((TPS / L)) --config.train.steps="$STEPS" \
    --config.train.warmup_steps=$((STEPS / 10)) --config.train.lr=1e-3 \
    --config.data.tokenizer=train_sentencepiece --config.model.vocab_size=0 \
    --config.train.eval_every=$((STEPS / 3)) --config.train.log_every=$((STEPS > 6 ? STEPS / 6 : 1)) \
    --config.train.checkpoint_every="$STEPS" --config.eval.at_end=False 2>&1 \
    | grep -v "^I[0-9]" | tee "$OUT/train_$L.log"
  mkdir -p "$OUT/tf_$L" && cp "$WORK/tf_$L"/{summary.json,metrics.jsonl,loss.png} "$OUT/tf_$L/"
  ckpts+=("$WORK/tf_$L")
done
echo "=== analysis ($(date -u +%T))"
python -m launch.analyze --checkpoint="$(IFS=,; echo "${ckpts[*]}")" --num_samples="${NUM_SAMPLES:-8}" \
  --num_queries=32 --seq_len="${WINDOW:-0}" --out="$OUT/analysis" 2>&1 | grep -v "^I[0-9]" | tee "$OUT/analyze.log"
echo "=== done ($(date -u +%T))"
