# planned for the next device session (written in session 13, not run): the one-shot prefill that
# Generator runs (--prefill_chunk 0: the whole prompt as one fresh chunk, FA heads through
# cuDNN's flash attention, 7c8b849) against chunks of 2048 (the first fresh, the rest over the
# cache), HwH and the Transformer at 32K and 64K. Carry .whl .gpu_data .gpu_scripts
# (docs/runs/s10/README.md); rows are written after each one, so a cut run keeps its rows.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
left() { local l=$((575 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
dec() {  # name timeout args...
  local name=$1 t=$(left $2); shift 2
  echo "== $name $(date +%T) (limit $t s)"
  [ $t -gt 30 ] || return
  timeout $t python3 bench/decode.py --size 380m --out $OUT/a_$name.jsonl "$@" > /tmp/o/$name.txt 2>&1
  grep -A3 "^arch" /tmp/o/$name.txt || tail -3 /tmp/o/$name.txt
}
for c in 32768 65536; do
  dec hwh_${c}_once 110 --archs hwh --contexts $c --batches 1 --prefill_chunk 0
  dec transformer_${c}_once 60 --archs transformer --contexts $c --batches 1 --prefill_chunk 0
done
dec hwh_32768_chunks 110 --archs hwh --contexts 32768 --batches 1 --prefill_chunk 2048
dec hwh_32768_b32_once 120 --archs hwh --contexts 32768 --batches 32 --prefill_chunk 0
cd /tmp/o && tar czf $OUT/a_logs.tgz *.txt
