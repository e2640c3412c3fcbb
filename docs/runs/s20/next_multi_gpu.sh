# prepared in session 20 for issue #9, for a session that is lent nvidia-h200-x4 or -x8: two
# device calls of bench/mesh_runs.py (session 10's commands, docs/training.md, at N GPUs and 32
# sequences of 2K a step, 4 a GPU at N = 8). Carry .whl, .gpu_data, .gpu_scripts (setup.sh =
# docs/runs/s20/setup.sh). Run with N=4 or N=8 and A or B as arguments:
#   bash docs/runs/s20/next_multi_gpu.sh 8 A     # one GPU, fsdp on N, its checkpoint resumed on 1
#                                                 # GPU and loaded on the CPU (the probe)
#   bash docs/runs/s20/next_multi_gpu.sh 8 B     # data and fsdp x tensor on N
# The second call needs the first's mesh.jsonl back in the tree: copy the returned file to
# .gpu_scripts/mesh_A.jsonl before it.
N=${1:?N GPUs}; PART=${2:?A or B}
source .gpu_scripts/setup.sh
ARGS="--devices $N --config configs/hwh_380m.py --steps 20 --resume_steps 5 \
  --set train.batch_size=32 train.warmup_steps=5 --workdir /tmp/mesh"
if [ "$PART" = A ]; then
  timeout 560 python3 bench/mesh_runs.py $ARGS --runs one fsdp resumed cpu --out $OUT/mesh_A.jsonl
else
  timeout 560 python3 bench/mesh_runs.py $ARGS --runs data fsdp_tensor \
    --reference .gpu_scripts/mesh_A.jsonl --out $OUT/mesh_B.jsonl
fi
nvidia-smi topo -m > $OUT/topo.txt 2>&1
