"""Pallas GDN (impl="pallas") against the recurrent spec: outputs, final state, every gradient.

On CPU the kernels run in interpret mode, with the generic interpreter (the GPU layout: one
program per (batch, head, value block) walking its chunks) and with TPU semantics
(``pltpu.InterpretParams``: the chunk axis of the grid "arbitrary", state in VMEM scratch). On a
GPU or TPU backend (``JAX_PLATFORMS=cuda pytest tests/kernels/test_gdn_pallas.py``) the compiled kernel
is checked too.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from test_gdn_reference import make_inputs

from kernels_pallas.gdn import GDNSettings, gated_delta_rule, gated_delta_rule_pallas

MODES = {"generic": True, "tpu": pltpu.InterpretParams()}
if jax.default_backend() in ("gpu", "tpu"):
    MODES["compiled"] = False

# (B, T, H, K, V, chunk): T not a multiple of the chunk, K != V both ways, one K=256/V=512
# (several 64-column blocks), K=80 (16-column blocks); the chunk's inverse from 1 block of 16,
# 3 blocks of 8 (chunk 24) and 4 blocks of 16 (chunk 64).
SHAPES = [
    (2, 75, 2, 16, 32, 16),
    (1, 100, 3, 80, 16, 24),
    (1, 130, 1, 16, 32, 64),
    (1, 40, 1, 256, 512, 16),
]
IDS = [f"B{b}-T{t}-H{h}-K{k}-V{v}-C{c}" for b, t, h, k, v, c in SHAPES]
# fp32 both sides; the chunked form reorders sums, dk/dg/dbeta go through the inverse.
TOL = {
    "o": 2e-5,
    "state": 2e-5,
    "dq": 2e-5,
    "dk": 5e-5,
    "dv": 2e-5,
    "dg": 5e-5,
    "dbeta": 5e-5,
    "dh0": 2e-5,
}


def rel(a, b):
    """Relative L2 error in float64 (gradients through e^-60 decays are ~1e-27)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


@functools.partial(jax.jit, static_argnums=(0, 1, 9))
def run(impl, mode, q, k, v, g, beta, h0, do, chunk):
    def loss(q, k, v, g, beta, h0):
        if impl == "pallas" and mode == "compiled":
            # fp32 inputs against fp32 tolerances: the WY backward's TF32 products (the GPU
            # default, for bf16 training; bench/gdn.py --check measures them) off.
            o, s = gated_delta_rule_pallas(
                q,
                k,
                v,
                g,
                beta,
                initial_state=h0,
                output_final_state=True,
                settings=GDNSettings(chunk_size=chunk, fp32_dots="ieee"),
            )
        else:
            interpret = MODES[mode] if impl == "pallas" else False
            o, s = gated_delta_rule(
                q,
                k,
                v,
                g,
                beta,
                initial_state=h0,
                output_final_state=True,
                settings=GDNSettings(impl=impl, chunk_size=chunk, interpret=interpret),
            )
        return jnp.sum(o.astype(jnp.float32) * do) + jnp.sum(s * s) * 0.1, (o, s)

    grads, (o, s) = jax.grad(loss, argnums=tuple(range(6)), has_aux=True)(q, k, v, g, beta, h0)
    return dict(o=o, state=s, **dict(zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), grads)))


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
@pytest.mark.parametrize("mode", list(MODES))
def test_pallas_matches_recurrent(shape, mode):
    B, T, H, K, V, C = shape
    q, k, v, g, beta, h0, do = make_inputs(B, T, H, K, V)
    if mode == "compiled" and any(n & (n - 1) or n < 16 for n in (K, C)):
        # shapes the GPU kernels refuse: the error must say which value and why
        with pytest.raises(ValueError, match=r"on GPU needs \w+ a power of two >= 16, got "):
            run("pallas", mode, q, k, v, g, beta, h0, do, C)
        return
    ref = run("recurrent", "generic", q, k, v, g, beta, h0, do, C)
    out = run("pallas", mode, q, k, v, g, beta, h0, do, C)
    for name, tol in TOL.items():
        assert rel(out[name], ref[name]) < tol, (name, rel(out[name], ref[name]))


@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[3]], ids=[IDS[0], IDS[3]])
@pytest.mark.parametrize("mode", list(MODES))
def test_without_decay_matches_recurrent_at_g_zero(shape, mode):
    """g None (DeltaNet): the kernels run without G (no exponentials, no dG) and equal the
    recurrent form at g = 0 in outputs, final state and the gradients of q, k, v, beta and the
    initial state; in several 64-column blocks too (K = 256, V = 512)."""
    B, T, H, K, V, C = shape  # both shapes ones the GPU kernels take
    q, k, v, _, beta, h0, do = make_inputs(B, T, H, K, V, seed=4)
    interpret = MODES[mode]
    outs = []
    # compiled: the WY backward's fp32 products at IEEE precision, as in ``run``
    dots = "ieee" if mode == "compiled" else "tf32"
    for impl, g in (("pallas", None), ("recurrent", jnp.zeros(beta.shape))):

        def loss(q, k, v, beta, h0, impl=impl, g=g):
            o, s = gated_delta_rule(
                q,
                k,
                v,
                g,
                beta,
                initial_state=h0,
                output_final_state=True,
                settings=GDNSettings(impl=impl, chunk_size=C, interpret=interpret, fp32_dots=dots),
            )
            return jnp.sum(o * do) + jnp.sum(s * s) * 0.1, (o, s)

        grads, (o, s) = jax.jit(jax.grad(loss, argnums=tuple(range(5)), has_aux=True))(
            q, k, v, beta, h0
        )
        outs.append((o, s) + grads)
    names = ("o", "state", "dq", "dk", "dv", "dbeta", "dh0")
    for name, a, b in zip(names, *outs):
        assert rel(a, b) < TOL[name], (name, rel(a, b))


@pytest.mark.parametrize("decay", [True, False])
@pytest.mark.parametrize("scale,recompute", [(0.3, False), (0.3, True), (1.0, False)])
def test_explicit_scale_matches_recurrent(scale, recompute, decay):
    """A given query scale (the forward's kernels fold it into QK and q's decay, the
    backward's take q scaled; with ``recompute`` the backward reruns the WY kernel on the
    scaled q): outputs, state and every gradient equal the recurrent form's, with and without
    the decay."""
    B, T, H, K, V, C = 1, 40, 2, 16, 32, 16
    q, k, v, g, beta, h0, do = make_inputs(B, T, H, K, V, seed=6)
    outs = []
    for settings in (
        GDNSettings(impl="pallas", chunk_size=C, interpret=True, recompute=recompute),
        GDNSettings(impl="recurrent"),
    ):

        def loss(q, k, v, g, beta, h0, settings=settings):
            if not decay:  # DeltaNet: the kernels without G, the reference at 0
                g = None if settings.impl == "pallas" else jnp.zeros(beta.shape)
            o, s = gated_delta_rule(
                q,
                k,
                v,
                g,
                beta,
                scale=scale,
                initial_state=h0,
                output_final_state=True,
                settings=settings,
            )
            return jnp.sum(o * do) + jnp.sum(s * s) * 0.1, (o, s)

        grads, (o, s) = jax.jit(jax.grad(loss, argnums=tuple(range(6)), has_aux=True))(
            q, k, v, g, beta, h0
        )
        outs.append((o, s) + grads[:3] + grads[4:] + (grads[3] if decay else 0.0 * g,))
    names = ("o", "state", "dq", "dk", "dv", "dbeta", "dh0", "dg")
    for name, a, b in zip(names, *outs):
        assert rel(a, b) < TOL[name], (name, rel(a, b))


@pytest.mark.parametrize("mode", list(MODES))
def test_extreme_gates_stay_finite(mode):
    """g = -60 per step (decay e^-60 per token, e^-960 over a chunk) and beta at 0 and 1:
    every value and gradient finite, and still equal to the recurrent form."""
    B, T, H, K, V, C = 1, 48, 2, 16, 16, 16
    q, k, v, g, beta, h0, do = make_inputs(B, T, H, K, V, seed=3)
    g = jnp.where(jnp.arange(T)[None, :, None] % 3 == 0, -60.0, g)
    beta = jnp.where(
        jnp.arange(T)[None, :, None] % 4 == 0,
        0.0,
        jnp.where(jnp.arange(T)[None, :, None] % 4 == 1, 1.0, beta),
    )
    out = run("pallas", mode, q, k, v, g, beta, h0, do, C)
    ref = run("recurrent", "generic", q, k, v, g, beta, h0, do, C)
    for name, x in out.items():
        assert bool(jnp.all(jnp.isfinite(x))), name
        assert rel(x, ref[name]) < 1e-4, (name, rel(x, ref[name]))


def test_bf16_inputs_close_to_fp32_spec():
    """bf16 q, k, v, beta (matmul operands bf16, state fp32) vs the fp32 recurrent form."""
    B, T, H, K, V, C = 1, 64, 2, 32, 32, 16
    q, k, v, g, beta, h0, do = make_inputs(B, T, H, K, V, seed=5)
    bf = lambda x: x.astype(jnp.bfloat16)
    out = run("pallas", "generic", bf(q), bf(k), bf(v), g, bf(beta), h0, do, C)
    ref = run("recurrent", "generic", q, k, v, g, beta, h0, do, C)
    for name in TOL:
        assert rel(out[name].astype(jnp.float32), ref[name]) < 2e-2, name


def test_backward_stores_follow_the_inputs_dtype_except_triton_wide_keys():
    """S_n, dS_{n+1}, v, dv are stored in the inputs' dtype (bf16 in training), fp32 under
    Triton at K > 128 (the bf16 stores exceeded the H200's shared memory there)."""
    from kernels_pallas.linear_scan import scan as scan_kernels
    from kernels_pallas.linear_scan.common import KernelConfig

    bf16, f32 = jnp.bfloat16, jnp.float32
    cfg = lambda layout: KernelConfig(chunk=64, layout=layout, block_v=64)
    assert scan_kernels.store_dtype(cfg("triton"), bf16, 128) == bf16
    assert scan_kernels.store_dtype(cfg("triton"), bf16, 256) == f32
    assert scan_kernels.store_dtype(cfg("tpu"), bf16, 256) == bf16
    assert scan_kernels.store_dtype(cfg("triton"), f32, 64) == f32
    B, T, H, K, V, C = 1, 32, 1, 16, 16, 16
    q, k, v, g, beta, h0, do = make_inputs(B, T, H, K, V)
    qk = jnp.zeros((B, T, H, C), bf16)
    res = scan_kernels.scan_forward(
        KernelConfig(chunk=C, layout="triton", block_v=V, interpret=True),
        q.astype(bf16),
        k.astype(bf16),
        k.astype(bf16),
        v.astype(bf16),
        qk,
        jnp.cumsum(g, 1),
        h0,
        store=True,
    )
    assert [x.dtype for x in res] == [bf16, f32, bf16, bf16]  # o, S_N, S_n, v


def test_fp32_dots_option_is_checked_and_both_settings_agree():
    """``fp32_dots`` names the WY backward's fp32 product precision; a bad value is refused,
    and on the CPU (full fp32 either way) both settings give the same gradients."""
    q, k, v, g, beta, h0, do = make_inputs(1, 32, 2, 16, 16, seed=9)
    with pytest.raises(ValueError, match="fp32_dots must be"):
        GDNSettings(interpret=True, fp32_dots="bf16")
    grads = []
    for mode in ("tf32", "ieee"):
        settings = GDNSettings(chunk_size=16, interpret=True, fp32_dots=mode)
        f = lambda *a: jnp.sum(gated_delta_rule_pallas(*a, settings=settings)[0] * do)
        grads.append(jax.grad(f, argnums=(0, 1, 2, 3, 4))(q, k, v, g, beta))
    for a, b in zip(*grads):
        assert rel(a, b) < 1e-6


@pytest.mark.parametrize(
    "field",
    ["chunk_size", "num_warps", "inverse_warps", "block_v", "num_stages", "step_min_programs"],
)
def test_launch_settings_below_one_are_refused_by_name(field):
    """Every count of the kernels' settings must be >= 1 (block_v and num_stages may also be
    None: chosen from the shape); the error names the op, the field and the value."""
    from kernels_pallas.decay_attention import DecaySettings
    from kernels_pallas.gated_recurrence import GatedRecurrenceSettings

    alt = " or None" if field in ("block_v", "num_stages") else ""
    with pytest.raises(ValueError, match=f"gated_delta_rule: {field} must be >= 1{alt}, got 0"):
        GDNSettings(**{field: 0})
    assert GDNSettings(block_v=None).block_v is None
    with pytest.raises(ValueError, match="decay_attention: block_v must be >= 1 or None"):
        DecaySettings(block_v=-2)
    with pytest.raises(ValueError, match="decay_attention: num_stages must be >= 1 or "):
        DecaySettings(num_stages=0)
    with pytest.raises(ValueError, match="gated_recurrence: block_d must be >= 1, got 0"):
        GatedRecurrenceSettings(block_d=0)


@pytest.mark.parametrize(
    "B,H,K,V,stages",
    [
        (2, 16, 128, 128, 3),  # block_v 32 -> 128 programs: one an SM, a deeper pipeline
        (8, 16, 128, 128, 2),  # block_v 64 -> 256 programs
        (32, 13, 64, 64, 2),  # HwH-380m's layer at 32 sequences: 416 programs
        (1, 2, 16, 16, 3),
    ],
)
def test_num_stages_none_follows_the_scans_grid(B, H, K, V, stages):
    """num_stages=None (GDN's and the decay ops' default) resolves by the scan's grid
    (``default_num_stages``); a value given is kept."""
    from kernels_pallas.decay_attention import DecaySettings
    from kernels_pallas.linear_scan.common import kernel_config

    for settings in (GDNSettings(platform="gpu"), DecaySettings(platform="gpu")):
        assert settings.num_stages is None
        cfg = kernel_config(settings, B, H, K, V, num_stages=settings.num_stages)
        assert cfg.num_stages == stages
        assert kernel_config(settings, B, H, K, V, num_stages=4).num_stages == 4


def test_pallas_without_a_lowering_names_interpret():
    """On a platform with no compiled lowering (CPU), and for a bad interpret value, the error
    says what to pass (the platform is named, so this runs on every machine)."""
    q, k, v, g, beta, _, _ = make_inputs(1, 16, 1, 16, 16)
    with pytest.raises(ValueError, match="interpret=True"):
        gated_delta_rule(q, k, v, g, beta, settings=GDNSettings(impl="pallas", platform="cpu"))
    with pytest.raises(ValueError, match="interpret must be"):
        gated_delta_rule(q, k, v, g, beta, settings=GDNSettings(impl="pallas", interpret="yes"))


@pytest.mark.parametrize("K,C,name", [(80, 16, "K"), (16, 24, "chunk_size"), (8, 16, "K")])
def test_gpu_lowering_names_the_shape_it_refuses(K, C, name):
    """The Triton kernels need K and the chunk powers of two >= 16; compiled for a GPU (named
    as the platform, so this runs on every machine; the check comes before any lowering) the
    error names the value."""
    q, k, v, g, beta, _, _ = make_inputs(1, 32, 1, K, 16)
    with pytest.raises(ValueError, match=f"on GPU needs {name} a power of two >= 16, got "):
        gated_delta_rule_pallas(
            q, k, v, g, beta, settings=GDNSettings(chunk_size=C, platform="gpu")
        )


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (conftest's CPU devices)")
@pytest.mark.parametrize("heads", [2, 3], ids=["heads-over-tensor", "heads-replicated"])
def test_pallas_per_shard_under_a_mesh(heads):
    """Under ``kernel_mesh`` (what the trainer traces its steps in) the kernels run in a
    shard_map on each device's rows and heads: same values and gradients as on one device. With
    3 heads the tensor axis (2) does not divide them and the heads stay whole per device."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from hwh_jax.training.sharding import make_mesh
    from kernels_pallas import kernel_mesh

    mesh = make_mesh((2, 2, 2))
    B, T, H, K, V, C = 4, 40, heads, 16, 16, 16
    q, k, v, g, beta, h0, do = make_inputs(B, T, H, K, V, seed=7)
    ref = run("pallas", "generic", q, k, v, g, beta, h0, do, C)
    spec = lambda x: NamedSharding(mesh, P(("data", "fsdp"), *[None] * (x.ndim - 1)))
    args = [jax.device_put(x, spec(x)) for x in (q, k, v, g, beta, h0, do)]
    with kernel_mesh(mesh):
        jaxpr = str(
            jax.make_jaxpr(run.__wrapped__, static_argnums=(0, 1, 9))("pallas", "generic", *args, C)
        )
        out = jax.jit(run.__wrapped__, static_argnums=(0, 1, 9))("pallas", "generic", *args, C)
    assert "shard_map" in jaxpr
    local_heads = H // 2 if H % 2 == 0 else H
    assert f"f32[1,48,{local_heads},16]" in jaxpr  # B 4 -> 1 per device; T padded to 48
    for name in TOL:
        assert rel(out[name], ref[name]) < 1e-6, (name, rel(out[name], ref[name]))


def test_identical_layers_share_one_lowering_of_each_kernel():
    """The kernel functions are nested jits: a program with 8 GDN layers of one shape lowers
    (on a GPU: Triton-compiles) as many kernel callees as one with 4, not twice as many."""
    import re

    q, k, v, g, beta, _, _ = make_inputs(2, 32, 2, 16, 16)

    def kernels(n):
        def f(q, k):  # (the gradient of k needs every backward kernel; q's alone not)
            x = q
            for _ in range(n):
                o, _ = gated_delta_rule(
                    x,
                    k,
                    v,
                    g,
                    beta,
                    settings=GDNSettings(impl="pallas", interpret=True, chunk_size=16),
                )
                x = x + o
            return x.sum()

        text = jax.jit(jax.grad(f, argnums=(0, 1))).lower(q, k).as_text()
        return re.findall(r"func\.func (?:private )?@((?:wy|scan|state)_\w+)", text)

    four, eight = kernels(4), kernels(8)
    assert {n.rstrip("_0123456789") for n in four} == {
        "wy_forward",
        "wy_backward",
        "scan_forward",
        "scan_backward",
        "state_grads",
    }
    assert len(eight) == len(four) < 4 * 5


def test_recompute_option_gives_the_same_result():
    """``recompute=True`` (the backward recomputes w, QK, S_n and v from X) and the default
    (the forward saves them) run the same kernels on the same values: equal outputs and
    gradients."""
    q, k, v, g, beta, h0, do = make_inputs(2, 75, 2, 16, 32, seed=6)
    outs = []
    for recompute in (False, True):

        def loss(*a):
            o, s = gated_delta_rule_pallas(
                *a,
                initial_state=h0,
                output_final_state=True,
                settings=GDNSettings(chunk_size=16, interpret=True, recompute=recompute),
            )
            return jnp.sum(o * do) + jnp.sum(s)

        outs.append(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4))(q, k, v, g, beta))
    (l0, g0), (l1, g1) = outs
    assert float(l0) == float(l1)
    for a, b in zip(g0, g1):
        assert rel(a, b) < 1e-6


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_decode_step_kernel_matches_the_jnp_step(dtype):
    """The one-kernel decode step (interpreted) against ``reference.gated_delta_rule_step``,
    four steps chained through the aliased state; K or V not a power of two runs the jnp
    step, as do fewer rows x heads than ``step_min_programs``; ``chosen()`` says which ran."""
    import kernels_pallas
    from kernels_pallas.gdn import gated_delta_rule_step, reference

    B, T, H, K, V = 3, 4, 2, 16, 32
    q, k, v, g, beta, h0, _ = make_inputs(B, T, H, K, V, seed=7)
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    pallas = GDNSettings(impl="pallas", interpret=True, step_min_programs=B * H)
    s_ref = s = h0
    for t in range(T):
        o_ref, s_ref = reference.gated_delta_rule_step(
            q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], s_ref
        )
        o, s = gated_delta_rule_step(
            q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], s, settings=pallas
        )
        assert o.dtype == v.dtype and s.dtype == jnp.float32
        assert rel(o.astype(jnp.float32), o_ref.astype(jnp.float32)) < (
            1e-6 if dtype == jnp.float32 else 1e-2
        )
        assert rel(s, s_ref) < 1e-6
    assert kernels_pallas.chosen()["gated_delta_rule_step@cpu"] == "pallas"
    q, k, v, g, beta, h0, _ = make_inputs(1, 1, 2, 12, 8, seed=8)
    gated_delta_rule_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], h0, settings=pallas)
    assert kernels_pallas.chosen()["gated_delta_rule_step@cpu"] == "reference"
    q, k, v, g, beta, h0, _ = make_inputs(1, 1, 2, 16, 8, seed=9)  # 2 programs < 6
    gated_delta_rule_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], h0, settings=pallas)
    assert kernels_pallas.chosen()["gated_delta_rule_step@cpu"] == "reference"
