# planned for the next device session (written in session 13, not run): the one-shot prefill that
# Generator runs (--prefill_chunk 0: the whole prompt as one fresh chunk, FA heads through
# cuDNN's flash attention, 7c8b849) against chunks of 2048 (the first fresh, the rest over the
# cache), HwH and the Transformer at 32K and 64K. Carry .whl .gpu_data .gpu_scripts
# (docs/runs/s10/README.md); rows are written after each one, so a cut run keeps its rows.
source .gpu_scripts/setup.sh
source docs/runs/s13/helpers.sh
for c in 32768 65536; do
  dec a hwh_${c}_once 110 --archs hwh --contexts $c --batches 1 --prefill_chunk 0
  dec a transformer_${c}_once 60 --archs transformer --contexts $c --batches 1 --prefill_chunk 0
done
dec a hwh_32768_chunks 110 --archs hwh --contexts 32768 --batches 1 --prefill_chunk 2048
dec a hwh_32768_b32_once 120 --archs hwh --contexts 32768 --batches 32 --prefill_chunk 0
cd /tmp/o && tar czf $OUT/a_logs.tgz *.txt
