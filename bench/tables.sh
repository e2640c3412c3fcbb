#!/usr/bin/env bash
# The tables of docs/benchmarks.md on one GPU, part by part:
#   bash bench/tables.sh OUT_DIR PART [PART ...]
# PART: gdn        GDN kernels against fla at three shapes (fla_gdn_anchor.py needs fla installed;
#                  --profile: fla's kernels summed, the figure comparable to ours; bench/gdn.py
#                  --check adds the bf16 errors against an fp32 reference)
#       step2k     the 380m training step at 2K, HwH and the Transformer, 44 sequences a step
#       steplong   the 380m step at 8K and 32K, HwH and the Transformer, 65,536 tokens a step
#       decode     prefill-free decode at 32K, batch 1 and 32, HwH and the Transformer
#       decay      gated linear attention, a decay per head (Lightning, RetNet, Mamba-2), the
#                  Pallas kernels and the jnp form against fla's chunk_simple_gla (with
#                  --profile: device times per call, the measure comparable to fla's)
#       decay_key  the same with a decay per key dimension (GLA, HGRN-2) against fla's chunk_gla,
#                  and the Pallas kernels under a steep decay (--gate_bias -4: their exact form)
#       delta_rule DeltaNet (the GDN kernels with g = 0) against fla's chunk_delta_rule
#       causality  every architecture (and HwH with each linear kind) at small/380m/1b4, batch 1 and 8,
#                  T 2K and 8K: nothing before a changed token moves, in the forward, the training
#                  forward, the loss's gradient and prefill, at init and after 50 steps; the kernels
#                  alone (bench/causality.py; --sizes/--archs for a part); a row that runs out of
#                  memory says so (NOT CHECKED) and the rest go on; then the gradients again under
#                  XLA's deterministic GPU ops (bitwise; a rerun under default ops differs); the
#                  table of what is checked (bench/causality_table.py)
#       memorize   one fixed batch against a fresh batch every step (bench/memorize.py): 380m HwH and
#                  the Transformer at the step2k batch and at 1, then small, 5 architectures x 3 seeds
#       projections  one HwH-380m layer's input projections grouped into products several ways, and
#                  its FA heads' q, k, v as one product or three (bench/step_parts.py mixer_in, fa_qkv)
#       compiled   the kernel tests that compile for the GPU (the Mosaic GPU WY apply against its
#                  formulas and the Triton path): pytest under JAX_PLATFORMS=cuda, which
#                  tests/conftest.py otherwise sets to cpu (they are then skipped or interpreted)
#       hgrn       HGRN's element-wise recurrence (associative scan, Pallas kernels) against fla's chunk_hgrn
#                  (the mixer parts at B=8, T=2K and B=2, T=8K, 16 heads of 128; each fla op
#                  autotunes on first use, minutes on a bare machine: one or two parts a call)
# Each part writes OUT_DIR/PART.jsonl (rows as the scripts print them; compiled: none) and OUT_DIR/PART.log.
# The step parts set the XLA flags docs/training.md measured fastest for training on an H200
# (command buffers off, cuBLAS for every product) unless XLA_FLAGS is set; decode keeps XLA's
# defaults (its command buffers replay a step's hundreds of small kernels as one graph). Every
# part lets JAX take 95% of the GPU's memory unless XLA_PYTHON_CLIENT_MEM_FRACTION is set.
set -uo pipefail
OUT=$1; shift
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
TRAIN_FLAGS=${XLA_FLAGS:-"--xla_gpu_enable_command_buffer= --xla_gpu_enable_triton_gemm=false"}
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}
SHAPES="8,2048,16,128,128 2,8192,16,128,128 32,2048,13,64,64"
MIXER_SHAPES="8,2048,16,128,128 2,8192,16,128,128"

for part in "$@"; do
  echo "=== $part ($(date -u +%T))"
  case $part in
    gdn)
      python3 bench/gdn.py --profile --shapes $SHAPES --impls pallas --out "$OUT/gdn.jsonl"
      python3 bench/fla_gdn_anchor.py --profile $SHAPES | tee "$OUT/gdn_fla.jsonl" ;;
    step2k)
      XLA_FLAGS=$TRAIN_FLAGS python3 bench/train_step.py --sizes 380m --contexts 2048 --tokens_per_step 90112 \
        --steps 8 --archs hwh transformer --out "$OUT/step2k.jsonl" ;;
    steplong)
      XLA_FLAGS=$TRAIN_FLAGS python3 bench/train_step.py --sizes 380m --contexts 8192 32768 --tokens_per_step 65536 \
        --steps 6 --archs hwh transformer --out "$OUT/steplong.jsonl" ;;
    decode)
      python3 bench/decode.py --size 380m --archs hwh transformer --contexts 32768 \
        --batches 1 32 --prefill none --decode_reps 5 --out "$OUT/decode.jsonl" ;;
    decay)
      python3 bench/decay_attention.py --profile --reps 10 --shapes $MIXER_SHAPES --out "$OUT/decay.jsonl"
      python3 bench/fla_gdn_anchor.py simple_gla $MIXER_SHAPES | tee "$OUT/decay_fla.jsonl" ;;
    decay_key)
      python3 bench/decay_attention.py --per_key --profile --reps 10 --shapes $MIXER_SHAPES --out "$OUT/decay_key.jsonl"
      python3 bench/fla_gdn_anchor.py gla $MIXER_SHAPES | tee "$OUT/decay_key_fla.jsonl"
      python3 bench/decay_attention.py --per_key --profile --reps 10 --impls pallas --gate_bias -4 \
        --shapes 8,2048,16,128,128 --out "$OUT/decay_key_steep.jsonl" ;;
    delta_rule)
      python3 bench/gdn.py --no_decay --check --profile --shapes $MIXER_SHAPES --impls pallas --out "$OUT/delta_rule.jsonl"
      python3 bench/fla_gdn_anchor.py delta_rule $MIXER_SHAPES | tee "$OUT/delta_rule_fla.jsonl" ;;
    hgrn)
      python3 bench/gated_recurrence.py --profile --shapes 8,2048,2048 2,8192,2048 --out "$OUT/hgrn.jsonl"
      python3 bench/fla_gdn_anchor.py hgrn 8,2048,1,2048,2048 2,8192,1,2048,2048 | tee "$OUT/hgrn_fla.jsonl" ;;
    causality)
      # small models two at a time; a 380m or 1b4 model needs the GPU to itself. Then the
      # gradients bitwise: XLA's deterministic GPU ops and XLA's attention by query blocks (cuDNN's
      # stops there; the plain reference's scores do not fit at 8 x 8,192)
      python3 bench/causality.py --sizes small --jobs 2 --out "$OUT/causality.jsonl"
      python3 bench/causality.py --sizes 380m 1b4 --kernels '' --out "$OUT/causality_large.jsonl"
      python3 bench/causality.py --sizes small --jobs 2 --kernels '' --deterministic --attention_impl blocked \
        --out "$OUT/causality_deterministic.jsonl"
      python3 bench/causality.py --sizes 380m 1b4 --kernels '' --batches 1 --deterministic --attention_impl blocked \
        --paths grad --out "$OUT/causality_large_deterministic.jsonl"
      python3 bench/causality_table.py "$OUT"/causality*.jsonl --missing ;;
    memorize)
      python3 bench/memorize.py --archs hwh transformer --size 380m --seq_len 2048 --batch 22 1 --steps 34 \
        --skip_recency --out "$OUT/memorize_380m.jsonl"
      python3 bench/memorize.py --archs transformer gdn layerwise hwh --variant hwh_conv1:hwh:conv_size=1 \
        --size small --seq_len 2048 --batch 8 --steps 60 --seeds 0 1 2 --out "$OUT/memorize_small.jsonl" ;;
    projections)
      XLA_FLAGS=$TRAIN_FLAGS python3 bench/step_parts.py --tokens 45056 --parts fa_qkv mixer_in --fa_heads 1 3 5 \
        --out "$OUT/projections.jsonl" ;;
    compiled)
      JAX_PLATFORMS=cuda python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gdn_mosaic.py ;;
    *) echo "unknown part $part (gdn, step2k, steplong, decode, decay, decay_key, delta_rule, hgrn, causality, memorize, projections, compiled)"; exit 2 ;;
  esac 2>&1 | grep -v "^I[0-9]" | tee "$OUT/$part.log"
done
echo "=== done ($(date -u +%T))"
