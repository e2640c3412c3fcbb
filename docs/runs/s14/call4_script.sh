# session 14 call 4 (nvidia-h200, call 1's machine): the 380m step at 8K and 32K, HwH and the
# Transformer, one process per row (code = bcc8921's training path), 32,768 tokens per step.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
left() { local l=$((390 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
for c in 8192 32768; do for a in transformer hwh; do
  t=$(left 110); echo "== $a $c $(date +%T) (limit $t s)"; [ $t -gt 30 ] || continue
  timeout $t python3 bench/train_step.py --archs $a --sizes 380m --contexts $c --steps 5 \
    --tokens_per_step 32768 --out $OUT/c4_${a}_$c.jsonl > /tmp/o/${a}_$c.txt 2>&1
  grep -A1 "^size" /tmp/o/${a}_$c.txt || tail -3 /tmp/o/${a}_$c.txt
done; done
cd /tmp/o && tar czf $OUT/c4_logs.tgz *.txt
