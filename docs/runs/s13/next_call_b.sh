# planned for the next device session (written in session 13, not run): deliverable 2's prefill
# rows for the two architectures without them beyond 8K (pure GDN, layer-wise 1:3), one-shot as
# Generator prefills, batch 1 and 32 at 32K, batch 1 at 64K. Same carry as next_call_a.sh.
source .gpu_scripts/setup.sh
source docs/runs/s13/helpers.sh
for a in gdn layerwise; do
  dec b ${a}_32768 180 --prefill_chunk 0 --archs $a --contexts 32768 --batches 1 32
  dec b ${a}_65536 100 --prefill_chunk 0 --archs $a --contexts 65536 --batches 1
done
cd /tmp/o && tar czf $OUT/b_logs.tgz *.txt
