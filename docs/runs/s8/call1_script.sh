# session 8 call 1: short_conv kernel compiled tests + microbench; 380m step at 2K (pallas conv vs reference conv, transformer), then 8K
source .gpu_scripts/setup.sh
T0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - T0) )); }
F="grep -v ^I[0-9]\|^W[0-9]"
python3 -c "import pytest" 2>/dev/null && XLA_FLAGS=--xla_force_host_platform_device_count=1 JAX_PLATFORMS=cuda \
  timeout $(left 110) python3 -m pytest -q -p no:cacheprovider tests/test_short_conv.py -k "compiled or errors or mesh" 2>&1 | tail -6 | tee $OUT/pytest.txt
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout $(left 170) python3 bench/short_conv.py --shapes 16,2048,832,13 16,2048,1024,16 \
  --impls reference pallas pallas:block_t=32 pallas:num_warps=8 --out $OUT/short_conv.jsonl 2>&1 | $F | tail -20
echo "microbench done at $(( $(date +%s) - T0 )) s"
timeout $(left 360) python3 bench/train_step.py --archs hwh transformer --sizes 380m --contexts 2048 \
  --tokens_per_step 32768 --steps 5 --profile /tmp/prof --out $OUT/step2k.jsonl 2>&1 | $F | grep -v '^{"arch"' | tee $OUT/step2k.txt | tail -70
echo "step2k done at $(( $(date +%s) - T0 )) s"
timeout $(left 450) python3 bench/train_step.py --archs hwh --sizes 380m --contexts 2048 \
  --tokens_per_step 32768 --steps 5 --override conv_impl=reference --out $OUT/step2k_refconv.jsonl 2>&1 | $F | tail -3
echo "step2k refconv done at $(( $(date +%s) - T0 )) s"
timeout $(left 585) python3 bench/train_step.py --archs hwh transformer --sizes 380m --contexts 8192 \
  --tokens_per_step 32768 --steps 5 --out $OUT/step8k.jsonl 2>&1 | $F | tail -4
echo "total $(( $(date +%s) - T0 )) s"
