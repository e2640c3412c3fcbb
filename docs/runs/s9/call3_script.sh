# session 9 call 3, kind nvidia-h200-x2: issue #9 on 2 GPUs again (bench/mesh_runs.py), after call 1's failure:
# cuDNN attention per shard under kernel_mesh; the init's threefry as one kernel (call 1: 168 s before the model line)
source .gpu_scripts/setup.sh
nvidia-smi -L
T0=$(date +%s)
timeout 520 python3 bench/mesh_runs.py --devices 2 --config configs/hwh_380m.py --steps 20 --resume_steps 5 \
  --set train.batch_size=16 train.warmup_steps=5 --workdir /tmp/mesh --out $OUT/mesh_x2.jsonl 2>&1 | grep -v "^I[0-9]\|^W[0-9]" | tail -24
echo "mesh_runs took $(( $(date +%s) - T0 )) s"
mkdir -p /tmp/keep; for d in /tmp/mesh/*/; do n=$(basename $d); [ -f $d/metrics.jsonl ] && cp $d/metrics.jsonl /tmp/keep/$n.metrics.jsonl; [ -f $d/summary.json ] && cp $d/summary.json /tmp/keep/$n.summary.json; done
cp /tmp/mesh/*.log /tmp/keep/ 2>/dev/null; tar czf $OUT/mesh_runs.tgz -C /tmp keep
grep -h "initialised\|model hwh\|data: \|resumed from\|Error\|error" /tmp/mesh/runs.log | cut -c1-160 | tail -20
