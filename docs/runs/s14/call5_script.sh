# session 14 call 5 (nvidia-h200): the short-convolution kernel with its taps loaded where used
# (lazy=True, fewer live registers) against the shipped one, alone; then HwH's one-shot prefill at
# 32K and batch 32 (next_call_a.sh's last row, cut by that call's time).
source .gpu_scripts/setup.sh
source docs/runs/s13/helpers.sh
left() { local l=$((370 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
echo "== conv $(date +%T)"
timeout $(left 110) python3 bench/short_conv.py --shapes 32,2048,832,13 --impls pallas pallas:lazy=True \
  pallas:lazy=True,num_warps=8 pallas:lazy=True,block_t=64 pallas:block_t=16,num_warps=2 \
  --out $OUT/c5_conv.jsonl > /tmp/o/c5_conv.txt 2>&1; tail -12 /tmp/o/c5_conv.txt
dec c5 hwh_32768_b32_once 300 --archs hwh --contexts 32768 --batches 32 --prefill_chunk 0
cd /tmp/o && tar czf $OUT/c5_logs.tgz c5_conv.txt hwh_32768_b32_once.txt
