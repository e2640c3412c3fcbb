# session 7 call 2: #8 diagnosis: HwH-380m 2K step profile with idle gaps and HLO sources; decode 32K (bf16 matrices) profile; kernel launch variants at K=64
source .gpu_scripts/setup.sh
T0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - T0) )); }
F="grep -v ^I[0-9]\|^W[0-9]"
timeout $(left 130) python3 bench/train_step.py --archs hwh --sizes 380m --contexts 2048 \
  --tokens_per_step 32768 --steps 5 --profile /tmp/prof --out $OUT/step2k_hwh.jsonl 2>&1 | $F | grep -v '^{"arch"' | tail -45
python3 - <<'PY'
import glob, gzip, json
f = sorted(glob.glob('/tmp/prof/**/perfetto_trace.json.gz', recursive=True))[-1]
ev = json.loads(gzip.open(f).read())
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
pids = {e["pid"] for e in ev if e.get("ph") == "M" and str(e.get("args", {}).get("name", "")).startswith("/device:")}
xs = [e for e in ev if e.get("ph") == "X" and e.get("pid") in pids]
print("device events", len(xs)); [print(json.dumps(e)[:400]) for e in xs[1000:1004]]
PY
echo "step done at $(( $(date +%s) - T0 )) s"
timeout $(left 230) python3 bench/decode.py --archs hwh --size 380m --contexts 32768 --batches 1 \
  --profile /tmp/dprof --out $OUT/decode32k_hwh.jsonl 2>&1 | $F | grep -v '^{"arch"' | tail -40
echo "decode done at $(( $(date +%s) - T0 )) s"
timeout $(left 300) python3 bench/gdn.py --shapes 16,2048,13,64,64 --impls pallas pallas:chunk_warps=2 \
  pallas:chunk_warps=8 pallas:num_warps=2 pallas:num_warps=8 --out $OUT/gdn_k64.jsonl 2>&1 | $F | tail -8
echo "total $(( $(date +%s) - T0 )) s"
