# session 17, call 2: is the ~110-170 ms host pause every ~13 steps (call 1) Python's full
# garbage collection? Each row records every collection while steps run (gc.collections,
# gc.pauses_over_5ms); --gc freeze runs host_gc.freeze() after the warm-up steps, as
# launch.train now does. The shipped step (batch 32) and cuBLAS for every product at 44
# sequences, each with Python's collector as it comes and frozen; then HwH at 8K with cuBLAS
# for every product (call 4 of session 16 read 482.7 ms with Triton GEMMs).
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active \
  --format=csv,noheader -lms 250 > $OUT/smi.csv 2>&1 &
left() { local l=$((570 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
step() {  # name timeout mem-fraction context tokens-per-step gc extra-xla-flags [profile]
  local name=$1 t=$(left $2); echo "== step $name $(date +%T.%N) (limit $t s)"; [ $t -gt 30 ] || return
  XLA_PYTHON_CLIENT_MEM_FRACTION=$3 XLA_FLAGS="--xla_gpu_enable_command_buffer= $7" timeout $t \
    python3 bench/train_step.py --sizes 380m --steps 8 --contexts $4 --tokens_per_step $5 \
    --archs hwh --gc $6 ${8:+--profile /tmp/prof_$name --profile_steps 8 --profile_top 30} \
    --out $OUT/s_$name.jsonl > /tmp/o/s_$name.txt 2>&1
  echo "   done $(date +%T.%N)"
  grep -A3 "device per step" /tmp/o/s_$name.txt | head -4; grep -A3 "longest idle" /tmp/o/s_$name.txt
  grep "^gc (" /tmp/o/s_$name.txt; grep -A1 "^size" /tmp/o/s_$name.txt || tail -3 /tmp/o/s_$name.txt
  python3 -c "import json,sys; r=json.loads(open('$OUT/s_$name.jsonl').readline()); print('runs', r['step_ms_runs'], 'waited', r['waited_ms'], 'pauses', r['gc']['pauses_over_5ms']); [print('calls', c) for c in r['call_ms']]" 2>/dev/null
}
step base 150 0.75 2048 65536 auto ""
step base_freeze 70 0.75 2048 65536 freeze ""
step nt_b44_freeze 150 0.95 2048 90112 freeze "--xla_gpu_enable_triton_gemm=false" profile
step nt_b44 70 0.95 2048 90112 auto "--xla_gpu_enable_triton_gemm=false"
step nt_8k_freeze 110 0.75 8192 65536 freeze "--xla_gpu_enable_triton_gemm=false"
kill %1 2>/dev/null
cd /tmp/o && tar czf $OUT/logs.tgz *.txt
