# session 17, call 1: where the queued 2K step's extra 10-20 ms go (queued steps read 9-21 ms
# longer than steps waited for one at a time on session 16's machines, while the 3 profiled
# steps were busy all but 2.6 ms each). Every row keeps each waited step, each queued run and
# how long each call took the host to return (call_ms); the profiled rows trace 8 queued steps
# (span_ms: first kernel to last); nvidia-smi samples clocks and power all along. Rows: the
# shipped step at memory fractions 0.75 and 0.95 (batch 32), cuBLAS for every product at 44
# and 32 sequences; then the GDN op alone at block_v 64 and 32.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
nproc; lscpu | grep -m1 "Model name"; nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active \
  --format=csv,noheader -lms 250 > $OUT/smi.csv 2>&1 &
left() { local l=$((570 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
step() {  # name timeout mem-fraction tokens-per-step extra-xla-flags [profile]
  local name=$1 t=$(left $2); echo "== step $name $(date +%T.%N) (limit $t s)"; [ $t -gt 30 ] || return
  XLA_PYTHON_CLIENT_MEM_FRACTION=$3 XLA_FLAGS="--xla_gpu_enable_command_buffer= $5" timeout $t \
    python3 bench/train_step.py --sizes 380m --steps 8 --contexts 2048 --tokens_per_step $4 \
    --archs hwh ${6:+--profile /tmp/prof_$name --profile_steps 8 --profile_top 30} \
    --out $OUT/s_$name.jsonl > /tmp/o/s_$name.txt 2>&1
  echo "   done $(date +%T.%N)"
  grep -A3 "device per step" /tmp/o/s_$name.txt | head -4; grep -A6 "longest idle" /tmp/o/s_$name.txt
  grep -A1 "^size" /tmp/o/s_$name.txt || tail -3 /tmp/o/s_$name.txt
  python3 -c "import json,sys; r=json.loads(open('$OUT/s_$name.jsonl').readline()); print('runs', r['step_ms_runs'], 'waited', r['waited_ms']); [print('calls', c) for c in r['call_ms']]" 2>/dev/null
}
step base 150 0.75 65536 "" profile
step base_m95 80 0.95 65536 ""
step nt_b44 150 0.95 90112 "--xla_gpu_enable_triton_gemm=false" profile
step nt 100 0.75 65536 "--xla_gpu_enable_triton_gemm=false"
t=$(left 70); echo "== gdn $(date +%T) (limit $t s)"
[ $t -gt 30 ] && timeout $t python3 bench/gdn.py --shapes 32,2048,13,64,64 --impls pallas pallas:block_v=32 \
  --check --out $OUT/gdn.jsonl > /tmp/o/gdn.txt 2>&1; tail -4 /tmp/o/gdn.txt
kill %1 2>/dev/null
cd /tmp/o && tar czf $OUT/logs.tgz *.txt
