# session 20, call 3: at the working tree of call 2 (defaults: loss_impl auto, narrow projections
# as one GEMM), HwH against the Transformer at 8K and 32K (380m, 65,536 tokens a step), and the
# decode step and cache at 32K, batch 1, both architectures.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
NT="--xla_gpu_enable_command_buffer= --xla_gpu_enable_triton_gemm=false"
left() { local l=$((530 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
row() {  # name arch context mem-fraction timeout
  local t=$(left $5); echo "== $1 $(date +%T) (limit $t s)"; [ $t -gt 30 ] || return
  XLA_PYTHON_CLIENT_MEM_FRACTION=$4 XLA_FLAGS="$NT" timeout $t python3 bench/train_step.py \
    --sizes 380m --steps 8 --contexts $3 --tokens_per_step 65536 --archs $2 --out $OUT/s_$1.jsonl \
    > /tmp/o/s_$1.txt 2>&1
  grep -A1 "^size" /tmp/o/s_$1.txt || tail -3 /tmp/o/s_$1.txt
}
row hwh_8k hwh 8192 0.95 90
row transformer_8k transformer 8192 0.95 80
row hwh_32k hwh 32768 0.75 100
row transformer_32k transformer 32768 0.75 90
dec() {  # arch timeout
  local t=$(left $2); echo "== decode $1 $(date +%T) (limit $t s)"; [ $t -gt 20 ] || return
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout $t python3 bench/decode.py --size 380m --archs $1 \
    --contexts 32768 --batches 1 --prefill none --decode_reps 5 --out $OUT/d_$1.jsonl > /tmp/o/d_$1.txt 2>&1
  tail -4 /tmp/o/d_$1.txt | cut -c1-200
}
dec hwh 70
dec transformer 70
cd /tmp/o && tar czf $OUT/logs.tgz *.txt
