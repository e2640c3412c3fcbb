# planned for the next device session (written in session 14, not run): HwH-380m's 2K step,
# one process per row on one machine: the shipped code; with proposed_project_many.patch.txt
# (the mixer's input projections with a backward of two products over the concatenated output
# gradients, where autodiff forms up to 9 input gradients of [65,536, 1024] and sums them: the
# norm backward's 1.48-GB fusion, ~7.6 ms, and small-K products; estimated from bytes, ~2 GB
# less traffic a layer, i.e. up to ~10 ms a step, unmeasured); and two XLA flags (a flag this XLA
# does not know aborts its row only): the norms' reduce-then-scale as one Triton kernel (~8 ms
# of forward norm passes, 18 ms backward), and cuBLAS for the products XLA gives Triton
# (gemm_fusion_dot_*, ~4.5 ms). Before the call: .gpu_variants/pm = git archive HEAD + the
# patch (`patch -p1`; git apply skips it inside this repository). Carry .whl .gpu_data .gpu_scripts .gpu_variants.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
left() { local l=$((575 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
step() {  # name dir timeout extra-flags
  local name=$1 dir=$2 t=$(left $3); echo "== $name $(date +%T) (limit $t s)"; [ $t -gt 20 ] || return
  (cd $dir && PYTHONPATH=/tmp/site:$PWD XLA_FLAGS="--xla_gpu_enable_command_buffer= $4" timeout $t \
    python3 bench/train_step.py --sizes 380m --steps 5 --contexts 2048 --tokens_per_step 65536 \
    --archs hwh --profile /tmp/prof_$name --profile_top 40 --out $OUT/s_$name.jsonl) > /tmp/o/s_$name.txt 2>&1
  grep -A3 "device per step" /tmp/o/s_$name.txt | head -3; grep -A1 "^size" /tmp/o/s_$name.txt || tail -3 /tmp/o/s_$name.txt
}
step base . 135 ""
step project_many .gpu_variants/pm 135 ""
step softmax_fusion . 135 "--xla_gpu_experimental_enable_triton_softmax_priority_fusion=true"
step no_triton_gemm . 135 "--xla_gpu_enable_triton_gemm=false"
cd /tmp/o && tar czf $OUT/s_logs.tgz s_*.txt
