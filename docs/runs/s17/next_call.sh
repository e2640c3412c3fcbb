# planned for the next device session (written in session 17, not run): HwH and the Transformer
# at 32K with session 17's settings (not re-measured since session 14's 1.748x), the Transformer
# at 2K with them (the 2K ratio in the README is session 15's, XLA's defaults), and the GDN op
# with session 16's split WY backward (.gpu_variants/wys = git archive HEAD +
# docs/runs/s16/untimed_wy_bwd_split.patch.txt, `patch -p1`). Carry .whl .gpu_data .gpu_scripts
# .gpu_variants.
source .gpu_scripts/setup.sh
mkdir -p /tmp/o
NT="--xla_gpu_enable_command_buffer= --xla_gpu_enable_triton_gemm=false"
left() { local l=$((570 - SECONDS)); [ $l -lt $1 ] && echo $l || echo $1; }
row() {  # name arch context tokens-per-step mem-fraction timeout
  local t=$(left $6); echo "== $1 $(date +%T) (limit $t s)"; [ $t -gt 30 ] || return
  XLA_PYTHON_CLIENT_MEM_FRACTION=$5 XLA_FLAGS="$NT" timeout $t python3 bench/train_step.py \
    --sizes 380m --steps 8 --contexts $3 --tokens_per_step $4 --archs $2 --out $OUT/s_$1.jsonl \
    > /tmp/o/s_$1.txt 2>&1
  grep -A1 "^size" /tmp/o/s_$1.txt || tail -3 /tmp/o/s_$1.txt
}
row hwh_32k hwh 32768 65536 0.75 160
row transformer_32k transformer 32768 65536 0.75 100
row transformer_2k transformer 2048 90112 0.95 80
for d in . .gpu_variants/wys; do
  n=$([ $d = . ] && echo base || echo wys); t=$(left 70); echo "== gdn $n (limit $t s)"; [ $t -gt 30 ] || break
  (cd $d && PYTHONPATH=/tmp/site:$PWD timeout $t python3 bench/gdn.py --shapes 32,2048,13,64,64 \
    --impls pallas --check --out $OUT/gdn_$n.jsonl > /tmp/o/gdn_$n.txt 2>&1); tail -3 /tmp/o/gdn_$n.txt
done
cd /tmp/o && tar czf $OUT/logs.tgz *.txt
