# session 18, call 4: the working tree (b12ea1b + the query scale folded into q's short
# convolution: qs) in launch.train at 44 sequences (30 steps, progress every 5) and in the step
# bench with its profile; the step bench at b12ea1b (head) on the same machine; the compiled
# short-convolution tests.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
NT="--xla_gpu_enable_command_buffer= --xla_gpu_enable_triton_gemm=false"
left() { local l=$((445 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
echo "== launch.train $(date +%T)"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 XLA_FLAGS="$NT" timeout $(left 150) python3 -m launch.train \
  --config=configs/hwh_380m.py --workdir=/tmp/w --config.train.batch_size=44 \
  --config.train.steps=30 --config.train.log_every=5 --config.train.eval_every=0 \
  --config.train.final_eval=False --config.train.checkpoint_every=0 --config.train.warmup_steps=10 \
  > /tmp/o/train.txt 2>&1
echo "rc $? $(date +%T)"; grep -E "^step +[0-9]+/" /tmp/o/train.txt | cut -c1-220
cp /tmp/w/metrics.jsonl $OUT/train_metrics.jsonl 2>/dev/null
step() {  # name dir timeout [profile]
  local t=$(left $3); echo "== step $1 $(date +%T) (limit $t s)"; [ $t -gt 40 ] || return
  (cd $2 && PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 XLA_FLAGS="$NT" timeout $t \
    python3 bench/train_step.py --sizes 380m --steps 8 --contexts 2048 --tokens_per_step 90112 \
    --archs hwh ${4:+--profile /tmp/prof_$1 --profile_steps 3 --profile_top 60} \
    --out $OUT/s_$1.jsonl > /tmp/o/s_$1.txt 2>&1)
  grep -A2 "device per step" /tmp/o/s_$1.txt | cut -c1-200
  grep -A1 "^size" /tmp/o/s_$1.txt || tail -3 /tmp/o/s_$1.txt
}
step qs . 120 profile
step head .gpu_variants/head 110
t=$(left 40); echo "== tests (limit $t)"; [ $t -gt 15 ] && timeout $t python3 -m pytest -q -x tests/test_short_conv.py 2>&1 | tail -2
cd /tmp/o && tar czf $OUT/logs.tgz *.txt
