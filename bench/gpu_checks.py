r"""Checks that need an accelerator: the attention fast path against its reference, one
jitted training step of the model, with the kernel choices the dispatchers made, and the
exported PyTorch model's fla path against its pure-PyTorch form (where torch and fla are
installed).

  python bench/gpu_checks.py            # prints JSON lines, ends with a summary table
"""

from __future__ import annotations

import json
import statistics
import time

import jax
import jax.numpy as jnp
import optax
from _bench import attention_inputs, rel_err
from flax import nnx

import kernels_pallas
from hwh_jax.models import HybridLM, model_config
from kernels_pallas.attention import AttentionSettings, attention, attention_reference
from kernels_pallas.attention.op import choose


def attention_checks():
    out = []
    for B, T, H, G, D, w, docs in [
        (2, 1024, 16, 16, 128, None, False),
        (2, 1000, 8, 2, 64, None, False),
        (1, 2048, 8, 4, 128, 256, False),
        (2, 2048, 8, 2, 128, None, True),  # documents apart (segment ids): a packed batch
        (2, 2048, 8, 2, 128, 512, True),
    ]:
        q, k, v, do, seg = attention_inputs(B, T, H, G, D, docs, seed=T)

        def grads(impl, q, k, v, do, seg):  # arguments, not constants: XLA would fold them
            f = lambda q, k, v: attention(
                q, k, v, window=w, segment_ids=seg, settings=AttentionSettings(impl=impl)
            )
            o, vjp = jax.vjp(f, q, k, v)
            return (o, *vjp(do))

        fast = jax.jit(grads, static_argnums=0)("auto", q, k, v, do, seg)
        ref = jax.jit(grads, static_argnums=0)("reference", q, k, v, do, seg)
        q32 = [x.astype(jnp.float32) for x in (q, k, v)]
        exact = jax.jit(
            lambda q, k, v, seg: attention_reference(q, k, v, window=w, segment_ids=seg)
        )(*q32, seg)
        row = {
            "check": "attention",
            "shape": [B, T, H, G, D],
            "window": w,
            "documents": docs,
            "impl": choose(AttentionSettings(), q, window=w, segment_ids=seg),
            "rel_o_fast_vs_fp32": rel_err(fast[0], exact),
            "rel_o_ref_bf16_vs_fp32": rel_err(ref[0], exact),
            **{f"rel_d{n}_fast_vs_ref": rel_err(a, b) for n, a, b in zip("qkv", fast[1:], ref[1:])},
        }
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def exported_fla_checks():
    """The exported PyTorch model's linear heads on a CUDA device: fla's kernels (the path the
    model takes where fla is installed) against the pure-PyTorch chunked form, fp32, outputs
    and final states (a prompt not a multiple of the chunk, a carried initial state)."""
    import torch

    from hwh_jax.hf.modeling import modeling_hwh as m

    if m.fla_ops() is None:
        return [{"check": "exported_fla", "skipped": "fla is not installed"}]
    out = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    B, T, H, K, V = 2, 1000, 4, 64, 64
    for delta in (True, False):
        r = lambda *shape: torch.randn(*shape, device="cuda", generator=gen)
        q, k, v = r(B, T, H, K) * K**-0.5, r(B, T, H, K), r(B, T, H, V)
        if delta:
            k = k / k.norm(dim=-1, keepdim=True)
        g = -torch.nn.functional.softplus(r(B, T, H)) * 0.1
        beta = torch.sigmoid(r(B, T, H)) if delta else None
        s0 = r(B, H, K, V) * 0.1
        o_ref, s_ref = m.chunked(q, k, v, g, s0, 64, beta)
        o_fla, s_fla = m.fla_chunked(q, k, v, g, s0, beta)
        rel = lambda a, b: float((a - b).abs().max() / b.abs().max())
        out.append(
            {
                "check": "exported_fla",
                "op": "chunk_gated_delta_rule" if delta else "chunk_simple_gla",
                "shape": [B, T, H, K, V],
                "out_rel_err": rel(o_fla, o_ref),
                "state_rel_err": rel(s_fla, s_ref),
            }
        )
        print(json.dumps(out[-1]), flush=True)
    return out


def train_step_timing(arch, size, B, T):
    cfg = model_config(arch, size)
    model = HybridLM(cfg, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    tx = optax.adamw(1e-4)
    opt = tx.init(params)
    tok = jax.random.randint(jax.random.key(0), (B, T + 1), 0, cfg.vocab_size)

    @jax.jit
    def step(params, opt, tok):
        def loss(p):
            logits = nnx.merge(graphdef, p)(tok[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, tok[:, 1:]).mean()

        l, g = jax.value_and_grad(loss)(params)
        u, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, u), opt, l

    t0 = time.time()
    params, opt, l = step(params, opt, tok)
    jax.block_until_ready(l)
    compile_s = time.time() - t0
    times = []
    for _ in range(8):
        t = time.perf_counter()
        params, opt, l = step(params, opt, tok)
        jax.block_until_ready(l)
        times.append(time.perf_counter() - t)
    ms = 1e3 * statistics.median(times)
    row = {
        "check": "train_step",
        "arch": arch,
        "size": size,
        "B": B,
        "T": T,
        "loss": float(l),
        "compile_s": compile_s,
        "step_ms": ms,
        "tokens_per_s": B * T / ms * 1e3,
        "kernels": kernels_pallas.chosen(),
    }
    print(json.dumps(row), flush=True)
    return row


def main():
    fla = exported_fla_checks()  # before JAX takes the GPU's memory
    print(json.dumps({"device": jax.devices()[0].device_kind, "jax": jax.__version__}))
    att = attention_checks()
    steps = [train_step_timing(a, "small", 8, 2048) for a in ("transformer", "hwh")]
    print("\nattention fast path vs fp32 reference (bf16 inputs):")
    for r in att:
        print(
            f"  {r['shape']} w={r['window']} docs={r['documents']} impl={r['impl']}: o {r['rel_o_fast_vs_fp32']:.2e}"
            f" (bf16 reference {r['rel_o_ref_bf16_vs_fp32']:.2e}); dq/dk/dv vs reference "
            f"{r['rel_dq_fast_vs_ref']:.1e}/{r['rel_dk_fast_vs_ref']:.1e}/"
            f"{r['rel_dv_fast_vs_ref']:.1e}"
        )
    for r in fla:
        print(f"  exported model, fla against pure PyTorch: {r}")
    for r in steps:
        print(
            f"  train step {r['arch']}-{r['size']} B{r['B']} T{r['T']}: {r['step_ms']:.1f} ms, "
            f"{r['tokens_per_s'] / 1e3:.1f}k tok/s, loss {r['loss']:.3f}"
        )


if __name__ == "__main__":
    main()
