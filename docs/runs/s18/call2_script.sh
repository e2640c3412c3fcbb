# session 18, call 2: the 44-sequence 2K step at HEAD (base), with linear.project (the mixer's
# input gradient summed new-product-first, so XLA folds every sum into a GEMM: proj), and with
# that and the short convolution's dx as a kernel (working tree: new); the short convolution
# alone base vs new; the compiled short-convolution tests; the GDN op at HEAD vs session 16's
# split WY backward (wys).
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
NT="--xla_gpu_enable_command_buffer= --xla_gpu_enable_triton_gemm=false"
left() { local l=$((575 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
step() {  # name dir timeout [profile]
  local t=$(left $3); echo "== step $1 $(date +%T) (limit $t s)"; [ $t -gt 40 ] || return
  (cd $2 && PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 XLA_FLAGS="$NT" timeout $t \
    python3 bench/train_step.py --sizes 380m --steps 8 --contexts 2048 --tokens_per_step 90112 \
    --archs hwh ${4:+--profile /tmp/prof_$1 --profile_steps 3 --profile_top 40} \
    --out $OUT/s_$1.jsonl > /tmp/o/s_$1.txt 2>&1)
  grep -A2 "device per step" /tmp/o/s_$1.txt | cut -c1-200; grep -c wrapped_add /tmp/o/s_$1.txt
  grep -A1 "^size" /tmp/o/s_$1.txt || tail -3 /tmp/o/s_$1.txt
}
step base .gpu_variants/base 110
step new . 110 profile
step proj .gpu_variants/proj 110
for v in base new; do
  d=$([ $v = new ] && echo . || echo .gpu_variants/base); t=$(left 45); echo "== conv $v"; [ $t -gt 20 ] || break
  (cd $d && PYTHONPATH=/tmp/site:$PWD timeout $t python3 bench/short_conv.py --shapes 44,2048,832,13 \
    --impls pallas --out $OUT/conv_$v.jsonl > /tmp/o/conv_$v.txt 2>&1); tail -3 /tmp/o/conv_$v.txt
done
t=$(left 60); echo "== tests (limit $t)"; timeout $t python3 -m pytest -q -x tests/test_short_conv.py 2>&1 | tail -2
for v in base wys; do
  t=$(left 60); echo "== gdn $v (limit $t)"; [ $t -gt 25 ] || break
  (cd .gpu_variants/$v && PYTHONPATH=/tmp/site:$PWD timeout $t python3 bench/gdn.py \
    --shapes 44,2048,13,64,64 --impls pallas --check --out $OUT/gdn_$v.jsonl > /tmp/o/gdn_$v.txt 2>&1)
  tail -2 /tmp/o/gdn_$v.txt
done
step base2 .gpu_variants/base 100
cd /tmp/o && tar czf $OUT/logs.tgz *.txt
