# planned for the next device session (written in session 14, not run): what holds the short
# convolution's kernels (and the GDN kernels) below the device's rate, from Nsight Compute's
# counters. ncu reads counters only on Firecracker machines (KINDS.md: nvidia-h200-x2 was one
# when recorded; the one-GPU kind has been both), so run this on nvidia-h200-x2 (one GPU used;
# `uname -r` shows -fc- on Firecracker).
# Carry .whl .gpu_data .gpu_scripts. Output: one CSV per op in $OUT, and ncu's stdout tail.
source .gpu_scripts/setup.sh
export XLA_FLAGS=--xla_gpu_enable_command_buffer= CUDA_VISIBLE_DEVICES=0
uname -r; which ncu || ls /opt/nvidia/nsight-compute/*/ncu
NCU=$(which ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
for op in copy conv gdn; do
  echo "== $op $(date +%T)"
  timeout 170 $NCU --clock-control none --target-processes all --launch-skip 0 --launch-count 60 \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --section MemoryWorkloadAnalysis --csv --page details \
    python3 docs/runs/s14/ncu_driver.py $op > $OUT/ncu_$op.csv 2> /tmp/ncu_$op.err
  tail -3 /tmp/ncu_$op.err; wc -l $OUT/ncu_$op.csv
  grep -E '"(Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|DRAM Throughput|Duration)"' $OUT/ncu_$op.csv | cut -d, -f5,13- | head -30
done
