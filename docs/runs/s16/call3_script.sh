# session 16, call 3: the patched short convolution (proposed_conv_regs.patch.txt) in HwH-380m's
# 2K step at tiles of 64 (.gpu_variants/cr64) and 32 (.gpu_variants/cr), the shipped code first,
# then cr64 with cuBLAS for every product; batch 32, no profile (call 2's profiled row ran out of
# its 110 s), 12 steps a run.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
left() { local l=$((560 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
step() {  # name dir timeout extra-xla-flags
  local name=$1 dir=$2 t=$(left $3); echo "== step $name $(date +%T) (limit $t s)"; [ $t -gt 30 ] || return
  (cd $dir && PYTHONPATH=/tmp/site:$PWD XLA_FLAGS="--xla_gpu_enable_command_buffer= $4" timeout $t \
    python3 bench/train_step.py --sizes 380m --steps 12 --contexts 2048 --tokens_per_step 65536 \
    --archs hwh --out $OUT/s_$name.jsonl) > /tmp/o/s_$name.txt 2>&1
  grep -A1 "^size" /tmp/o/s_$name.txt || tail -3 /tmp/o/s_$name.txt
}
step base . 110
step cr64 .gpu_variants/cr64 100
step cr32 .gpu_variants/cr 100
step cr64_nt .gpu_variants/cr64 100 "--xla_gpu_enable_triton_gemm=false"
cd /tmp/o && tar czf $OUT/logs.tgz *.txt
