# session 7 call 1: #8 profile of the 380m step (new kernels), kernel at the model's shapes, decode at 32K
source .gpu_scripts/setup.sh
T0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - T0) )); }
F="grep -v ^I[0-9]\|^W[0-9]"
timeout $(left 200) python3 bench/train_step.py --archs hwh transformer --sizes 380m --contexts 2048 \
  --tokens_per_step 32768 --steps 5 --profile /tmp/prof --out $OUT/step2k.jsonl 2>&1 | $F | tail -60
echo "step2k done at $(( $(date +%s) - T0 )) s"
timeout $(left 290) python3 bench/gdn.py --shapes 16,2048,13,64,64 16,2048,16,64,64 --impls pallas chunk_reference \
  --breakdown --out $OUT/gdn_model.jsonl 2>&1 | $F | tail -14
echo "gdn done at $(( $(date +%s) - T0 )) s"
timeout $(left 440) python3 bench/decode.py --archs hwh transformer --size 380m --contexts 32768 --batches 1 \
  --profile /tmp/dprof --out $OUT/decode32k.jsonl 2>&1 | $F | tail -40
echo "decode done at $(( $(date +%s) - T0 )) s"
timeout $(left 585) python3 bench/train_step.py --archs hwh transformer --sizes 380m --contexts 8192 \
  --tokens_per_step 32768 --steps 5 --out $OUT/step8k.jsonl 2>&1 | $F | tail -12
echo "total $(( $(date +%s) - T0 )) s"
