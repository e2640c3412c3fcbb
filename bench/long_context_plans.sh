#!/usr/bin/env bash
# docs/training.md's table of the four mesh axes for HwH-1.4B at long context, planned by the
# TPU compiler on any host (launch.plan, compile-only v5p devices):
#   bash bench/long_context_plans.sh OUT_DIR [CELL ...]
# CELL: CONTEXT_K:TOPOLOGY:MESH:BATCH[:REMAT], e.g. 64:v5p-32:1,4,1,4:4 (the defaults below); REMAT
# starts the planner's remat policies there (model.remat; default the config's, none), which
# saves the compiles of the lighter policies where a cell cannot fit under them (at 256K the
# 16-chip step under model.remat=none needs more than a v5p chip's 95 GiB: 11 minutes a
# compile, and the planner would try up to five). Each cell
# writes OUT_DIR/plan_hwh_1b4_<context>k_<topology>_<mesh>.json and a .log holding the compile's
# wall time and peak host memory (GNU time); render the table with
#   python bench/plan_table.py OUT_DIR/plan_hwh_1b4_*.json
# The meshes keep a chip's tokens near 16K (one sequence over data x fsdp groups, its tokens over
# the sequence axis) and the accumulation at 1, so that each cell compiles once (2-20 minutes
# each for the 1.4B model on a 2-core host and 11-20 GB of host memory; 1M tokens with sequence
# 64 needs more than 24 GB, so the 1M cells keep sequence 16 and add fsdp).
set -uo pipefail
OUT=$1; shift
mkdir -p "$OUT"
CELLS=("$@")
if [ ${#CELLS[@]} -eq 0 ]; then
  CELLS=(
    8:v5p-32:1,16,1,1:16 64:v5p-32:1,4,1,4:4 256:v5p-32:1,1,1,16:1:full 1024:v5p-32:1,1,1,16:1:full
    32:v6e-16:1,4,1,4:4:full 8:v5p-128:1,64,1,1:64 32:v5p-128:1,32,1,2:32 64:v5p-128:1,16,1,4:16
    256:v5p-128:1,4,1,16:4:full
    8:v5p-512:1,256,1,1:256 64:v5p-512:1,64,1,4:64 256:v5p-512:1,16,1,16:16:full
    1024:v5p-128:1,4,1,16:4:full 1024:v5p-512:1,16,1,16:16:full
  )
fi
for cell in "${CELLS[@]}"; do
  IFS=: read -r ctx topo mesh batch remat <<<"$cell"
  name="plan_hwh_1b4_${ctx}k_${topo//-/}_${mesh//,/}${remat:+_$remat}"
  echo "== $name" >&2
  /usr/bin/time -v python -m launch.plan --config=configs/hwh_1b4.py --topology="$topo" \
    --config.seq_len=$((ctx * 1024)) --config.train.mesh="$mesh" \
    --config.train.batch_size="$batch" --config.train.grad_accum=1 ${remat:+--config.model.remat=$remat} \
    --out="$OUT/$name" >"$OUT/$name.log" 2>&1
  echo "exit $?" >>"$OUT/$name.log"
  if [ -f "$OUT/$name/plan.json" ]; then cp "$OUT/$name/plan.json" "$OUT/$name.json"; fi
  grep -E "Elapsed|Maximum resident|memory per chip|does not|exit" "$OUT/$name.log" >&2
done
