# session 18, call 1: where the 44-sequence 2K step's time goes now, kernel by kernel with source
# lines (the full list, not the top 20), with its compiled program; the GDN kernels one by one at
# that batch (block_v 64 / 32 / 16: how the sequential scans' waves fall at 44 x 13 programs);
# the short convolution at that batch; then session 17's prepared rows: HwH and the
# Transformer at 32K and the Transformer at 2K with session 17's settings.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
NT="--xla_gpu_enable_command_buffer= --xla_gpu_enable_triton_gemm=false"
left() { local l=$((575 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
echo "== prof $(date +%T)"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 XLA_FLAGS="$NT" timeout $(left 170) python3 bench/train_step.py \
  --sizes 380m --steps 8 --contexts 2048 --tokens_per_step 90112 --archs hwh \
  --profile /tmp/prof --profile_steps 3 --profile_top 600 --hlo $OUT/hlo --out $OUT/s_prof.jsonl \
  > /tmp/o/s_prof.txt 2>&1
head -12 /tmp/o/s_prof.txt | cut -c1-200; grep -A1 "^size" /tmp/o/s_prof.txt
echo "== gdn $(date +%T)"
timeout $(left 100) python3 bench/gdn.py --shapes 44,2048,13,64,64 --impls pallas pallas:block_v=32 \
  pallas:block_v=16 --breakdown --out $OUT/gdn.jsonl > /tmp/o/gdn.txt 2>&1; tail -8 /tmp/o/gdn.txt | cut -c1-400
echo "== conv $(date +%T)"
timeout $(left 60) python3 bench/short_conv.py --shapes 44,2048,832,13 --impls pallas \
  --out $OUT/conv.jsonl > /tmp/o/conv.txt 2>&1; tail -4 /tmp/o/conv.txt
row() {  # name arch context tokens-per-step mem-fraction timeout
  local t=$(left $6); echo "== $1 $(date +%T) (limit $t s)"; [ $t -gt 30 ] || return
  XLA_PYTHON_CLIENT_MEM_FRACTION=$5 XLA_FLAGS="$NT" timeout $t python3 bench/train_step.py \
    --sizes 380m --steps 8 --contexts $3 --tokens_per_step $4 --archs $2 --out $OUT/s_$1.jsonl \
    > /tmp/o/s_$1.txt 2>&1
  grep -A1 "^size" /tmp/o/s_$1.txt || tail -3 /tmp/o/s_$1.txt
}
row hwh_32k hwh 32768 65536 0.75 150
row transformer_32k transformer 32768 65536 0.75 100
row transformer_2k transformer 2048 90112 0.95 80
cd /tmp/o && tar czf $OUT/logs.tgz *.txt
