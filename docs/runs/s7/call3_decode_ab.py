"""A/B of the decode step (no prefill: cache at t = context - steps): weights fp32 vs bf16
matrices, ShortConv.extend with / without an optimization barrier on its input."""
import sys, time, json
import jax, jax.numpy as jnp
from flax import nnx
import hwh_jax
from hwh_jax.models import HybridLM, model_config
from hwh_jax.inference import Generator
from hwh_jax.layers import gdn

orig = gdn.ShortConv.extend
def barrier_extend(self, x, state):
    return orig(self, jax.lax.optimization_barrier(x), state)

def cast(state):
    return jax.tree.map(lambda a: a.astype(jnp.bfloat16) if a.ndim >= 2 and a.dtype == jnp.float32 else a, state)

ctx, steps = 32768, 16
for arch, variants in (("hwh", ("fp32", "fp32+barrier", "bf16+barrier")), ("transformer", ("fp32", "bf16"))):
    model = HybridLM(model_config(arch, "380m"), rngs=nnx.Rngs(0))
    for var in variants:
        gdn.ShortConv.extend = barrier_extend if "barrier" in var else orig
        gen = Generator(model)
        state = cast(gen.state) if var.startswith("bf16") else gen.state
        cache = jax.jit(lambda s: nnx.merge(gen.graphdef, s).init_cache(1, ctx))(state)
        cache = {**cache, "t": jnp.int32(ctx - steps)}
        logits = jnp.zeros((1, model.cfg.vocab_size), jnp.float32)
        run = lambda: gen._decode(state, logits, cache, jax.random.key(0), steps=steps, temperature=0.0, top_p=1.0)
        t = time.perf_counter(); jax.block_until_ready(run()); c = time.perf_counter() - t
        ts = []
        for _ in range(3):
            t = time.perf_counter(); jax.block_until_ready(run()); ts.append((time.perf_counter() - t) / steps * 1e3)
        print(json.dumps({"arch": arch, "variant": var, "decode_ms": sorted(ts)[1], "all": ts, "compile_s": c}), flush=True)
        gen._decode = None
    del model
