# planned for the next device session (written in session 12, not run): the fused short-conv
# backward against the default, then HwH-380m's 2K step with XLA's autotune choices dumped (is the
# LM head's forward product on the slow cuBLAS kernel again?) and a profile. Carry .whl .gpu_data
# .gpu_scripts (docs/runs/s10/README.md); if the XLA flag is refused, the step reruns without it.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
timeout 90 python3 bench/short_conv.py --shapes 32,2048,832,13 --impls pallas pallas:fuse_dx=True \
  --out $OUT/a_conv.jsonl > /tmp/o/conv.txt 2>&1; tail -4 /tmp/o/conv.txt
S="--sizes 380m --contexts 2048 --steps 5 --tokens_per_step 65536 --archs hwh --profile /tmp/prof --profile_top 60"
XLA_FLAGS="--xla_gpu_enable_command_buffer= --xla_gpu_dump_autotune_results_to=$OUT/a_autotune.txt" \
  timeout 200 python3 bench/train_step.py $S --out $OUT/a_step.jsonl > /tmp/o/step.txt 2>&1 \
  || XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 200 python3 bench/train_step.py $S \
     --out $OUT/a_step.jsonl > /tmp/o/step.txt 2>&1
grep -A3 "device per step" /tmp/o/step.txt | head -3; grep "Embed.attend" /tmp/o/step.txt | head -3
grep -A2 "^size" /tmp/o/step.txt || tail -5 /tmp/o/step.txt
cd /tmp/o && tar czf $OUT/a_logs.tgz *.txt
