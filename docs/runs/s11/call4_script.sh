# session 11 call 4 (nvidia-h200), code d0213b9: the GDN kernels one by one at HwH-380m's mean
# head shape (bench/gdn.py --breakdown), then prefill + decode rows at 8K for HwH and the
# Transformer, batch 1 and 32 (bench/decode.py with its prefill)
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
echo "== gdn breakdown $(date +%T)"
timeout 150 python3 bench/gdn.py --shapes 32,2048,13,64,64 --impls pallas --breakdown --out $OUT/c4_gdn_breakdown.jsonl > /tmp/o/gdn.txt 2>&1
tail -25 /tmp/o/gdn.txt
echo "== decode $(date +%T)"
timeout 320 python3 bench/decode.py --archs hwh transformer --size 380m --contexts 8192 --batches 1 32 --out $OUT/c4_decode_prefill.jsonl > /tmp/o/decode.txt 2>&1
tail -12 /tmp/o/decode.txt
cd /tmp/o && tar czf $OUT/c4_logs.tgz *.txt
