# session 13 call 3 (nvidia-h200): 32K decode and prefill again, every executable run once
# before its timing (call 2's rows timed first runs; decode_first_ms keeps the first loop run),
# prefill chunks visiting only the cache blocks written so far. Batch 1 with the prompt (prefill
# and decode), then batch 32 with --prefill none (decode only), HwH and the Transformer.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
left() { local l=$((575 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
dec() {  # name timeout args...
  local name=$1 t=$(left $2); shift 2
  echo "== $name $(date +%T) (limit $t s)"
  [ $t -gt 30 ] || return
  timeout $t python3 bench/decode.py --size 380m --contexts 32768 --out $OUT/c3_$name.jsonl "$@" > /tmp/o/$name.txt 2>&1
  grep -A3 "^arch" /tmp/o/$name.txt || tail -3 /tmp/o/$name.txt; grep -o '"decode_first_ms": [0-9.]*' /tmp/o/$name.txt
}
dec hwh_b1 170 --archs hwh --batches 1
dec transformer_b1 130 --archs transformer --batches 1
dec hwh_b32_none 120 --archs hwh --batches 32 --prefill none
dec transformer_b32_none 120 --archs transformer --batches 32 --prefill none
cd /tmp/o && tar czf $OUT/c3_logs.tgz *.txt
