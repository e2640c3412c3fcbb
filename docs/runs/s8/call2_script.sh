# session 8 call 2: short_conv v2 (dz kernel + XLA transpose conv): compiled tests; 380m step 2K profiled; 8K pallas vs reference conv; 32K
source .gpu_scripts/setup.sh
T0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - T0) )); }
F="grep -v ^I[0-9]\|^W[0-9]"
XLA_FLAGS=--xla_force_host_platform_device_count=1 JAX_PLATFORMS=cuda \
  timeout $(left 80) python3 -m pytest -q -p no:cacheprovider tests/test_short_conv.py -k "compiled or errors" 2>&1 | tail -3 | tee $OUT/pytest.txt
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout $(left 170) python3 bench/train_step.py --archs hwh --sizes 380m --contexts 2048 \
  --tokens_per_step 32768 --steps 5 --profile /tmp/prof --out $OUT/step2k.jsonl 2>&1 | $F | grep -v '^{"arch"' | tee $OUT/step2k.txt | head -50
echo "step2k done at $(( $(date +%s) - T0 )) s"
timeout $(left 270) python3 bench/train_step.py --archs hwh --sizes 380m --contexts 8192 \
  --tokens_per_step 32768 --steps 5 --out $OUT/step8k.jsonl 2>&1 | $F | tail -2
echo "step8k done at $(( $(date +%s) - T0 )) s"
timeout $(left 370) python3 bench/train_step.py --archs hwh --sizes 380m --contexts 8192 \
  --tokens_per_step 32768 --steps 5 --override conv_impl=reference --out $OUT/step8k_refconv.jsonl 2>&1 | $F | tail -2
echo "step8k refconv done at $(( $(date +%s) - T0 )) s"
timeout $(left 585) python3 bench/train_step.py --archs hwh transformer --sizes 380m --contexts 32768 \
  --tokens_per_step 32768 --steps 5 --out $OUT/step32k.jsonl 2>&1 | $F | tail -3
echo "total $(( $(date +%s) - T0 )) s"
