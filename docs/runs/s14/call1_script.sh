# session 14 call 1 (nvidia-h200): the GDN layer's q, k, v short convolutions as one group
# kernel (forward and backward) against three calls: compiled tests, the op alone (device ms),
# and HwH-380m's 2K step, working tree (group) against bcc8921 (three calls), both profiled.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
left() { local l=$((575 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
step() {  # name dir timeout args...
  local name=$1 dir=$2 t=$(left $3); shift 3
  echo "== $name $(date +%T) (limit $t s)"
  [ $t -gt 20 ] || return
  (cd $dir && PYTHONPATH=/tmp/site:$PWD XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout $t python3 bench/train_step.py \
    --sizes 380m --steps 5 --contexts 2048 --tokens_per_step 65536 --archs hwh --out $OUT/c1_$name.jsonl "$@") > /tmp/o/$name.txt 2>&1
  grep -A3 "device per step" /tmp/o/$name.txt | head -3; grep -A2 "^size" /tmp/o/$name.txt || tail -4 /tmp/o/$name.txt
}
echo "== tests $(date +%T)"
JAX_PLATFORMS=cuda timeout $(left 90) python3 -m pytest -q -x tests/test_short_conv.py -k compiled > /tmp/o/tests.txt 2>&1; tail -3 /tmp/o/tests.txt
echo "== conv $(date +%T)"
timeout $(left 100) python3 bench/short_conv.py --group --shapes 32,2048,832,13 --impls separate group \
  group:block_t=64 group:block_t=16 group:num_warps=8 group:num_warps=2 --out $OUT/c1_conv.jsonl > /tmp/o/conv.txt 2>&1; tail -8 /tmp/o/conv.txt
step new . 150 --profile /tmp/prof_new --profile_top 80
step base .gpu_variants/base14 150 --profile /tmp/prof_base --profile_top 80
cd /tmp/o && tar czf $OUT/c1_logs.tgz *.txt
