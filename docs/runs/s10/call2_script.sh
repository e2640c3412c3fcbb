# session 10 call 2, kind nvidia-h200-x2, one job per GPU (own CPU cores each); all outputs in one tar
# GPU0: decode table without prefill, 4 archs x 2K-64K x batch 1/32
# GPU1: layerwise-380m 32K row; HwH-380m 2K profile (by source line); small rows hwh+transformer 2K/8K/32K
source .gpu_scripts/setup.sh
T0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - T0) )); }
mkdir -p /tmp/o
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout $(left 570) taskset -c 0-15 python3 bench/decode.py --archs hwh transformer gdn layerwise --size 380m \
    --contexts 2048 8192 32768 65536 --batches 1 32 --prefill none --out /tmp/o/g0_decode.jsonl > /tmp/o/g0_decode.txt 2>&1
  echo "g0 done $(( $(date +%s) - T0 )) s"
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  S="--steps 5"
  timeout $(left 110) taskset -c 16-31 python3 bench/train_step.py --archs layerwise --sizes 380m --contexts 32768 $S \
    --tokens_per_step 32768 --out /tmp/o/g1_lw32k.jsonl > /tmp/o/g1_lw32k.txt 2>&1
  echo "g1 a $(( $(date +%s) - T0 )) s"
  timeout $(left 260) taskset -c 16-31 python3 bench/train_step.py --archs hwh --sizes 380m --contexts 2048 $S \
    --tokens_per_step 32768 --profile /tmp/prof --profile_top 60 --out /tmp/o/g1_hwh2k_prof.jsonl > /tmp/o/g1_hwh2k_prof.txt 2>&1
  echo "g1 b $(( $(date +%s) - T0 )) s"
  timeout $(left 570) taskset -c 16-31 python3 bench/train_step.py --archs transformer hwh --sizes small --contexts 2048 8192 32768 $S \
    --tokens_per_step 131072 --out /tmp/o/g1_small.jsonl > /tmp/o/g1_small.txt 2>&1
  echo "g1 done $(( $(date +%s) - T0 )) s"
}
gpu0 > /tmp/o/g0.log 2>&1 &
gpu1 > /tmp/o/g1.log 2>&1 &
wait
cat /tmp/o/g0.log /tmp/o/g1.log
tar czf $OUT/e2.tgz -C /tmp o
J='^{"arch"'
for f in /tmp/o/g1_*.txt; do echo "== $f"; grep -v "^I[0-9]\|^W[0-9]" $f | grep -v "$J" | tail -20; done
echo "== decode"; grep -v "^I[0-9]\|^W[0-9]" /tmp/o/g0_decode.txt | grep -v "$J" | tail -40
echo "total $(( $(date +%s) - T0 )) s"
