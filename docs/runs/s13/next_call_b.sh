# planned for the next device session (written in session 13, not run): deliverable 2's prefill
# rows for the two architectures without them beyond 8K (pure GDN, layer-wise 1:3), one-shot as
# Generator prefills, batch 1 and 32 at 32K, batch 1 at 64K. Same carry as next_call_a.sh.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
left() { local l=$((575 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
dec() {  # name timeout args...
  local name=$1 t=$(left $2); shift 2
  echo "== $name $(date +%T) (limit $t s)"
  [ $t -gt 30 ] || return
  timeout $t python3 bench/decode.py --size 380m --prefill_chunk 0 --out $OUT/b_$name.jsonl "$@" > /tmp/o/$name.txt 2>&1
  grep -A3 "^arch" /tmp/o/$name.txt || tail -3 /tmp/o/$name.txt
}
for a in gdn layerwise; do
  dec ${a}_32768 180 --archs $a --contexts 32768 --batches 1 32
  dec ${a}_65536 100 --archs $a --contexts 65536 --batches 1
done
cd /tmp/o && tar czf $OUT/b_logs.tgz *.txt
