r"""Scaling over devices in one command: ``launch.train`` over device meshes of one host, against
one device.

  python bench/mesh_runs.py --devices 8 --config configs/base.py:hwh_380m --steps 20 \
      --set train.batch_size=16 --workdir /tmp/mesh --out $OUT/mesh.jsonl

Each run is ``python -m launch.train`` in its own process that sees only the devices it uses
(``CUDA_VISIBLE_DEVICES`` on GPU; ``--platform cpu`` fakes N CPU devices, for trying the
script out), all at the same global batch and learning-rate schedule (--steps +
--resume_steps steps):
  one         1 device, mesh 1,1,1, --steps + --resume_steps steps: the reference
  fsdp        N devices, mesh 1,N,1, stopped after --steps steps with a checkpoint
  resumed     that checkpoint resumed on 1 device for the --resume_steps steps left (orbax
              reshards onto the one-device mesh)
  data        N devices, mesh N,1,1      } each stopped after --steps steps
  fsdp_tensor N devices, mesh 1,N/2,2    }
  cpu         the fsdp checkpoint loaded on the CPU (``hwh_jax.training.restore.load_run``):
              the loss of one fixed random sequence of --probe_len tokens (computed beside data
              and fsdp_tensor, on a quarter of the host's cores), then the same on one
              accelerator device
in that order, each row written to --out as it finishes (a time limit keeps the finished ones).
All runs share one persistent compilation cache under --workdir. ``--runs`` picks a subset (a
job's time limit may not hold them all); without ``one``, ``--reference`` names an earlier
--out file whose ``one`` row (same config, --steps and --resume_steps) is the reference; it is
copied to this run's --out (with ``reference_file``) and table.
Per run: tokens/s (median over its progress windows of 5 steps after the first, which holds
the compile; the trainer queues steps within a window), MFU, scaling efficiency (tokens/s /
(N x the one-device run's)), and the largest relative difference of its train losses from the
reference's at the same steps. Rows go to stdout as JSON lines and a table, and to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ("one", "fsdp", "resumed", "data", "fsdp_tensor", "cpu")
LOG_EVERY = 5  # a progress window (tokens/s, MFU) every 5 steps; every step's loss is kept

PROBE = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
from hwh_jax.training.restore import load_run
run = load_run(sys.argv[1])
n = int(sys.argv[2])
tok = jnp.asarray(np.random.default_rng(0).integers(0, run.model_cfg.vocab_size, (1, n + 1)),
                  jnp.int32)
logits = run.model(tok[:, :-1]).astype(jnp.float32)
loss = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tok[:, 1:, None], -1))
print(json.dumps({"step": run.step, "backend": jax.default_backend(), "probe_loss": float(loss)}))
"""


def env_for(devices: int, platform: str, cache: Path | None = None) -> dict:
    env = dict(os.environ)
    if cache is not None:  # one persistent compile cache: "resumed" reuses "one"'s executable
        env.setdefault("JAX_COMPILATION_CACHE_DIR", str(cache))
    if platform == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    else:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(devices)))
    return env


def train(name, workdir, config, mesh, steps, devices, platform, sets, log, stop_at=0, cache=None):
    args = [
        sys.executable,
        "-m",
        "launch.train",
        f"--config={config}",
        f"--workdir={workdir}",
        f"--config.train.mesh={mesh}",
        f"--config.train.steps={steps}",
        f"--config.train.stop_at_step={stop_at}",
        f"--config.train.log_every={LOG_EVERY}",
        "--config.train.eval_every=0",
        "--config.train.checkpoint_every=0",
        "--config.eval.at_end=False",
        "--config.train.final_eval=False",
        *(f"--config.{s}" for s in sets),
    ]
    print(f"[{name}] {' '.join(args[1:])}", flush=True)
    with open(log, "a") as f:
        out = subprocess.run(
            args,
            cwd=ROOT,
            env=env_for(devices, platform, cache),
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    if out.returncode:
        raise SystemExit(f"[{name}] launch.train failed (rc {out.returncode}); see {log}")
    rows = [json.loads(l) for l in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in rows if r["split"] == "train"}
    later = [r for r in rows if r["split"] == "perf"][1:]  # the first holds the compile

    def med(key):
        return statistics.median(r[key] for r in later) if later and key in later[0] else None

    return {
        "run": name,
        "mesh": mesh,
        "devices": devices,
        "losses": losses,
        "tokens_per_s": med("tokens_per_s"),
        "mfu": med("mfu"),
    }


def start_probe(workdir, n, devices, platform, log, cores=None):
    """The probe in its own process, started now (``cores``: the CPUs it may use, so that a CPU
    probe beside a GPU run leaves that run's host threads their cores)."""
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    return (
        subprocess.Popen(
            [sys.executable, "-c", PROBE, str(workdir), str(n)],
            cwd=ROOT,
            env=env_for(devices, platform),
            stdout=subprocess.PIPE,
            stderr=open(log, "a"),
            text=True,
            preexec_fn=pin,
        ),
        platform,
        log,
    )


def probe_result(started):
    proc, platform, log = started
    out, _ = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"probe on {platform} failed (rc {proc.returncode}); see {log}")
    return json.loads(out.strip().splitlines()[-1])


def max_rel_diff(losses, ref):
    common = sorted(set(losses) & set(ref))
    return max(abs(losses[s] - ref[s]) / abs(ref[s]) for s in common) if common else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", type=int, required=True, help="N, the devices of the meshes")
    ap.add_argument("--config", default="configs/base.py:hwh_380m")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--resume_steps", type=int, default=5)
    ap.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="FIELD=VALUE",
        help="config overrides for every run, e.g. train.batch_size=16",
    )
    ap.add_argument("--platform", choices=("gpu", "cpu"), default="gpu")
    ap.add_argument("--probe_len", type=int, default=256)
    ap.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS))
    ap.add_argument(
        "--reference",
        default="",
        help="an earlier --out file whose 'one' row stands in for the run 'one'",
    )
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    N = args.devices
    if N < 2 or N % 2:
        ap.error(f"--devices must be an even number >= 2, got {N}")
    runs = set(args.runs)
    if ("one" in runs) == bool(args.reference):
        ap.error(
            "give either the run 'one' or --reference (a file with a 'one' row), not both "
            f"or neither; runs {sorted(runs)}, --reference {args.reference!r}"
        )
    if runs & {"resumed", "cpu"} and "fsdp" not in runs:
        ap.error(f"runs {sorted(runs & {'resumed', 'cpu'})} need the fsdp run's checkpoint")
    base = Path(args.workdir)
    if base.exists():
        shutil.rmtree(base)
    base.mkdir(parents=True)
    log = base / "runs.log"
    common = dict(
        config=args.config, platform=args.platform, sets=args.set, log=log, cache=base / "jax_cache"
    )
    total = args.steps + args.resume_steps
    common.update(steps=total)  # one learning-rate schedule for all; the meshes stop early
    out = open(args.out or os.devnull, "w")

    def finish(row, ref):  # scaling and loss agreement; written at once (time limits)
        row["scaling_efficiency"] = (
            row["tokens_per_s"] / (row["devices"] * ref["tokens_per_s"])
            if row["tokens_per_s"] and ref["tokens_per_s"]
            else None
        )
        row["max_rel_loss_diff"] = max_rel_diff(row["losses"], ref["losses"])
        row["loss_steps"] = [min(row["losses"]), max(row["losses"])]
        out.write(json.dumps(row) + "\n")
        out.flush()
        print(json.dumps({k: v for k, v in row.items() if k != "losses"}), flush=True)
        return row

    # Ordered so that a time limit cuts the least: the checkpoint's path (fsdp, resumed, CPU)
    # before the other two meshes, the accelerator's probe (the CPU's reference) last.
    if "one" in runs:
        ref = train("one", base / "one", mesh="1,1,1", devices=1, **common)
        rows = [finish(ref, ref)]
    else:
        ref = reference_row(args.reference, total)  # written to --out too, marked as read
        rows = [finish({**ref, "reference_file": args.reference}, ref)]
    if "fsdp" in runs:
        rows.append(
            finish(
                train(
                    "fsdp", base / "fsdp", mesh=f"1,{N},1", devices=N, stop_at=args.steps, **common
                ),
                ref,
            )
        )
    if "resumed" in runs:
        shutil.copytree(base / "fsdp", base / "resumed")
        (base / "resumed" / "metrics.jsonl").unlink()
        rows.append(
            finish(train("resumed", base / "resumed", mesh="1,1,1", devices=1, **common), ref)
        )
    # The CPU probe runs beside the remaining meshes, on the last quarter of the host's cores.
    ncpu = os.cpu_count() or 1
    cpu_job = (
        start_probe(
            base / "fsdp",
            args.probe_len,
            1,
            "cpu",
            base / "probe_cpu.log",
            cores=set(range(ncpu - max(ncpu // 4, 1), ncpu))
            if args.platform == "gpu" and ncpu >= 8
            else None,
        )
        if "cpu" in runs
        else None
    )
    for name, mesh in (("data", f"{N},1,1"), ("fsdp_tensor", f"1,{N // 2},2")):
        if name in runs:
            rows.append(
                finish(
                    train(name, base / name, mesh=mesh, devices=N, stop_at=args.steps, **common),
                    ref,
                )
            )
    print_table(rows)
    if cpu_job is None:
        return
    cpu = probe_result(cpu_job)
    print(json.dumps({"probe_cpu": cpu}), flush=True)
    accel = probe_result(start_probe(base / "fsdp", args.probe_len, 1, args.platform, log))
    rows.append(
        {
            "run": "cpu",
            "checkpoint_step": cpu["step"],
            "probe_loss_cpu": cpu["probe_loss"],
            f"probe_loss_{accel['backend']}": accel["probe_loss"],
            "rel_diff": abs(cpu["probe_loss"] - accel["probe_loss"]) / accel["probe_loss"],
        }
    )
    out.write(json.dumps(rows[-1]) + "\n")
    out.close()
    print(json.dumps(rows[-1]), flush=True)
    c = rows[-1]
    print(
        f"checkpoint of step {c['checkpoint_step']} on the CPU: probe loss "
        f"{c['probe_loss_cpu']:.5f} vs {accel['backend']} {accel['probe_loss']:.5f} "
        f"(rel diff {c['rel_diff']:.1e})"
    )


def reference_row(path, total_steps):
    """The 'one' row of an earlier --out file, checked to cover the same steps."""
    rows = [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]
    one = [r for r in rows if r.get("run") == "one"]
    if not one:
        raise SystemExit(f"--reference {path}: no row with run 'one'")
    steps = sorted(int(s) for s in one[0]["losses"])
    if steps[-1] != total_steps:
        raise SystemExit(
            f"--reference {path}: its 'one' run has steps {steps[0]}-{steps[-1]}, "
            f"this schedule {total_steps} (--steps + --resume_steps)"
        )
    return {**one[0], "losses": {int(s): v for s, v in one[0]["losses"].items()}}


def print_table(rows):
    print(
        f"\n{'run':12s} {'mesh':>8s} {'dev':>4s} {'tokens/s':>12s} {'MFU':>6s} "
        f"{'scaling':>8s} {'max rel loss diff':>18s} {'steps':>8s}"
    )
    for r in rows:
        mfu = f"{r['mfu']:.1%}" if r["mfu"] else "n/a"
        diff = f"{r['max_rel_loss_diff']:.2e}" if r["max_rel_loss_diff"] is not None else "n/a"
        tps = f"{r['tokens_per_s']:12,.0f}" if r["tokens_per_s"] else f"{'n/a':>12s}"
        eff = f"{r['scaling_efficiency']:8.2f}" if r["scaling_efficiency"] else f"{'n/a':>8s}"
        print(
            f"{r['run']:12s} {r['mesh']:>8s} {r['devices']:4d} {tps} {mfu:>6s} {eff} "
            f"{diff:>18s} {r['loss_steps'][0]:>3d}-{r['loss_steps'][1]:<4d}"
        )


if __name__ == "__main__":
    main()
