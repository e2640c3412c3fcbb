# session 11 call 3 (nvidia-h200), code d0213b9: the 380m step at 8K and 32K, 32,768 tokens per
# step, XLA defaults (as launch.train and session 8's table), HwH against the Transformer; then
# the GDN kernels at HwH-380m's mean head shape (32, 2048, 13 heads, 64, 64) beside fla's
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
S="--sizes 380m --steps 5 --tokens_per_step 32768"
for c in 8192 32768; do for a in hwh transformer; do
  echo "== $a $c $(date +%T)"
  timeout 170 python3 bench/train_step.py $S --archs $a --contexts $c --out $OUT/c3_${a}_$c.jsonl > /tmp/o/${a}_$c.txt 2>&1
  grep -A2 "^size" /tmp/o/${a}_$c.txt || tail -5 /tmp/o/${a}_$c.txt
done; done
echo "== gdn $(date +%T)"
timeout 100 python3 bench/gdn.py --shapes 32,2048,13,64,64 --impls pallas --out $OUT/c3_gdn.jsonl 2>&1 | tail -6
python3 -m pip install -q --no-index --no-deps --target /tmp/fla .gpu_fla/*.whl
echo "== fla $(date +%T)"
PYTHONPATH=/tmp/fla timeout 120 python3 .gpu_fla/fla_gdn_anchor.py 32,2048,13,64,64 2>&1 | tail -3
cd /tmp/o && tar czf $OUT/c3_logs.tgz *.txt
