# session 10 call 1, kind nvidia-h200-x2: issue #9 with the activation pins (7a06131/ce69ee3):
# fsdp, data, fsdp_tensor on 2 GPUs + the fsdp checkpoint on the CPU; reference = session 9 call 3's one-GPU run
source .gpu_scripts/setup.sh
nvidia-smi -L
T0=$(date +%s)
timeout 560 python3 bench/mesh_runs.py --devices 2 --config configs/hwh_380m.py --steps 20 --resume_steps 5 \
  --set train.batch_size=16 train.warmup_steps=5 --runs fsdp data fsdp_tensor cpu \
  --reference docs/runs/s9/call3_mesh_x2.jsonl --workdir /tmp/mesh --out $OUT/mesh_x2.jsonl 2>&1 | grep -v "^I[0-9]\|^W[0-9]" | tail -30
echo "mesh_runs took $(( $(date +%s) - T0 )) s"
mkdir -p /tmp/keep; for d in /tmp/mesh/*/; do n=$(basename $d); [ -f $d/metrics.jsonl ] && cp $d/metrics.jsonl /tmp/keep/$n.metrics.jsonl; done
cp /tmp/mesh/*.log /tmp/keep/ 2>/dev/null; tar czf $OUT/mesh_runs.tgz -C /tmp keep
grep -h "initialised\|model hwh\|data: \|Error\|error" /tmp/mesh/runs.log | cut -c1-160 | tail -12
