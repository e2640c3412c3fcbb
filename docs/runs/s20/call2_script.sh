# session 20, call 2: the working tree (loss_impl default auto, the loss kernel at 4 warps, the
# narrow projections as one GEMM) in launch.train (30 steps at 44 sequences) and in the step
# bench, profiled; 769cd30 (.gpu_variants/base) with --override loss_impl=auto on the same
# machine; the loss kernel's warps/width sweep; the compiled loss tests.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
NT="--xla_gpu_enable_command_buffer= --xla_gpu_enable_triton_gemm=false"
left() { local l=$((540 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
echo "== launch.train $(date +%T)"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 XLA_FLAGS="$NT" timeout $(left 150) python3 -m launch.train \
  --config=configs/hwh_380m.py --workdir=/tmp/w --config.train.batch_size=44 \
  --config.train.steps=30 --config.train.log_every=5 --config.train.eval_every=0 \
  --config.train.final_eval=False --config.train.checkpoint_every=0 --config.train.warmup_steps=10 \
  > /tmp/o/train.txt 2>&1
echo "rc $? $(date +%T)"; grep -E "^step +[0-9]+/" /tmp/o/train.txt | cut -c1-220
cp /tmp/w/metrics.jsonl $OUT/train_metrics.jsonl 2>/dev/null
step() {  # name dir timeout override [profile]
  local t=$(left $3); echo "== step $1 $(date +%T) (limit $t s)"; [ $t -gt 40 ] || return
  (cd $2 && PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 XLA_FLAGS="$NT" timeout $t \
    python3 bench/train_step.py --sizes 380m --steps 8 --contexts 2048 --tokens_per_step 90112 \
    --archs hwh --override loss_impl=$4 \
    ${5:+--profile /tmp/prof_$1 --profile_steps 3 --profile_top 80 --hlo /tmp/o/hlo_$1} \
    --out $OUT/s_$1.jsonl > /tmp/o/s_$1.txt 2>&1)
  grep -A2 "device per step" /tmp/o/s_$1.txt | cut -c1-200
  grep -A1 "^size" /tmp/o/s_$1.txt || tail -3 /tmp/o/s_$1.txt
}
step new . 120 auto profile
step base .gpu_variants/base 100 auto
echo "== head_loss $(date +%T)"
XLA_FLAGS="$NT" timeout $(left 80) python3 bench/head_loss.py --shapes 90112,1024,50304 \
  --impls pallas pallas:num_warps=8 pallas:num_warps=2 pallas:block_v=8192 \
  pallas:block_v=8192,num_warps=8 pallas:block_v=2048,num_warps=2 pallas:num_stages=2 \
  --out $OUT/head_loss.jsonl > /tmp/o/head_loss.txt 2>&1
grep -A20 "^ *shape" /tmp/o/head_loss.txt || tail -5 /tmp/o/head_loss.txt
t=$(left 80); echo "== tests (limit $t)"; [ $t -gt 20 ] && timeout $t python3 -m pytest -q -x tests/test_cross_entropy.py 2>&1 | tail -2
cd /tmp/o && tar czf $OUT/logs.tgz *.txt hlo_* 2>/dev/null
