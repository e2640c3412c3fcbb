# session 8 call 3: 380m gdn / layerwise steps at 2K, 8K (32K if time); decode at 64K batch 1 for the four archs; 32K batch 32 hwh/transformer
source .gpu_scripts/setup.sh
T0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - T0) )); }
F="grep -v ^I[0-9]\|^W[0-9]"
timeout $(left 330) python3 bench/train_step.py --archs gdn layerwise --sizes 380m --contexts 2048 8192 32768 \
  --tokens_per_step 32768 --steps 5 --out $OUT/step_gdn_layerwise.jsonl 2>&1 | $F | grep '^{"arch"' | cut -c1-220
echo "steps done at $(( $(date +%s) - T0 )) s"
timeout $(left 470) python3 bench/decode.py --archs hwh transformer gdn layerwise --size 380m --contexts 65536 --batches 1 \
  --out $OUT/decode64k.jsonl 2>&1 | $F | grep '^{"arch"' | cut -c1-300
echo "decode64k done at $(( $(date +%s) - T0 )) s"
timeout $(left 560) python3 bench/decode.py --archs hwh transformer --size 380m --contexts 32768 --batches 32 \
  --out $OUT/decode32k_b32.jsonl 2>&1 | $F | grep '^{"arch"' | cut -c1-300
echo "total $(( $(date +%s) - T0 )) s"
