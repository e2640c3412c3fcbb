# session 13 call 2 (nvidia-h200): deliverable 2's prefill rows at 32K (then 64K while time is
# left), prefill chunks through cached_attention_blockwise (4aa98dc), HwH and the Transformer,
# batches 1 and 32; rows are written after each one, so a cut run keeps its rows.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
left() { local l=$((575 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
dec() {  # name timeout args...
  local name=$1 t=$(left $2); shift 2
  echo "== $name $(date +%T) (limit $t s)"
  [ $t -gt 30 ] || return
  timeout $t python3 bench/decode.py --size 380m --out $OUT/c2_$name.jsonl "$@" > /tmp/o/$name.txt 2>&1
  grep -A4 "^arch" /tmp/o/$name.txt || tail -4 /tmp/o/$name.txt
}
dec hwh_32768 200 --archs hwh --contexts 32768 --batches 1 32
dec transformer_32768 200 --archs transformer --contexts 32768 --batches 1 32
dec hwh_65536 200 --archs hwh --contexts 65536 --batches 1 32
cd /tmp/o && tar czf $OUT/c2_logs.tgz *.txt
