# prepared in session 19 (no device time then): the first device call for the one-op loss.
# Carry .whl, .gpu_data, .gpu_scripts (setup.sh = docs/runs/s12/setup.sh); ~8 of 10 minutes.
#  1. the compiled tests of the loss kernel (tests/test_cross_entropy.py runs its "compiled"
#     cases on a GPU, and the model's loss with loss_impl=pallas against unfused);
#  2. bench/head_loss.py at the 2K step's shape: unfused vs head_loss (reference, kernel sweep);
#  3. the 2K step (session 18's settings) with loss_impl auto vs unfused on this machine, the
#     first profiled; the unfused step's compiled program kept (the 22 projection adds).
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
NT="--xla_gpu_enable_command_buffer= --xla_gpu_enable_triton_gemm=false"
left() { local l=$((560 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
echo "== tests $(date +%T)"
timeout $(left 90) python3 -m pytest -q -x tests/test_cross_entropy.py > /tmp/o/tests.txt 2>&1
tail -3 /tmp/o/tests.txt
echo "== head_loss $(date +%T)"
XLA_FLAGS="$NT" timeout $(left 150) python3 bench/head_loss.py --shapes 90112,1024,50304 \
  --impls unfused reference pallas pallas:block_v=2048 pallas:block_v=8192 \
  pallas:num_warps=16 pallas:num_warps=4 pallas:num_stages=2 \
  --out $OUT/head_loss.jsonl > /tmp/o/head_loss.txt 2>&1
grep -A20 "^ *shape" /tmp/o/head_loss.txt || tail -5 /tmp/o/head_loss.txt
step() {  # name timeout override [profile]
  local t=$(left $2); echo "== step $1 $(date +%T) (limit $t s)"; [ $t -gt 40 ] || return
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 XLA_FLAGS="$NT" timeout $t \
    python3 bench/train_step.py --sizes 380m --steps 8 --contexts 2048 --tokens_per_step 90112 \
    --archs hwh --override loss_impl=$3 \
    ${4:+--profile /tmp/prof_$1 --profile_steps 3 --profile_top 80 --hlo /tmp/o/hlo_$1} \
    --out $OUT/s_$1.jsonl > /tmp/o/s_$1.txt 2>&1
  grep -A2 "device per step" /tmp/o/s_$1.txt | cut -c1-200
  grep -A1 "^size" /tmp/o/s_$1.txt || tail -3 /tmp/o/s_$1.txt
}
step fused 130 auto profile
step unfused 110 unfused profile
step fused2 100 auto
cd /tmp/o && tar czf $OUT/logs.tgz *.txt hlo_* 2>/dev/null
