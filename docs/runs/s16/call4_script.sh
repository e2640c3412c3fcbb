# session 16, call 4: HwH-380m against the Transformer at 8K and 32K (issue #8's ratios, last
# measured in session 14) on the code to be shipped (.gpu_variants/cr64: HEAD + the patched
# short convolution at tiles of 64), 65,536 tokens a step, 8 steps a run.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
left() { local l=$((330 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
step() {  # name T arch timeout
  local t=$(left $4); echo "== $1 $(date +%T) (limit $t s)"; [ $t -gt 30 ] || return
  (cd .gpu_variants/cr64 && PYTHONPATH=/tmp/site:$PWD XLA_FLAGS="--xla_gpu_enable_command_buffer=" timeout $t \
    python3 bench/train_step.py --sizes 380m --steps 8 --contexts $2 --tokens_per_step 65536 \
    --archs $3 --out $OUT/s_$1.jsonl) > /tmp/o/s_$1.txt 2>&1
  grep -A1 "^size" /tmp/o/s_$1.txt || tail -3 /tmp/o/s_$1.txt
}
step hwh_8k 8192 hwh 90
step transformer_8k 8192 transformer 70
step hwh_32k 32768 hwh 90
step transformer_32k 32768 transformer 70
cd /tmp/o && tar czf $OUT/logs.tgz *.txt
