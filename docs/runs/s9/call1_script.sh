# session 9 call 1, kind nvidia-h200-x2: issue #9's runs on 2 GPUs (bench/mesh_runs.py), 380m at 16 x 2048 tokens per step
source .gpu_scripts/setup.sh
nvidia-smi -L; nvidia-smi topo -m | head -4
T0=$(date +%s)
timeout 560 python3 bench/mesh_runs.py --devices 2 --config configs/hwh_380m.py --steps 20 --resume_steps 5 \
  --set train.batch_size=16 train.warmup_steps=5 --workdir /tmp/mesh --out $OUT/mesh_x2.jsonl 2>&1 | grep -v "^I[0-9]\|^W[0-9]" | tail -30
echo "mesh_runs took $(( $(date +%s) - T0 )) s"
mkdir -p $OUT/runs; cp /tmp/mesh/runs.log $OUT/ 2>/dev/null
for d in /tmp/mesh/*/; do n=$(basename $d); [ -f $d/metrics.jsonl ] && cp $d/metrics.jsonl $OUT/runs/$n.metrics.jsonl; [ -f $d/summary.json ] && cp $d/summary.json $OUT/runs/$n.summary.json; done
grep -v "^I[0-9]\|^W[0-9]" /tmp/mesh/runs.log | grep -i "error\|step \|Traceback" | tail -40
