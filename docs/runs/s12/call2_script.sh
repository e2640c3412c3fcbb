# session 12 call 2 (nvidia-h200): GDN with the WY inverse on one warp (new default), X in bf16,
# the WY backward writing final dtypes. Compiled tests (details; HEAD 72f52f0's for comparison),
# the GDN layer shape with --check and --breakdown and chunk_warps 2/8, fla's anchor, short-conv
# tiles twice, the HwH-380m 2K step with a profile.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
SH=32,2048,13,64,64
echo "== compiled tests new $(date +%T)"
JAX_PLATFORMS=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gdn_pallas.py -k "compiled" -rf --tb=line > /tmp/o/tests_new.txt 2>&1; grep -E "FAILED|passed|failed|Error|assert" /tmp/o/tests_new.txt | head -20
echo "== compiled tests base $(date +%T)"
(cd .gpu_variants/base && JAX_PLATFORMS=cuda PYTHONPATH=/tmp/site:$PWD timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_gdn_pallas.py -k "compiled and matches" -rf --tb=line > /tmp/o/tests_base.txt 2>&1); grep -E "FAILED|passed|failed" /tmp/o/tests_base.txt | head -8
echo "== gdn $(date +%T)"
timeout 170 python3 bench/gdn.py --shapes $SH --check --breakdown --impls pallas pallas:chunk_warps=2 pallas:chunk_warps=8 pallas:inverse_warps=4 \
  --out $OUT/c2_gdn.jsonl > /tmp/o/gdn.txt 2>&1; tail -8 /tmp/o/gdn.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/fla .gpu_fla/*.whl
echo "== fla $(date +%T)"
PYTHONPATH=/tmp/fla timeout 90 python3 .gpu_fla/fla_gdn_anchor.py $SH > /tmp/o/fla.txt 2>&1; tail -3 /tmp/o/fla.txt
echo "== short conv $(date +%T)"
for rep in 1 2; do
timeout 60 python3 bench/short_conv.py --shapes 32,2048,832,13 --impls pallas pallas:block_t=32 pallas:block_t=16 --out $OUT/c2_conv$rep.jsonl > /tmp/o/conv$rep.txt 2>&1
python3 -c "
import json,sys
for l in open('$OUT/c2_conv$rep.jsonl'):
    r=json.loads(l)
    if 'impl' in r: print(r['impl'], r['normalize'], round(r['fwd_device_ms'],4), round(r['fwd_bwd_device_ms'],4))"
done
echo "== step $(date +%T)"
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 200 python3 bench/train_step.py --sizes 380m --contexts 2048 --steps 5 \
  --tokens_per_step 65536 --archs hwh --profile /tmp/prof --profile_top 60 --out $OUT/c2_step.jsonl > /tmp/o/step.txt 2>&1
grep -A3 "device per step" /tmp/o/step.txt | head -4; grep -A2 "^size" /tmp/o/step.txt || tail -5 /tmp/o/step.txt
cd /tmp/o && tar czf $OUT/c2_logs.tgz *.txt
