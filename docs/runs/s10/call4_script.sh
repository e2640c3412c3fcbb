# session 10 call 4, kind nvidia-h200-x2 (the session's last ~4 device minutes): the 2K step at the filled batch
# (65,536 tokens) with XLA's command buffers off, HwH on GPU 0 and the Transformer on GPU 1 at once
source .gpu_scripts/setup.sh
export XLA_FLAGS=--xla_gpu_enable_command_buffer=
S="--sizes 380m --contexts 2048 --steps 5 --tokens_per_step 65536"
mkdir -p /tmp/o
CUDA_VISIBLE_DEVICES=0 timeout 165 taskset -c 0-15 python3 bench/train_step.py --archs hwh $S --out $OUT/g0_hwh2k_b32_nocb.jsonl > /tmp/o/g0.txt 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout 165 taskset -c 16-31 python3 bench/train_step.py --archs transformer $S --out $OUT/g1_t2k_b32_nocb.jsonl > /tmp/o/g1.txt 2>&1 &
wait
for f in /tmp/o/g*.txt; do grep -A3 "^size" $f; done
