# session 17, call 4: why launch.train ran at 146-151k tokens/s in call 3 where the step bench
# reads ~163k (call 2, another machine): the trainer's steps 16-20 traced (train.profile_at),
# then the bench's step at the same settings on this machine.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
NT="--xla_gpu_enable_command_buffer= --xla_gpu_enable_triton_gemm=false"
echo "== launch.train $(date +%T)"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 XLA_FLAGS="$NT" timeout 250 python3 -m launch.train \
  --config=configs/hwh_380m.py --workdir=/tmp/w --config.train.batch_size=44 \
  --config.train.steps=30 --config.train.log_every=5 --config.train.eval_every=0 \
  --config.train.final_eval=False --config.train.checkpoint_every=0 --config.train.warmup_steps=10 \
  --config.train.profile_at=15 --config.train.profile_steps=5 > /tmp/o/train.txt 2>&1
echo "rc $? $(date +%T)"; grep -E "^step +[0-9]+/|froze|^profile of|device per step|matmul [0-9]|kernels per step" /tmp/o/train.txt | cut -c1-220
grep -A6 "longest idle" /tmp/o/train.txt | cut -c1-200
cp /tmp/w/profile/summary.json $OUT/train_profile.json 2>/dev/null
t=$((560 - SECONDS)); echo "== bench $(date +%T) (limit $t s)"
[ $t -gt 60 ] && XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 XLA_FLAGS="$NT" timeout $t python3 bench/train_step.py \
  --sizes 380m --steps 8 --contexts 2048 --tokens_per_step 90112 --archs hwh --gc freeze \
  --out $OUT/s_nt_b44_freeze.jsonl > /tmp/o/s_nt_b44_freeze.txt 2>&1
grep "^gc (" /tmp/o/s_nt_b44_freeze.txt; grep -A1 "^size" /tmp/o/s_nt_b44_freeze.txt || tail -3 /tmp/o/s_nt_b44_freeze.txt
cd /tmp/o && tar czf $OUT/logs.tgz *.txt
