# session 11 call 1 (nvidia-h200): HwH-380m 2K step at 65,536 tokens, command buffers off, one
# code version after another: HEAD (+ the norms with hand-written backwards) with a
# profile, 4507b76 (session 10's code), fbbb091 (bf16-logits loss only), HEAD with the dot merger
# off, then the Transformer on HEAD.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
S="--sizes 380m --contexts 2048 --steps 5 --tokens_per_step 65536"
NOCB=--xla_gpu_enable_command_buffer=
run() {  # name dir xla_flags args...
  local name=$1 dir=$2 flags=$3; shift 3
  echo "== $name ($dir, XLA_FLAGS=$flags) $(date +%T)"
  (cd $dir && XLA_FLAGS="$flags" PYTHONPATH=/tmp/site:$PWD timeout 170 python3 bench/train_step.py $S \
     --out $OUT/c1_$name.jsonl "$@" > /tmp/o/$name.txt 2>&1)
  grep -A2 "^size" /tmp/o/$name.txt || tail -5 /tmp/o/$name.txt
}
run head . $NOCB --archs hwh --profile /tmp/prof --profile_top 60
run base .gpu_variants/base $NOCB --archs hwh
run ce .gpu_variants/ce $NOCB --archs hwh
run head_nodm . "$NOCB --xla_gpu_dot_merger_threshold_mb=0" --archs hwh
run t_head . $NOCB --archs transformer
cd /tmp/o && tar czf $OUT/c1_logs.tgz *.txt
