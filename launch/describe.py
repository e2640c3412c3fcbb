r"""Print a config's parameter count and per-layer FA/LA allocation, without allocating weights.

python -m launch.describe --config=configs/hwh_1b4.py
python -m launch.describe --config=configs/hwh_tiny.py --forward   # plus one jitted forward
python -m launch.describe --table                                  # docs/models.md tables
python -m launch.describe --cache=380m        # decode-cache MiB per arch and context (bf16)
python -m launch.describe --cache=380m --floor=4.8e12 --contexts=32768 --batches=1,32
                                      # plus each decode step's bytes and memory floor
python -m launch.describe --plot=alloc.png --archs=transformer,layerwise,hwh --size=380m
python -m launch.describe --config=configs/hwh_1b4.py --sequence_load=32768:4,1048576:16
                                      # the last shard's causal load on a sequence axis
"""

from absl import flags
from ml_collections import config_flags

from hwh_jax.models.describe import describe, markdown_table
from hwh_jax.models.variants import model_config_from_dict
from launch import run_main

config_flags.DEFINE_config_file("config", "configs/hwh_tiny.py", "run config file")
flags.DEFINE_bool(
    "table",
    False,
    "print the markdown tables of every architecture x size and "
    "of every linear-head kind (parameters, decode cache at 32K)",
)
flags.DEFINE_bool("forward", False, "also run one jitted forward pass on random tokens")
flags.DEFINE_string("cache", "", "size: print the decode-cache table of every architecture")
flags.DEFINE_list("contexts", ["2048", "8192", "32768", "65536"], "contexts of the cache table")
flags.DEFINE_float(
    "floor",
    0.0,
    "bytes/s: with --cache, also each decode step's bytes and its "
    "time at that memory bandwidth (hwh_jax.inference.roofline), per context",
)
flags.DEFINE_list("batches", ["1"], "batches of the --floor table")
flags.DEFINE_string("plot", "", "PNG path: the head allocation of --archs at --size, side by side")
flags.DEFINE_list("archs", ["transformer", "layerwise", "hwh"], "architectures of --plot")
flags.DEFINE_string("size", "380m", "size of --plot")
flags.DEFINE_list(
    "sequence_load",
    [],
    "CONTEXT:SHARDS,...: the causal load of a sequence axis for the config's model "
    "(the last shard's attention and compute over the mean)",
)
FLAGS = flags.FLAGS


def main(argv):
    del argv
    if FLAGS.table:
        from hwh_jax.inference import zoo_table

        print(markdown_table())
        print()
        print(zoo_table())
        return
    if FLAGS.plot:
        from hwh_jax.models.describe import plot_allocation
        from hwh_jax.models.variants import model_config

        plot_allocation({a: model_config(a, FLAGS.size) for a in FLAGS.archs}, FLAGS.plot)
        print(f"wrote {FLAGS.plot}")
        return
    if FLAGS.cache:
        from hwh_jax.inference import cache_table
        from hwh_jax.models.variants import ARCHS, model_config

        configs = {a: model_config(a, FLAGS.cache) for a in ARCHS}
        print(f"decode cache, MiB at batch 1, bf16 KV, fp32 GDN state ({FLAGS.cache}):")
        print(cache_table(configs, [int(c) for c in FLAGS.contexts]))
        if FLAGS.floor:
            from hwh_jax.inference.roofline import floor_table

            for c in FLAGS.contexts:
                print(
                    f"\ndecode step at {int(c):,} tokens: bytes moved and floor at "
                    f"{FLAGS.floor / 1e12:g} TB/s ({FLAGS.cache}):"
                )
                print(floor_table(configs, int(c), [int(b) for b in FLAGS.batches], FLAGS.floor))
        return
    config = FLAGS.config
    cfg = model_config_from_dict(config.model)
    if FLAGS.sequence_load:
        import dataclasses

        from hwh_jax.training.flops import sequence_load

        own = cfg.replace(attention=dataclasses.replace(cfg.attention, balance=False))
        print(
            "| context | sequence shards | attention share of FLOPs | own queries: last shard's "
            "attention | its compute | swapped halves (model.attention.balance): compute |"
        )
        print("|---:|---:|---:|---:|---:|---:|")
        for item in FLAGS.sequence_load:
            try:
                T, n = (int(v) for v in item.split(":"))
            except ValueError:
                raise SystemExit(f"--sequence_load takes CONTEXT:SHARDS, got {item!r}") from None
            r, b = sequence_load(own, T, n), sequence_load(cfg, T, n)
            swapped = f"{b['last_shard_compute']:.3f}x" if b["balanced"] else "not balanced"
            print(
                f"| {T:,} | {n} | {100 * r['attention_share']:.1f}% | "
                f"{r['last_shard_attention']:.2f}x | {r['last_shard_compute']:.3f}x | {swapped} |"
            )
        return
    print(describe(cfg))
    if FLAGS.forward:
        from hwh_jax.models.smoke import forward_once

        print(forward_once(cfg, seq_len=config.seq_len, seed=config.seed))


if __name__ == "__main__":
    run_main(main)
