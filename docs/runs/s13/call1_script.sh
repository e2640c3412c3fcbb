# session 13 call 1 (nvidia-h200): step parts alone (SwiGLU stacked + hand-written backward vs
# autodiff vs separate; loss with one-pass vs two-pass log-sum-exp); the fused short-conv dx;
# HwH-380m 2K step: working tree (new), f211b16 (base), new + fuse_dx default; each with a
# profile (kernels keyed by HLO instruction now) and the compiled HLO.
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
echo "== parts $(date +%T)"
timeout $(left 110) python3 bench/step_parts.py --out $OUT/c1_parts.jsonl > /tmp/o/parts.txt 2>&1; grep -v '^{"part' /tmp/o/parts.txt | tail -8
echo "== conv $(date +%T)"
timeout $(left 70) python3 bench/short_conv.py --shapes 32,2048,832,13 --impls pallas pallas:fuse_dx=True \
  --out $OUT/c1_conv.jsonl > /tmp/o/conv.txt 2>&1; tail -6 /tmp/o/conv.txt
step new . 130 --profile /tmp/prof_new --profile_top 80 --hlo $OUT/hlo_new
step base .gpu_variants/base 130 --profile /tmp/prof_base --profile_top 80 --hlo $OUT/hlo_base
step fdx .gpu_variants/fdx 120 --profile /tmp/prof_fdx --profile_top 80
cd /tmp/o && tar czf $OUT/c1_logs.tgz *.txt
