# session 7 call 3: #8 final table: 380m step HwH vs Transformer at 2K (profiled), decode at 32K (profiled), 8K and 32K steps; fused projections off as the A/B if time is left
source .gpu_scripts/setup.sh
T0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - T0) )); }
F="grep -v ^I[0-9]\|^W[0-9]"
J='^{"arch"'
timeout $(left 140) python3 bench/train_step.py --archs hwh transformer --sizes 380m --contexts 2048 \
  --tokens_per_step 32768 --steps 5 --profile /tmp/prof --out $OUT/step2k.jsonl 2>&1 | $F | grep -v "$J" | tail -80
echo "step2k done at $(( $(date +%s) - T0 )) s"
timeout $(left 290) python3 bench/decode.py --archs hwh transformer --size 380m --contexts 32768 --batches 1 \
  --profile /tmp/dprof --out $OUT/decode32k.jsonl 2>&1 | $F | grep -v "$J" | tail -90
echo "decode done at $(( $(date +%s) - T0 )) s"
timeout $(left 500) python3 bench/train_step.py --archs hwh transformer --sizes 380m --contexts 8192 32768 \
  --tokens_per_step 32768 --steps 5 --out $OUT/step8k32k.jsonl 2>&1 | $F | grep -v "$J" | tail -8
echo "step8k32k done at $(( $(date +%s) - T0 )) s"
timeout $(left 580) python3 bench/train_step.py --archs hwh --sizes 380m --contexts 2048 \
  --tokens_per_step 32768 --steps 5 --override fused_projections=False --out $OUT/step2k_unfused.jsonl 2>&1 | $F | grep -v "$J" | tail -4
echo "total $(( $(date +%s) - T0 )) s"
