# session 11 call 2 (nvidia-h200): the fused add + RMSNorm Triton kernels: correctness compiled
# on the GPU, then HwH-380m's 2K step at 65,536 tokens with a profile, and the Transformer's
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
JAX_PLATFORMS=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_rms_norm.py -k "compiled or errors or chains" 2>&1 | tail -4
export XLA_FLAGS=--xla_gpu_enable_command_buffer=
S="--sizes 380m --contexts 2048 --steps 5 --tokens_per_step 65536"
timeout 200 python3 bench/train_step.py $S --archs hwh --profile /tmp/prof --profile_top 60 --out $OUT/c2_hwh.jsonl > /tmp/o/hwh.txt 2>&1
grep -B2 -A40 "device per step" /tmp/o/hwh.txt | head -60; grep -A2 "^size" /tmp/o/hwh.txt || tail -20 /tmp/o/hwh.txt
timeout 120 python3 bench/train_step.py $S --archs transformer --out $OUT/c2_t.jsonl > /tmp/o/t.txt 2>&1
grep -A2 "^size" /tmp/o/t.txt || tail -20 /tmp/o/t.txt
cd /tmp/o && tar czf $OUT/c2_logs.tgz *.txt
