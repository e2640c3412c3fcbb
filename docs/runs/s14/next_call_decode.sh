# planned for the next device session (written in session 14, not run): decode at 32K after
# 8ff1d7e (q, k, v through one convolution window) against bcc8921 (three windows), HwH, batch 1
# and 32, with the decode loop's profile (kernels per token by source), and the Transformer beside
# them. .gpu_variants/base14 = git archive bcc8921. Carry .whl .gpu_data .gpu_scripts .gpu_variants.
source .gpu_scripts/setup.sh
source docs/runs/s13/helpers.sh
cp bench/decode.py .gpu_variants/base14/bench/     # the same timing (median of 3 loops) for both
dec d hwh_new 150 --archs hwh --contexts 32768 --batches 1 32 --prefill none --profile /tmp/prof_new
(cd .gpu_variants/base14 && export PYTHONPATH=/tmp/site:$PWD && dec d hwh_base 150 --archs hwh \
  --contexts 32768 --batches 1 32 --prefill none --profile /tmp/prof_base)
dec d transformer 120 --archs transformer --contexts 32768 --batches 1 32 --prefill none
cd /tmp/o && tar czf $OUT/d_logs.tgz *.txt
