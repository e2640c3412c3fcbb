# planned for the next device session (written in session 15, not run): the short convolution
# with fewer registers per thread (proposed_conv_regs.patch.txt: the first tile reads a
# zero-headed copy of its rows instead of shifting them by 0/1 matmuls; the backward's dw reads
# its taps again in a loop), 72 instead of 80 / 167 registers forward / backward with the norm
# (bench/triton_regs.py on a CPU; Nsight Compute read 161 for the shipped backward on the H200,
# 3 programs of 4 warps an SM). Its compiled tests, the op alone against the shipped kernels,
# then HwH-380m's 2K step: shipped, patched, patched with cuBLAS for every product.
# Before the call: .gpu_variants/cr = git archive HEAD + the patch (`patch -p1`); .gpu_variants/cr16
# = cr with short_conv_pallas's block_t default 16 (38 / 54 registers with the norm, offline).
# Carry .whl .gpu_data .gpu_scripts .gpu_variants.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
left() { local l=$((575 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
cr=.gpu_variants/cr
echo "== compiled tests $(date +%T)"
(cd $cr && PYTHONPATH=/tmp/site:$PWD JAX_PLATFORMS=cuda timeout $(left 90) python3 -m pytest -q \
  tests/test_short_conv.py > /tmp/o/cr_tests.txt 2>&1; tail -2 /tmp/o/cr_tests.txt)
for d in . $cr; do
  n=$([ $d = . ] && echo base || echo cr); echo "== conv $n $(date +%T)"
  (cd $d && PYTHONPATH=/tmp/site:$PWD timeout $(left 80) python3 bench/short_conv.py \
    --shapes 32,2048,832,13 --impls pallas pallas:block_t=16 pallas:block_t=64 --out $OUT/conv_$n.jsonl > /tmp/o/conv_$n.txt 2>&1)
  grep -E "pallas" /tmp/o/conv_$n.txt | head -8
done
step() {  # name dir timeout extra-flags [profile]
  local name=$1 dir=$2 t=$(left $3); echo "== step $name $(date +%T) (limit $t s)"; [ $t -gt 20 ] || return
  (cd $dir && PYTHONPATH=/tmp/site:$PWD XLA_FLAGS="--xla_gpu_enable_command_buffer= $4" timeout $t \
    python3 bench/train_step.py --sizes 380m --steps 8 --contexts 2048 --tokens_per_step 65536 \
    --archs hwh ${5:+--profile /tmp/prof_$name --profile_top 30} --out $OUT/s_$name.jsonl) > /tmp/o/s_$name.txt 2>&1
  grep -A2 "device per step" /tmp/o/s_$name.txt | head -3; grep -A1 "^size" /tmp/o/s_$name.txt || tail -3 /tmp/o/s_$name.txt
}
step cr $cr 120 "" profile
step base . 100 ""
step cr16 .gpu_variants/cr16 100 ""
step cr_notriton $cr 100 "--xla_gpu_enable_triton_gemm=false"
cd /tmp/o && tar czf $OUT/logs.tgz *.txt
