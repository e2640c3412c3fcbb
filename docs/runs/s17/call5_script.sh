# session 17, call 5: the embedding gathered in fp32 and cast after (its backward scatter-adds
# in fp32; call 4's trace of launch.train had nnx.Embed's bf16 scatter at 46.4 ms a step):
# launch.train as in call 4 (steps 16-20 traced), then the step bench on Zipf tokens.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
NT="--xla_gpu_enable_command_buffer= --xla_gpu_enable_triton_gemm=false"
echo "== launch.train $(date +%T)"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 XLA_FLAGS="$NT" timeout 200 python3 -m launch.train \
  --config=configs/hwh_380m.py --workdir=/tmp/w --config.train.batch_size=44 \
  --config.train.steps=30 --config.train.log_every=5 --config.train.eval_every=0 \
  --config.train.final_eval=False --config.train.checkpoint_every=0 --config.train.warmup_steps=10 \
  --config.train.profile_at=15 --config.train.profile_steps=5 > /tmp/o/train.txt 2>&1
echo "rc $? $(date +%T)"; grep -E "^step +[0-9]+/|^profile of|device per step|matmul [0-9]|kernels per step" /tmp/o/train.txt | cut -c1-220
cp /tmp/w/profile/summary.json $OUT/train_profile.json 2>/dev/null
t=$((330 - SECONDS)); echo "== bench $(date +%T) (limit $t s)"
[ $t -gt 60 ] && XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 XLA_FLAGS="$NT" timeout $t python3 bench/train_step.py \
  --sizes 380m --steps 8 --contexts 2048 --tokens_per_step 90112 --archs hwh \
  --out $OUT/s_nt_b44_zipf.jsonl > /tmp/o/s_nt_b44_zipf.txt 2>&1
grep "^gc (" /tmp/o/s_nt_b44_zipf.txt; grep -A1 "^size" /tmp/o/s_nt_b44_zipf.txt || tail -3 /tmp/o/s_nt_b44_zipf.txt
cd /tmp/o && tar czf $OUT/logs.tgz *.txt
