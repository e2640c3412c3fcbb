# session 10 call 3, kind nvidia-h200-x2, one job per GPU (own CPU cores each); all outputs in one tar
# decode.py now donates the cache (one copy alive); XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 for the 96-GiB cache
# GPU0: decode rows call 2 lost to OOM (transformer 32K/8K b32, 64K b1; hwh 64K b32), then gdn's grid
# GPU1: decode layerwise grid, then small-size training rows for gdn and layerwise
source .gpu_scripts/setup.sh
T0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - T0) )); }
mkdir -p /tmp/o
D="python3 bench/decode.py --size 380m --prefill none"
gpu0() {
  export CUDA_VISIBLE_DEVICES=0 XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
  timeout $(left 560) taskset -c 0-15 $D --archs transformer --contexts 32768 8192 --batches 32 --out /tmp/o/g0_dec_t32.jsonl > /tmp/o/g0_dec_t32.txt 2>&1
  timeout $(left 560) taskset -c 0-15 $D --archs transformer --contexts 65536 --batches 1 --out /tmp/o/g0_dec_t64.jsonl > /tmp/o/g0_dec_t64.txt 2>&1
  timeout $(left 560) taskset -c 0-15 $D --archs hwh --contexts 65536 --batches 32 --out /tmp/o/g0_dec_h64.jsonl > /tmp/o/g0_dec_h64.txt 2>&1
  echo "g0 a $(( $(date +%s) - T0 )) s"
  timeout $(left 570) taskset -c 0-15 $D --archs gdn --contexts 2048 8192 32768 65536 --batches 1 32 --out /tmp/o/g0_dec_gdn.jsonl > /tmp/o/g0_dec_gdn.txt 2>&1
  echo "g0 done $(( $(date +%s) - T0 )) s"
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout $(left 330) taskset -c 16-31 $D --archs layerwise --contexts 2048 8192 32768 65536 --batches 1 32 --out /tmp/o/g1_dec_lw.jsonl > /tmp/o/g1_dec_lw.txt 2>&1
  echo "g1 a $(( $(date +%s) - T0 )) s"
  timeout $(left 570) taskset -c 16-31 python3 bench/train_step.py --archs gdn layerwise --sizes small --contexts 2048 8192 32768 --steps 5 \
    --tokens_per_step 131072 --out /tmp/o/g1_small.jsonl > /tmp/o/g1_small.txt 2>&1
  echo "g1 done $(( $(date +%s) - T0 )) s"
}
gpu0 > /tmp/o/g0.log 2>&1 &
gpu1 > /tmp/o/g1.log 2>&1 &
wait
cat /tmp/o/g0.log /tmp/o/g1.log
tar czf $OUT/e3.tgz -C /tmp o
for f in /tmp/o/*.txt; do echo "== $f"; grep -v "^I[0-9]\|^W[0-9]\|^E[0-9]\|^{\|^ \|^external" $f | grep -A12 "^arch\|^size" | tail -14; done
echo "total $(( $(date +%s) - T0 )) s"
