# session 12 call 1 (nvidia-h200): GDN kernels with X stored in bf16, the WY backward writing
# final dtypes, and the diagonal-block inverse solving `inverse_group` rows per step; against
# HEAD 72f52f0 (.gpu_variants/base). Then the short-conv launch settings, then the HwH-380m 2K step.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
SH=32,2048,13,64,64
echo "== compiled tests $(date +%T)"
JAX_PLATFORMS=cuda timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_gdn_pallas.py -k "compiled or group" 2>&1 | tail -3
echo "== gdn new $(date +%T)"
timeout 200 python3 bench/gdn.py --shapes $SH --check --impls pallas pallas:inverse_group=1 pallas:inverse_group=2 \
  pallas:inverse_group=8 pallas:inverse_warps=1 pallas:inverse_warps=2 pallas:inverse_warps=1,inverse_group=1 \
  --out $OUT/c1_gdn_new.jsonl > /tmp/o/gdn_new.txt 2>&1; tail -12 /tmp/o/gdn_new.txt
echo "== gdn base $(date +%T)"
(cd .gpu_variants/base && PYTHONPATH=/tmp/site:$PWD timeout 80 python3 bench/gdn.py --shapes $SH --check --impls pallas \
  --out $OUT/c1_gdn_base.jsonl > /tmp/o/gdn_base.txt 2>&1); tail -3 /tmp/o/gdn_base.txt
echo "== short conv $(date +%T)"
timeout 100 python3 bench/short_conv.py --shapes 32,2048,832,13 --impls pallas pallas:block_t=128 pallas:block_t=256 \
  pallas:num_warps=8 pallas:block_t=128,num_warps=8 pallas:block_t=32 pallas:num_warps=2 --out $OUT/c1_conv.jsonl > /tmp/o/conv.txt 2>&1; tail -16 /tmp/o/conv.txt
echo "== step $(date +%T)"
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 150 python3 bench/train_step.py --sizes 380m --contexts 2048 --steps 5 \
  --tokens_per_step 65536 --archs hwh --out $OUT/c1_step.jsonl > /tmp/o/step.txt 2>&1
grep -A2 "^size" /tmp/o/step.txt || tail -5 /tmp/o/step.txt
cd /tmp/o && tar czf $OUT/c1_logs.tgz *.txt
