# planned for the next device session (written in session 12, not run): deliverable 2's prefill
# rows beyond 8K, with prefill chunks now through cached_attention_blockwise (4aa98dc). Each
# (arch, context) compiles its chunk and decode shapes (~70 s for HwH-380m).
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
for c in 32768 65536; do for a in hwh transformer; do
  timeout 140 python3 bench/decode.py --archs $a --size 380m --contexts $c --batches 1 32 \
    --out $OUT/b_decode_${a}_$c.jsonl > /tmp/o/${a}_$c.txt 2>&1; tail -3 /tmp/o/${a}_$c.txt
done; done
cd /tmp/o && tar czf $OUT/b_logs.tgz *.txt
