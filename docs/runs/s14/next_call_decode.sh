# planned for the next device session (written in session 14, not run): HwH's decode at 32K,
# batch 1 and 32 (--prefill none), each profiled (kernels per token by source), three trees:
# bcc8921 (.gpu_variants/base14: three convolution windows per GDN layer), the shipped code
# (8ff1d7e on: one window) and .gpu_variants/dk = git archive HEAD + proposed_decode_kernel.patch.txt
# (`patch -p1`: the GDN heads' whole one-token step as one Pallas kernel, gdn_decode_step; its
# compiled tests run first). The Transformer beside them. Carry .whl .gpu_data .gpu_scripts
# .gpu_variants.
source .gpu_scripts/setup.sh
source docs/runs/s13/helpers.sh
for d in base14 dk; do cp bench/decode.py .gpu_variants/$d/bench/; done  # one timing for all
echo "== dk tests $(date +%T)"
(cd .gpu_variants/dk && PYTHONPATH=/tmp/site:$PWD JAX_PLATFORMS=cuda timeout 120 python3 -m pytest -q \
  tests/test_gdn_decode.py > /tmp/o/dk_tests.txt 2>&1; tail -3 /tmp/o/dk_tests.txt)
dec d hwh_new 120 --archs hwh --contexts 32768 --batches 1 32 --prefill none --profile /tmp/prof_new
for d in base14 dk; do
  (cd .gpu_variants/$d && export PYTHONPATH=/tmp/site:$PWD && dec d hwh_$d 120 --archs hwh \
    --contexts 32768 --batches 1 32 --prefill none --profile /tmp/prof_$d)
done
dec d transformer 100 --archs transformer --contexts 32768 --batches 1 32 --prefill none
cd /tmp/o && tar czf $OUT/d_logs.tgz *.txt
