"""Gated linear attention (the state form of Lightning, RetNet, Mamba-2, GLA, HGRN-2): the
chunked form against the token-by-token recurrence (outputs, final state, gradients of every
input) and both against a brute-force sum over token pairs; prefill then decode steps against
the whole sequence."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels_pallas.decay_attention import (
    decay_attention_chunked,
    decay_attention_recurrent,
    decay_attention_step,
)

B, T, H, K, V = 2, 37, 3, 8, 5


def _inputs(per_key: bool, seed=0):
    r = np.random.default_rng(seed)
    q, k = (jnp.asarray(r.normal(size=(B, T, H, K)), jnp.float32) for _ in range(2))
    v = jnp.asarray(r.normal(size=(B, T, H, V)), jnp.float32)
    shape = (B, T, H, K) if per_key else (B, T, H)
    g = jnp.asarray(-r.uniform(0.0, 1.5, size=shape), jnp.float32)  # strong and weak decay
    h0 = jnp.asarray(r.normal(size=(B, H, K, V)), jnp.float32)
    return q, k, v, g, h0


def _brute(q, k, v, g, h0, scale):
    """o_t = scale * [sum_{s<=t} sum_k q_tk k_sk exp(b_tk - b_sk) v_s + (q_t * exp(b_t)) h0],
    b the cumulative log decay from the first token: every pair at once, no recurrence."""
    gk = g if g.ndim == 4 else jnp.broadcast_to(g[..., None], q.shape)
    b = jnp.cumsum(gk, axis=1)  # [B, T, H, K]
    w = jnp.exp(b[:, :, None] - b[:, None, :])  # [B, t, s, H, K]
    w = jnp.where(jnp.tril(jnp.ones((T, T), bool))[None, :, :, None, None], w, 0.0)
    a = jnp.einsum("bthk,bshk,btshk->bhts", q, k, w)
    o = jnp.einsum("bhts,bshv->bthv", a, v) + jnp.einsum("bthk,bhkv->bthv", q * jnp.exp(b), h0)
    return o * scale


@pytest.mark.parametrize("per_key", [False, True], ids=["scalar_decay", "per_key_decay"])
def test_chunked_equals_recurrent_and_the_pairwise_sum(per_key):
    q, k, v, g, h0 = _inputs(per_key)
    kw = dict(scale=0.3, initial_state=h0, output_final_state=True)
    o_r, s_r = jax.jit(lambda *a: decay_attention_recurrent(*a, **kw))(q, k, v, g)
    o_c, s_c = jax.jit(lambda *a: decay_attention_chunked(*a, chunk_size=16, **kw))(q, k, v, g)
    np.testing.assert_allclose(o_c, o_r, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s_c, s_r, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(o_r, _brute(q, k, v, g, h0, 0.3), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("per_key", [False, True], ids=["scalar_decay", "per_key_decay"])
def test_chunked_gradients_equal_recurrent_gradients(per_key):
    q, k, v, g, h0 = _inputs(per_key, seed=1)
    r = np.random.default_rng(2)
    do = jnp.asarray(r.normal(size=(B, T, H, V)), jnp.float32)
    ds = jnp.asarray(r.normal(size=(B, H, K, V)), jnp.float32)

    def loss(fn):
        def f(q, k, v, g, h0):
            o, s = fn(q, k, v, g, initial_state=h0, output_final_state=True)
            return jnp.sum(o * do) + jnp.sum(s * ds)

        return jax.jit(jax.grad(f, argnums=(0, 1, 2, 3, 4)))

    want = loss(decay_attention_recurrent)(q, k, v, g, h0)
    got = loss(lambda *a, **kw: decay_attention_chunked(*a, chunk_size=8, **kw))(q, k, v, g, h0)
    for name, a, b in zip("q k v g h0".split(), want, got):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4, err_msg=name)


def test_prefill_then_decode_steps_equal_the_whole_sequence():
    q, k, v, g, _ = _inputs(True, seed=3)
    whole, _ = decay_attention_recurrent(q, k, v, g)
    n = 29
    o, state = decay_attention_chunked(
        q[:, :n], k[:, :n], v[:, :n], g[:, :n], chunk_size=16, output_final_state=True
    )
    outs = [o]
    step = jax.jit(decay_attention_step)
    for t in range(n, T):
        o_t, state = step(q[:, t], k[:, t], v[:, t], g[:, t], state)
        outs.append(o_t[:, None])
    np.testing.assert_allclose(jnp.concatenate(outs, axis=1), whole, rtol=1e-5, atol=1e-5)


def test_bf16_inputs_keep_an_fp32_state():
    q, k, v, g, _ = _inputs(False, seed=4)
    ref, _ = decay_attention_recurrent(q, k, v, g)
    o, s = decay_attention_chunked(
        *(a.astype(jnp.bfloat16) for a in (q, k, v)), g, chunk_size=16, output_final_state=True
    )
    assert o.dtype == jnp.bfloat16 and s.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(o, np.float32), ref, atol=0.1, rtol=0.05)


def _kernel_inputs(seed, per_key=False):
    r = np.random.default_rng(seed)
    b, t, h, kd, vd = 1, 40, 2, 16, 16  # T not a multiple of the chunk: padded
    q, k = (jnp.asarray(r.normal(size=(b, t, h, kd)), jnp.float32) for _ in range(2))
    v = jnp.asarray(r.normal(size=(b, t, h, vd)), jnp.float32)
    g = jnp.asarray(
        -r.uniform(
            0.0,
            6.0 if per_key else 1.5,  # per key: e^-6 a step at most
            size=(b, t, h, kd) if per_key else (b, t, h),
        ),
        jnp.float32,
    )
    h0 = jnp.asarray(r.normal(size=(b, h, kd, vd)), jnp.float32)
    do = jnp.asarray(r.normal(size=(b, t, h, vd)), jnp.float32)
    ds = jnp.asarray(r.normal(size=(b, h, kd, vd)), jnp.float32)
    return (q, k, v, g, h0), do, ds


@pytest.mark.parametrize("decay", ["per_head", "per_key"])
@pytest.mark.parametrize("layout", ["triton", "tpu_recompute"])
def test_pallas_kernels_equal_the_chunked_form_with_gradients(layout, decay):
    """``impl="pallas"`` (interpreted: the generic interpreter for the Triton layout, TPU
    semantics for the TPU layout, there with the backward rerunning the forward scan) against
    the chunked jnp form: outputs, final state and the gradients of q, k, v, g and the initial
    state, fp32. A decay per head runs the linear_scan kernels (chunks of 16), a decay per key
    ``pallas_per_key`` (chunks of 32: two sub-chunks of the intra-chunk scores; the Triton
    layout in two value blocks)."""
    from jax.experimental.pallas import tpu as pltpu

    from kernels_pallas.decay_attention import DecaySettings, decay_attention

    interpret = pltpu.InterpretParams() if layout.startswith("tpu") else True
    per_key = decay == "per_key"
    settings = DecaySettings(
        impl="pallas",
        interpret=interpret,
        chunk_size=32 if per_key else 16,
        recompute=layout.endswith("recompute"),
        block_v=8 if per_key and layout == "triton" else None,
    )
    args, do, ds = _kernel_inputs(5, per_key)

    def loss(fn):
        def f(q, k, v, g, h0):
            o, s = fn(q, k, v, g, scale=0.3, initial_state=h0, output_final_state=True)
            return jnp.sum(o * do) + jnp.sum(s * ds), (o, s)

        return jax.jit(jax.grad(f, argnums=(0, 1, 2, 3, 4), has_aux=True))

    want, (o_w, s_w) = loss(lambda *a, **kw: decay_attention_chunked(*a, chunk_size=16, **kw))(
        *args
    )
    got, (o_g, s_g) = loss(lambda *a, **kw: decay_attention(*a, settings=settings, **kw))(*args)
    np.testing.assert_allclose(o_g, o_w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s_g, s_w, rtol=1e-5, atol=1e-5)
    for name, a, b in zip("q k v g h0".split(), want, got):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("decay", ["per_head", "per_key"])
@pytest.mark.parametrize("layout", ["triton", "tpu"])
def test_chunk_parallel_kernels_in_several_column_blocks(layout, decay):
    """The kernels that take one chunk per program (outputs, state gradients, value gradients)
    walk K and V in blocks of ``chunk_block`` columns: at 8 of 16 (two blocks each way, so
    that the first block's extra work and the per-block decays are exercised) the op's values
    and gradients against the chunked jnp form, in both layouts (interpreted)."""
    from kernels_pallas.decay_attention import pallas, pallas_per_key
    from kernels_pallas.linear_scan.common import KernelConfig

    per_key = decay == "per_key"
    C = 32 if per_key else 16
    from jax.experimental.pallas import tpu as pltpu

    cfg = KernelConfig(
        chunk=C,
        layout=layout,
        block_v=16,
        chunk_block=8,
        interpret=pltpu.InterpretParams() if layout == "tpu" else True,
    )
    (q, k, v, g, h0), do, ds = _kernel_inputs(9, per_key)
    q, k, v, g = (
        jnp.pad(x, ((0, 0), (0, 64 - x.shape[1])) + ((0, 0),) * (x.ndim - 2)) for x in (q, k, v, g)
    )  # T a multiple of the chunk
    do = jnp.pad(do, ((0, 0), (0, 64 - do.shape[1]), (0, 0), (0, 0)))
    op = (pallas_per_key if per_key else pallas)._op(cfg, 0.3)
    S0 = jnp.swapaxes(h0, -1, -2) if per_key else h0
    dS = jnp.swapaxes(ds, -1, -2) if per_key else ds

    def loss_got(q, k, v, g, S0):
        o, s = op(q, k, v, g, S0)
        return jnp.sum(o * do) + jnp.sum(s * dS)

    def loss_want(q, k, v, g, S0):
        h = jnp.swapaxes(S0, -1, -2) if per_key else S0
        o, s = decay_attention_chunked(
            q, k, v, g, scale=0.3, chunk_size=16, initial_state=h, output_final_state=True
        )
        return jnp.sum(o * do) + jnp.sum(s * ds)

    got = jax.jit(jax.value_and_grad(loss_got, argnums=range(5)))(q, k, v, g, S0)
    want = jax.jit(jax.value_and_grad(loss_want, argnums=range(5)))(q, k, v, g, S0)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    for name, a, b in zip("q k v g S0".split(), got[1], want[1]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("layout", ["triton", "tpu"])
@pytest.mark.parametrize(
    "decay,factor_range",
    [
        ("strong", None),
        ("mild", None),
        ("steep", None),
        ("mixed", None),
        ("mild", -1.0),
        ("mild", float("inf")),
    ],
)
def test_per_key_intra_chunk_scores_kernels_against_brute_force(
    layout, decay, factor_range, monkeypatch
):
    """``intra_key.intra_scores`` (chunks of 32: two sub-chunks; 32 key columns: two passes of
    the exact kernels' loop over key blocks) against the pairwise sum
    A_ij = sum_k q_ik k_jk exp(G_ik - G_jk) over j <= i, G the chunk-local cumsum of g, and
    ``intra_grads`` against autodiff of that sum w.r.t. q, k and g, added to given state-path
    gradients (dq_s, dk_s, dG_s: dq = (dq_A + dq_s) * scale, dk = dk_A + dk_s, dg = the
    chunk's reverse cumsum of dG_A + dG_s). "strong": a decay of up to e^-12 a step, exponents
    down to -380 within a chunk, where factoring e^{G_i} e^{-G_j} would overflow fp32 (the
    exact kernels); "mild": up to e^-1 (the factored kernels); "steep": e^-3.5 to e^-4.3, a
    sub-chunk's decay ranges up to e^-69 (the factored kernels with factors up to e^69, just
    under ``FACTOR_RANGE``); "mixed": strong and mild in alternate chunks (both kernels in one call, the
    exact one over the factored one's output).
    ``factor_range`` -1 / inf forces every chunk of the mild decay through the exact /
    factored kernels."""
    from jax.experimental.pallas import tpu as pltpu

    from kernels_pallas.decay_attention import DecaySettings, intra_key
    from kernels_pallas.linear_scan.common import (
        chunk_local_cumsum,
        chunked,
        kernel_config,
        reverse_chunk_cumsum,
    )

    if factor_range is not None:
        monkeypatch.setattr(intra_key, "FACTOR_RANGE", factor_range)
    r = np.random.default_rng(11)
    b, t, h, kd, C = 2, 64, 2, 32, 32  # keys in two blocks of 16
    normal = lambda *shape: jnp.asarray(r.normal(size=shape), jnp.float32)
    q, k = normal(b, t, h, kd), normal(b, t, h, kd)
    low, top = {
        "strong": (0.0, 12.0),
        "mild": (0.0, 1.0),
        "steep": (3.5, 4.3),
        "mixed": (0.0, np.where((np.arange(t) // C) % 2, 12.0, 1.0)[None, :, None, None]),
    }[decay]
    g = jnp.asarray(-(low + r.uniform(0, 1, size=(b, t, h, kd)) * (top - low)), jnp.float32)
    G = chunk_local_cumsum(g, C)
    dA, state = normal(b, t, h, C), [normal(b, t, h, kd) for _ in range(3)]
    interpret = pltpu.InterpretParams() if layout == "tpu" else True
    cfg = kernel_config(
        DecaySettings(impl="pallas", interpret=interpret, chunk_size=C), b, h, kd, kd
    )

    def brute(q, k, G):
        qc, kc, Gc = (chunked(x, C) for x in (q, k, G))  # [b, n, h, C, K]
        causal = jnp.tril(jnp.ones((C, C), bool))[..., None]
        w = jnp.exp(jnp.where(causal, Gc[..., :, None, :] - Gc[..., None, :, :], -jnp.inf))
        a = jnp.einsum("bnhik,bnhjk,bnhijk->bnhij", qc, kc, w, precision="highest")
        return a.transpose(0, 1, 3, 2, 4).reshape(b, t, h, C)

    got = intra_key.intra_scores(cfg, q, k, G)
    want, vjp = jax.vjp(brute, q, k, G)
    assert np.isfinite(np.asarray(got)).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    dq, dk, dG = vjp(dA)
    want = ((dq + state[0]) * 0.5, dk + state[1], reverse_chunk_cumsum(dG + state[2], C))
    got = intra_key.intra_grads(cfg, q, k, G, dA, *state, scale=0.5, dtypes=(jnp.float32,) * 3)
    for name, a, w in zip("q k g".split(), got, want):
        assert np.isfinite(np.asarray(a)).all(), name
        np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("decay", [(0.0, 0.3), (2.2, 2.6), (3.5, 4.5)])
def test_per_key_bf16_gradients_under_mild_and_steep_decays(decay):
    """bf16 inputs through the per-key kernels (interpreted) against the fp32 jnp form: every
    gradient within 1% (norm-relative). Under a steep decay (e^-2.2 to e^-4.5 a token: the
    factored kernels, with factors up to e^36) dg is small beside the products it sums: each
    pair of rows enters dG twice (through dq and dk) and cancels in dg, and did not when the
    two copies were rounded apart (dg 14% and 59% off)."""
    from kernels_pallas.decay_attention import DecaySettings, decay_attention

    r = np.random.default_rng(5)
    b, t, h, kd = 1, 128, 2, 32
    q, k, v, do = (jnp.asarray(r.normal(size=(b, t, h, kd)), jnp.float32) for _ in range(4))
    g = jnp.asarray(-r.uniform(*decay, size=(b, t, h, kd)), jnp.float32)
    settings = DecaySettings(impl="pallas", interpret=True, chunk_size=64)

    def loss(q, k, v, g, impl):
        o, _ = (
            decay_attention(q, k, v, g, settings=settings)
            if impl == "pallas"
            else decay_attention_chunked(q, k, v, g, chunk_size=64)
        )
        return jnp.sum(o.astype(jnp.float32) * do)

    bf = tuple(x.astype(jnp.bfloat16) for x in (q, k, v))
    got = jax.grad(loss, argnums=range(4))(*bf, g, "pallas")
    want = jax.grad(loss, argnums=range(4))(*(x.astype(jnp.float32) for x in bf), g, "ref")
    for name, a, w in zip("q k v g".split(), got, want):
        a, w = np.asarray(a, np.float64), np.asarray(w, np.float64)
        err = np.linalg.norm(a - w) / np.linalg.norm(w)
        assert err <= 1e-2, (name, err)


def test_pallas_path_bf16_error_and_its_refusals():
    from kernels_pallas import chosen
    from kernels_pallas.decay_attention import (
        DecaySettings,
        decay_attention,
        decay_attention_pallas,
        decay_attention_per_key_pallas,
    )

    (q, k, v, g, _), _, _ = _kernel_inputs(6)
    settings = DecaySettings(impl="pallas", interpret=True, chunk_size=16)
    want, _ = decay_attention_chunked(q, k, v, g, chunk_size=16)
    o, _ = decay_attention(*(a.astype(jnp.bfloat16) for a in (q, k, v)), g, settings=settings)
    assert o.dtype == jnp.bfloat16
    err = np.abs(np.asarray(o, np.float32) - np.asarray(want)).max()
    assert err <= 1e-2 * np.abs(np.asarray(want)).max(), err
    per_key = jnp.broadcast_to(g[..., None], q.shape)
    with pytest.raises(ValueError, match="decay per head"):
        decay_attention_pallas(q, k, v, per_key, settings=settings)
    with pytest.raises(ValueError, match="decay per key dimension"):
        decay_attention_per_key_pallas(q, k, v, g, settings=settings)
    o_key, _ = decay_attention(q, k, v, per_key, settings=settings)  # the per-key kernels
    np.testing.assert_allclose(o_key, want, rtol=1e-5, atol=1e-5)
    o_key, _ = decay_attention(
        *(a.astype(jnp.bfloat16) for a in (q, k, v)), per_key, settings=settings
    )
    err = np.abs(np.asarray(o_key, np.float32) - np.asarray(want)).max()
    assert o_key.dtype == jnp.bfloat16 and err <= 1e-2 * np.abs(np.asarray(want)).max(), err
    assert chosen()["decay_attention@cpu"] == "pallas"
    assert DecaySettings().choose() == "chunk_reference"  # "auto" on CPU and TPU
    assert DecaySettings(platform="gpu").choose() == "pallas"
    # a key width the Triton kernels do not take: "auto" on a GPU runs the jnp form instead
    o24, _ = decay_attention(
        *(jnp.pad(a, ((0, 0),) * 3 + ((0, 8),)) for a in (q, k)),
        v,
        g,
        settings=DecaySettings(platform="gpu", chunk_size=16),
    )
    assert chosen()["decay_attention@gpu"] == "chunk_reference" and o24.shape == v.shape
    with pytest.raises(ValueError, match="g must be"):
        decay_attention(q, k, v, g[:, :, :1], settings=settings)
    with pytest.raises(ValueError, match="no compiled lowering"):
        decay_attention(q, k, v, g, settings=DecaySettings(impl="pallas"))
    with pytest.raises(ValueError, match="impl="):
        DecaySettings(impl="triton")


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (conftest's CPU devices)")
def test_pallas_per_shard_under_a_mesh():
    """Under ``kernel_mesh`` (what the trainer traces its steps in) both decays' kernels run in a
    shard_map on each device's rows and heads, a per-key g sharded as q: the values and
    gradients of one device."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from hwh_jax.training.sharding import make_mesh
    from kernels_pallas import kernel_mesh
    from kernels_pallas.decay_attention import DecaySettings, decay_attention

    mesh = make_mesh((2, 2, 2))
    settings = DecaySettings(impl="pallas", interpret=True, chunk_size=16)
    r = np.random.default_rng(8)
    q, k, v = (jnp.asarray(r.normal(size=(4, 40, 2, 16)), jnp.float32) for _ in range(3))
    for shape in ((4, 40, 2), (4, 40, 2, 16)):
        g = jnp.asarray(-r.uniform(0.0, 1.5, size=shape), jnp.float32)

        def f(q, k, v, g):
            return jnp.sum(jnp.sin(decay_attention(q, k, v, g, settings=settings)[0]))

        grad = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3)))
        want = grad(q, k, v, g)
        rows = lambda x: jax.device_put(
            x, NamedSharding(mesh, P(("data", "fsdp"), *[None] * (x.ndim - 1)))
        )
        with kernel_mesh(mesh):
            assert "shard_map" in str(jax.make_jaxpr(f)(q, k, v, g))
            got = grad(*(rows(x) for x in (q, k, v, g)))
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
