# session 18, call 3: the 44-sequence 2K step at dc9e812 (head: linear.project and the short
# convolution's dx kernel) against the working tree (norm: session 11's fused residual add +
# RMSNorm Triton kernels brought back, a241db9), one machine; the compiled rms_norm tests.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
NT="--xla_gpu_enable_command_buffer= --xla_gpu_enable_triton_gemm=false"
left() { local l=$((575 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
step() {  # name dir timeout [profile]
  local t=$(left $3); echo "== step $1 $(date +%T) (limit $t s)"; [ $t -gt 40 ] || return
  (cd $2 && PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 XLA_FLAGS="$NT" timeout $t \
    python3 bench/train_step.py --sizes 380m --steps 8 --contexts 2048 --tokens_per_step 90112 \
    --archs hwh ${4:+--profile /tmp/prof_$1 --profile_steps 3 --profile_top 60} \
    --out $OUT/s_$1.jsonl > /tmp/o/s_$1.txt 2>&1)
  grep -A2 "device per step" /tmp/o/s_$1.txt | cut -c1-200
  grep -A1 "^size" /tmp/o/s_$1.txt || tail -3 /tmp/o/s_$1.txt
}
step head .gpu_variants/head 110
step norm . 120 profile
t=$(left 70); echo "== tests (limit $t)"; timeout $t python3 -m pytest -q -x tests/test_rms_norm.py 2>&1 | tail -2
step head2 .gpu_variants/head 100
cd /tmp/o && tar czf $OUT/logs.tgz *.txt
