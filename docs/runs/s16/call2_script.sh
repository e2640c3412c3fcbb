# session 16, call 2: the short convolution with fewer registers (proposed_conv_regs.patch.txt)
# at tiles of 64 (call 1: its op alone 0.421 ms forward+backward against 0.459 at 32 and the
# shipped 0.501), in HwH-380m's 2K step, shipped code beside it; then cuBLAS for every product;
# then batches that fill more of the GPU (40 and 44 x 2048 tokens, XLA_PYTHON_CLIENT_MEM_FRACTION
# 0.95; 32 is the largest power of two under the default 75%); last, the variant's compiled tests.
# .gpu_variants/cr64 = git archive HEAD + the patch, short_conv_pallas's block_t default 64.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
left() { local l=$((575 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
step() {  # name dir timeout tokens extra-xla-flags mem-fraction [profile]
  local name=$1 dir=$2 t=$(left $3); echo "== step $name $(date +%T) (limit $t s)"; [ $t -gt 30 ] || return
  (cd $dir && PYTHONPATH=/tmp/site:$PWD XLA_FLAGS="--xla_gpu_enable_command_buffer= $5" \
    XLA_PYTHON_CLIENT_MEM_FRACTION=$6 timeout $t \
    python3 bench/train_step.py --sizes 380m --steps 8 --contexts 2048 --tokens_per_step $4 \
    --archs hwh ${7:+--profile /tmp/prof_$name --profile_top 30} --out $OUT/s_$name.jsonl) > /tmp/o/s_$name.txt 2>&1
  grep -A2 "device per step" /tmp/o/s_$name.txt | head -3; grep -A1 "^size" /tmp/o/s_$name.txt || tail -3 /tmp/o/s_$name.txt
}
c=.gpu_variants/cr64
step cr64 $c 110 65536 "" 0.75 profile
step base . 100 65536 "" 0.75
step cr64_nt_b40 $c 110 81920 "--xla_gpu_enable_triton_gemm=false" 0.95
step cr64_nt $c 100 65536 "--xla_gpu_enable_triton_gemm=false" 0.75
step cr64_nt_b44 $c 110 90112 "--xla_gpu_enable_triton_gemm=false" 0.95
echo "== compiled tests $(date +%T)"
(cd $c && PYTHONPATH=/tmp/site:$PWD JAX_PLATFORMS=cuda timeout $(left 60) python3 -m pytest -q \
  tests/test_short_conv.py > /tmp/o/cr64_tests.txt 2>&1; tail -1 /tmp/o/cr64_tests.txt)
cd /tmp/o && tar czf $OUT/logs.tgz *.txt
