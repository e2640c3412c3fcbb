# session 17, call 3: launch.train itself at the settings calls 1-2 measured fastest (HwH-380m,
# 2K, 44 sequences at memory fraction 0.95, cuBLAS for every product; the trainer now freezes
# the collector after its first step), 40 steps on the shipped corpus, its progress lines'
# tokens/s and MFU; then HwH and the Transformer at 8K on one machine with those settings.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
NT="--xla_gpu_enable_command_buffer= --xla_gpu_enable_triton_gemm=false"
echo "== launch.train $(date +%T)"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 XLA_FLAGS="$NT" timeout 260 python3 -m launch.train \
  --config=configs/hwh_380m.py --workdir=/tmp/w --config.train.batch_size=44 \
  --config.train.steps=40 --config.train.log_every=10 --config.train.eval_every=0 \
  --config.train.final_eval=False --config.train.checkpoint_every=0 --config.train.warmup_steps=10 \
  > /tmp/o/train.txt 2>&1
echo "rc $? $(date +%T)"; grep -E "^step +[0-9]+/|froze|model hwh|initialised" /tmp/o/train.txt | cut -c1-220
cp /tmp/w/metrics.jsonl $OUT/train_metrics.jsonl 2>/dev/null
left() { local l=$((570 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
for a in hwh transformer; do
  t=$(left 110); echo "== $a 8k $(date +%T) (limit $t s)"; [ $t -gt 30 ] || break
  XLA_FLAGS="$NT" timeout $t python3 bench/train_step.py --sizes 380m --steps 8 --contexts 8192 \
    --tokens_per_step 65536 --archs $a --gc freeze --out $OUT/s_${a}_8k.jsonl > /tmp/o/s_${a}_8k.txt 2>&1
  grep "^gc (" /tmp/o/s_${a}_8k.txt; grep -A1 "^size" /tmp/o/s_${a}_8k.txt || tail -3 /tmp/o/s_${a}_8k.txt
done
cd /tmp/o && tar czf $OUT/logs.tgz *.txt
