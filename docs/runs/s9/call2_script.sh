# session 9 call 2, kind nvidia-h200-x2, one job per GPU (own CPU cores each):
# GPU0: HwH-380m 2K step: this call's baseline, command buffers off (profiled), 65,536 tokens per step; the Transformer at 65,536
# GPU1: short-conv launch settings by device time; the decode table without prefill (4 archs x 2K-64K x batch 1/32)
source .gpu_scripts/setup.sh
T0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - T0) )); }
J='^{"arch"'
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  S="--sizes 380m --contexts 2048 --steps 5"
  timeout $(left 130) taskset -c 0-15 python3 bench/train_step.py --archs hwh $S --tokens_per_step 32768 --out $OUT/g0_hwh2k.jsonl > $OUT/g0_hwh2k.txt 2>&1
  echo "g0 a $(( $(date +%s) - T0 )) s"
  XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout $(left 270) taskset -c 0-15 python3 bench/train_step.py --archs hwh $S --tokens_per_step 32768 \
    --profile /tmp/prof_nocb --profile_top 12 --out $OUT/g0_hwh2k_nocb.jsonl > $OUT/g0_hwh2k_nocb.txt 2>&1
  echo "g0 b $(( $(date +%s) - T0 )) s"
  timeout $(left 420) taskset -c 0-15 python3 bench/train_step.py --archs hwh $S --tokens_per_step 65536 --out $OUT/g0_hwh2k_b32.jsonl > $OUT/g0_hwh2k_b32.txt 2>&1
  echo "g0 c $(( $(date +%s) - T0 )) s"
  timeout $(left 520) taskset -c 0-15 python3 bench/train_step.py --archs transformer $S --tokens_per_step 65536 --out $OUT/g0_t2k_b32.jsonl > $OUT/g0_t2k_b32.txt 2>&1
  echo "g0 done $(( $(date +%s) - T0 )) s"
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  timeout $(left 110) taskset -c 16-31 python3 bench/short_conv.py --shapes 16,2048,832,13 16,2048,1024,16 --impls pallas \
    pallas:block_t=32 pallas:block_t=128 pallas:num_warps=2 pallas:num_warps=8 pallas:block_t=128,num_warps=8 --out $OUT/g1_short_conv.jsonl > $OUT/g1_short_conv.txt 2>&1
  echo "g1 a $(( $(date +%s) - T0 )) s"
  timeout $(left 530) taskset -c 16-31 python3 bench/decode.py --archs hwh transformer gdn layerwise --size 380m --contexts 2048 8192 32768 65536 \
    --batches 1 32 --prefill none --out $OUT/g1_decode.jsonl > $OUT/g1_decode.txt 2>&1
  echo "g1 done $(( $(date +%s) - T0 )) s"
}
gpu0 > $OUT/g0.log 2>&1 &
gpu1 > $OUT/g1.log 2>&1 &
wait
cat $OUT/g0.log $OUT/g1.log
for f in $OUT/g0_*.txt; do echo "== $f"; grep -v "^I[0-9]\|^W[0-9]" $f | grep -v "$J" | tail -32; done
echo "== short_conv"; grep -v "^I[0-9]\|^W[0-9]" $OUT/g1_short_conv.txt | tail -16
echo "== decode"; grep -v "^I[0-9]\|^W[0-9]" $OUT/g1_decode.txt | grep -v "$J" | tail -40
echo "total $(( $(date +%s) - T0 )) s"
