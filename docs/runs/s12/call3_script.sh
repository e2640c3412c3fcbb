# session 12 call 3 (nvidia-h200), code 211f70d: the forward saving w, QK, S_n and v for the GDN
# backward (recompute=1 is the old path), short-conv tiles of 32. HwH-380m 2K step with a
# profile; 8K HwH and Transformer; the GDN layer shape with --check and --breakdown; 32K HwH;
# the compiled GDN tests; 32K Transformer if time is left. Each part's timeout is cut to what is
# left of 570 s.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
left() { local l=$((570 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
step() {  # name timeout args...
  local name=$1 t=$(left $2); shift 2
  echo "== $name $(date +%T) (limit $t s)"
  [ $t -gt 20 ] || return
  timeout $t python3 bench/train_step.py --sizes 380m --steps 5 --out $OUT/c3_$name.jsonl "$@" > /tmp/o/$name.txt 2>&1
  grep -A3 "device per step" /tmp/o/$name.txt | head -3; grep -A2 "^size" /tmp/o/$name.txt || tail -4 /tmp/o/$name.txt
}
XLA_FLAGS=--xla_gpu_enable_command_buffer= step hwh_2048 190 --contexts 2048 --tokens_per_step 65536 --archs hwh --profile /tmp/prof --profile_top 60
step hwh_8192 130 --contexts 8192 --tokens_per_step 32768 --archs hwh
step transformer_8192 90 --contexts 8192 --tokens_per_step 32768 --archs transformer
echo "== gdn $(date +%T)"
timeout $(left 90) python3 bench/gdn.py --shapes 32,2048,13,64,64 --check --breakdown --impls pallas pallas:recompute=1 \
  --out $OUT/c3_gdn.jsonl > /tmp/o/gdn.txt 2>&1; tail -4 /tmp/o/gdn.txt
step hwh_32768 110 --contexts 32768 --tokens_per_step 32768 --archs hwh
echo "== compiled tests $(date +%T)"
JAX_PLATFORMS=cuda timeout $(left 80) python3 -m pytest -q -p no:cacheprovider tests/test_gdn_pallas.py -k "compiled" -rf --tb=line > /tmp/o/tests.txt 2>&1; grep -E "FAILED|passed|failed" /tmp/o/tests.txt | head -6
step transformer_32768 100 --contexts 32768 --tokens_per_step 32768 --archs transformer
cd /tmp/o && tar czf $OUT/c3_logs.tgz *.txt
