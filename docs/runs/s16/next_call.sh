# planned for the next device session (written in session 16, not run). The shipped 2K step
# profiled (session 16's profiled row of it ran out of time), HwH and the Transformer at 32K
# (not re-measured since session 14), and the GDN op alone with the WY backward split in two
# (untimed_wy_bwd_split.patch.txt; offline 163 / 184 registers, not proposed: it adds ~0.2 ms
# of traffic a layer against ~0.4 ms the kernel is above its bytes' time), each also with the
# sequential scans on 32 value columns a program (offline: 168 / 163 registers, 3 programs an SM,
# against 246 / 228 and 2 at the default 64; twice the programs).
# Before the call: .gpu_variants/wys = git archive HEAD + the patch (`patch -p1`).
# Carry .whl .gpu_data .gpu_scripts .gpu_variants.
source .gpu_scripts/setup.sh
source docs/runs/s13/helpers.sh            # left(), and memory fraction 0.95 for the rows below
step() {  # name T arch timeout [profile]
  local t=$(left $4); echo "== $1 $(date +%T) (limit $t s)"; [ $t -gt 30 ] || return
  XLA_FLAGS="--xla_gpu_enable_command_buffer=" timeout $t python3 bench/train_step.py --sizes 380m \
    --steps 8 --contexts $2 --tokens_per_step 65536 --archs $3 \
    ${5:+--profile /tmp/prof_$1 --profile_top 40} --out $OUT/s_$1.jsonl > /tmp/o/s_$1.txt 2>&1
  grep -A2 "device per step" /tmp/o/s_$1.txt | head -3; grep -A1 "^size" /tmp/o/s_$1.txt || tail -3 /tmp/o/s_$1.txt
}
step hwh_2k 2048 hwh 170 profile
step hwh_32k 32768 hwh 150
step transformer_32k 32768 transformer 90
for d in . .gpu_variants/wys; do
  n=$([ $d = . ] && echo base || echo wys); echo "== gdn $n $(date +%T)"
  (cd $d && PYTHONPATH=/tmp/site:$PWD timeout $(left 70) python3 bench/gdn.py \
    --shapes 32,2048,13,64,64 --impls pallas pallas:block_v=32 --check --out $OUT/gdn_$n.jsonl > /tmp/o/gdn_$n.txt 2>&1)
  tail -4 /tmp/o/gdn_$n.txt
done
cd /tmp/o && tar czf $OUT/logs.tgz *.txt
