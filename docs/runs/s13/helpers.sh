# sourced by next_call_{a,b}.sh after .gpu_scripts/setup.sh: each part's timeout cut to what is
# left of the call's ~575 s, and bench/decode.py rows to $OUT/<prefix>_<name>.jsonl
mkdir -p /tmp/o
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
left() { local l=$((575 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
dec() {  # prefix name timeout args...
  local prefix=$1 name=$2 t=$(left $3); shift 3
  echo "== $name $(date +%T) (limit $t s)"
  [ $t -gt 30 ] || return
  timeout $t python3 bench/decode.py --size 380m --out $OUT/${prefix}_$name.jsonl "$@" > /tmp/o/$name.txt 2>&1
  grep -A3 "^arch" /tmp/o/$name.txt || tail -3 /tmp/o/$name.txt
}
