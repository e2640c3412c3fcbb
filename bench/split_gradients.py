r"""Does the micro-batch split change a step's gradient? One batch of an experiment config at init,
its gradient accumulated over micro-batches of several sizes, against a reference split.

  python bench/split_gradients.py --config=hwh,512 --micro=64,16,11 --workdir=/tmp/split

``--config`` is a ``configs/experiment.py`` argument (ARCH,L[,cpu]); the batch is the first of
the run's training stream (seed ``--seed``), the reference its gradient over micro-batches of
``--reference`` rows under ``jax.default_matmul_precision("highest")``; each micro-batch's
gradient is weighted by its loss-mask sum, as the train step does. Prints, per split, the loss,
the relative L2 error of the whole gradient against the reference and their cosine
(docs/results.md, "Held-out loss and the micro-batch split").
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
from absl import flags

ROOT = pathlib.Path(__file__).resolve().parents[1]  # local path: the checkout's configs/
sys.path.insert(0, str(ROOT))

from configs import experiment  # noqa: E402 - after the checkout joins sys.path
from hwh_jax.training import sharding as shd  # noqa: E402 - after the checkout joins sys.path
from hwh_jax.training import steps as st  # noqa: E402 - after the checkout joins sys.path
from hwh_jax.training import trainer  # noqa: E402 - after the checkout joins sys.path
from hwh_jax.training.state import init_train_state  # noqa: E402 - after the checkout joins sys.path


def experiment_config(arg: str, seed: int):
    config = experiment.get_config(arg)
    config.unlock()
    config.eval.suites = ()  # no closing evaluation: only the first batch is used
    config.data.workers = 0
    config.seed = seed
    return config


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="hwh,512")
    ap.add_argument("--micro", default="64,16,11", help="micro-batch rows to compare")
    ap.add_argument("--reference", type=int, default=16, help="the reference's micro-batch rows")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", required=True, help="a fresh folder (the run's data binding)")
    args = ap.parse_args()
    flags.FLAGS(["split_gradients"])  # grain reads absl flags
    config = experiment_config(args.config, args.seed)
    ctx = trainer.open_run(config, args.workdir)
    mesh = shd.make_mesh(tuple(config.train.mesh))
    data = trainer.load_data(ctx)
    model = trainer.build_model(ctx, data, mesh)
    params = init_train_state(data.model_cfg, model.optimizer, config.seed)["params"]
    graphdef = model.graphdef
    batch = {k: jnp.asarray(v) for k, v in next(data.train_iter).items()}
    rows = batch["inputs"].shape[0]
    print(
        f"batch {rows} x {batch['inputs'].shape[1]}, loss-mask sum {float(batch['loss_mask'].sum()):.0f}"
    )

    @jax.jit
    def grad_of(p, b):
        loss_fn = lambda p: st.train_loss(graphdef, p, b)
        (_, (loss, n)), g = jax.value_and_grad(loss_fn, has_aux=True)(p)
        return g, loss, n

    def accumulated(micro):
        total, loss_sum, count = None, 0.0, 0.0
        for i in range(0, rows, micro):
            g, loss, n = grad_of(params, {k: v[i : i + micro] for k, v in batch.items()})
            g = jax.tree.map(lambda x: x * n, g)
            total = g if total is None else jax.tree.map(jnp.add, total, g)
            loss_sum, count = loss_sum + loss * n, count + n
        flat = jnp.concatenate([x.ravel().astype(jnp.float32) for x in jax.tree.leaves(total)])
        return flat / count, float(loss_sum / count)

    with jax.default_matmul_precision("highest"):
        ref, ref_loss = accumulated(args.reference)
    print(f"reference (micro {args.reference}, highest precision): loss {ref_loss:.6f}")
    for micro in (int(m) for m in args.micro.split(",")):
        t = time.time()
        g, loss = accumulated(micro)
        rel = float(jnp.linalg.norm(g - ref) / jnp.linalg.norm(ref))
        cos = float(g @ ref / (jnp.linalg.norm(g) * jnp.linalg.norm(ref)))
        print(
            f"micro {micro:3d}: loss {loss:.6f}, relative error {rel:.4f}, cosine {cos:.6f} "
            f"({time.time() - t:.0f} s)"
        )


if __name__ == "__main__":
    main()
