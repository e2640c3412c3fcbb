# planned for the next device session (written in session 14, not run): XLA flags that could
# cut the 2K step's non-matmul time, each in its own process on one machine (a flag this XLA
# does not know aborts its row only): the RMS norms' reduce-then-scale as one Triton kernel
# (~8 ms of forward norm passes, 18 ms backward), and cuBLAS for the products XLA gives Triton
# (gemm_fusion_dot_*, ~4.5 ms). Carry .whl .gpu_data .gpu_scripts.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
left() { local l=$((575 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
step() {  # name timeout extra-flags
  local name=$1 t=$(left $2); echo "== $name $(date +%T) (limit $t s)"; [ $t -gt 20 ] || return
  XLA_FLAGS="--xla_gpu_enable_command_buffer= $3" timeout $t python3 bench/train_step.py --sizes 380m \
    --steps 5 --contexts 2048 --tokens_per_step 65536 --archs hwh --profile /tmp/prof_$name \
    --profile_top 40 --out $OUT/f_$name.jsonl > /tmp/o/f_$name.txt 2>&1
  grep -A3 "device per step" /tmp/o/f_$name.txt | head -3; grep -A1 "^size" /tmp/o/f_$name.txt || tail -3 /tmp/o/f_$name.txt
}
step base 150 ""
step softmax_fusion 150 "--xla_gpu_experimental_enable_triton_softmax_priority_fusion=true"
step no_triton_gemm 150 "--xla_gpu_enable_triton_gemm=false"
cd /tmp/o && tar czf $OUT/f_logs.tgz f_*.txt
