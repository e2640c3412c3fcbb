"""The model family: packing, parameter counts, one forward of every tiny config (causality:
test_causality.py)."""

import dataclasses
import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import base
from hwh_jax.layers.config import LayerSpec
from hwh_jax.layers.linear import dense, dot_last, matmul, project
from hwh_jax.layers.mixer import HeadwiseMixer
from hwh_jax.models import ARCHS, HybridLM, count_params, count_params_whole, model_config
from hwh_jax.models.variants import model_config_from_dict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_config(path):
    spec = importlib.util.spec_from_file_location("cfg", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config()


def tokens(B, T, vocab, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, vocab, (B, T)), jnp.int32)


@pytest.mark.parametrize("arch", ["transformer", "gdn", "hwh", "swa"])
def test_packed_documents_match_separate_runs(arch):
    """With segment ids and in-document positions, a packed row equals its documents run alone."""
    cfg = model_config(arch, "tiny", dtype="float32", window=8, la_chunk_size=16)
    model = HybridLM(cfg, rngs=nnx.Rngs(1))
    fwd = nnx.jit(lambda m, x, p, s: m(x, p, s))
    x = tokens(1, 45, cfg.vocab_size, seed=1)
    n1 = 19
    seg = jnp.array([[0] * n1 + [1] * (45 - n1)])
    pos = jnp.array([list(range(n1)) + list(range(45 - n1))])
    packed = fwd(model, x, pos, seg)
    alone = fwd(model, x[:, n1:], jnp.arange(45 - n1)[None], jnp.zeros((1, 45 - n1), jnp.int32))
    np.testing.assert_allclose(packed[:, n1:], alone, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "spec", [LayerSpec(2, 6), LayerSpec(4, 0), LayerSpec(0, 8)], ids=["both", "fa", "gdn"]
)
def test_fused_projections_equal_one_matmul_per_projection(spec):
    """extend's single matmul over the concatenated input weights gives each projection."""
    cfg = model_config("hwh", "tiny", dtype="float32", q_per_kv=2)
    mixer = HeadwiseMixer(cfg, spec, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (2, 5, cfg.d_model))
    fused, split = mixer.project(x, fused=True), mixer.project(x)
    for a, b in zip(fused, split):
        assert (a is None) == (b is None)
        for ya, yb in zip(a or [], b or []):
            assert ya.shape == yb.shape
            np.testing.assert_allclose(ya, yb, atol=1e-5, rtol=1e-5)
    n = {"both": 9, "fa": 3, "gdn": 6}[
        ("both" if spec.num_fa and spec.num_la else "fa" if spec.num_fa else "gdn")
    ]
    assert len((fused[0] or []) + (fused[1] or [])) == n


@pytest.mark.parametrize("lead", [(1, 1), (1,), (2, 1), (3, 4)])
def test_matmul_computes_a_lone_row_as_two(lead):
    """``matmul`` equals ``dot_last`` bitwise; a lone row is multiplied as a 2-row matrix (the
    product XLA's GPU compiler keeps a GEMM), more rows as they are."""
    x = jax.random.normal(jax.random.key(0), lead + (32,), jnp.bfloat16)
    w = jax.random.normal(jax.random.key(1), (32, 48), jnp.bfloat16)
    y = jax.jit(matmul)(x, w)
    assert y.shape == lead + (48,)
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(dot_last(x, w), np.float32))
    text = jax.jit(matmul).lower(x, w).as_text()
    rows = "2x32" if np.prod(lead) == 1 else "x".join(map(str, lead)) + "x32"
    assert f"tensor<{rows}xbf16>, tensor<32x48xbf16>" in text


def test_decode_loop_with_input_weights_formed_once_matches_per_step():
    """``extend(..., input_weights=input_weights())``, as the decode loop runs it, gives the
    logits and cache of the layers forming their own weights."""
    cfg = model_config("hwh", "tiny", dtype="float32")
    model = HybridLM(cfg, rngs=nnx.Rngs(0))
    cache = model.init_cache(1, 8)
    tok = jnp.array([[3]], jnp.int32)
    a, ca = model.extend(tok, cache)
    b, cb = model.extend(tok, cache, input_weights=model.input_weights())
    np.testing.assert_array_equal(a, b)
    for x, y in zip(jax.tree.leaves(ca), jax.tree.leaves(cb)):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_config_jitted_forward(arch):
    config = base.get_config(f"{arch}_tiny")
    cfg = model_config_from_dict(config.model)
    model = HybridLM(cfg, rngs=nnx.Rngs(0))
    logits = nnx.jit(lambda m, x: m(x))(model, tokens(2, 70, cfg.vocab_size))
    assert logits.shape == (2, 70, cfg.vocab_size) and logits.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(logits)))


def test_every_arch_size_config_file_exists():
    from hwh_jax.models import SIZES

    for arch in ARCHS:
        for size in SIZES:
            config = base.get_config(f"{arch}_{size}")
            assert (config.model.arch, config.model.size) == (arch, size)
    # the files that say more than base.get_config("ARCH_SIZE"): the first hour's and the
    # design card's
    for path, variant in (("hwh_tiny.py", "hwh_tiny"), ("hwh_1b4.py", "hwh_1b4")):
        config = load_config(os.path.join(ROOT, "configs", path))
        assert (config.model.arch, config.model.size) == tuple(variant.split("_"))


@pytest.mark.parametrize("size,target", [("380m", 380e6), ("1b4", 1.4e9)])
def test_named_sizes_within_5_percent(size, target):
    for arch in ARCHS:
        n = count_params(model_config(arch, size))
        assert abs(n / target - 1) < 0.05, (arch, size, n)


@pytest.mark.parametrize("size", ["tiny", "small", "380m", "1b4"])
def test_architectures_match_transformer_params(size):
    base = count_params(model_config("transformer", size))
    for arch in ARCHS:
        n = count_params(model_config(arch, size))
        assert abs(n / base - 1) < 0.03, (arch, n, base)


@pytest.mark.parametrize("arch", ARCHS)
def test_fast_count_equals_whole_model_count(arch):
    cfg = model_config(arch, "tiny")
    assert count_params(cfg) == count_params_whole(cfg)


def test_mixed_precision_dtypes():
    cfg = model_config("hwh", "tiny")  # bf16 compute by default
    model = HybridLM(cfg, rngs=nnx.Rngs(0))
    params = jax.tree.leaves(nnx.state(model, nnx.Param))
    assert all(p.dtype == jnp.float32 for p in params)
    h = nnx.jit(lambda m, x: m.hidden(x))(model, tokens(1, 10, cfg.vocab_size))
    assert h.dtype == jnp.bfloat16


def test_absent_branch_has_no_weights():
    gdn = HybridLM(model_config("gdn", "tiny"), rngs=nnx.Rngs(0))
    tr = HybridLM(model_config("transformer", "tiny"), rngs=nnx.Rngs(0))
    assert all(b.mixer.fa is None and b.mixer.la is not None for b in gdn.blocks)
    assert all(b.mixer.la is None and b.mixer.fa is not None for b in tr.blocks)


def test_transformer_learns_to_copy():
    """The tiny Transformer learns the copy task (induction) in 60 steps (4.03 nats at step 20,
    0.12 at 60): attention, its causal mask and RoPE work together (chance is 4.13 nats; a
    broken mask or rotation stalls it; a leak would make it trivial for every architecture, see
    bench/copy_task.py)."""
    from hwh_jax.eval.copy_task import train_copy

    (_, first, _), *_, (_, last, _) = train_copy("transformer", "tiny", steps=60, log_every=20)
    assert first > 1.0 and last < 0.3, (first, last)


def test_embedding_gradient_sums_colliding_rows_in_fp32():
    """The bf16 model's embedding gradient is the one-hot product's (an fp32 sum of every
    occurrence's row), and the scatter that forms it runs in fp32: nnx.Embed's summed
    thousands of a frequent token's rows in bf16."""
    cfg = model_config("hwh", "tiny", dtype="bfloat16")
    model = HybridLM(cfg, rngs=nnx.Rngs(0))
    ids = jnp.asarray(np.random.default_rng(0).zipf(1.3, (4, 512)) % 7, jnp.int32)  # collide
    cot = jax.random.normal(jax.random.key(1), (4, 512, cfg.d_model), jnp.float32)
    graphdef, params = nnx.split(model, nnx.Param)

    def loss(p):
        x = nnx.merge(graphdef, p).embed_tokens(ids)
        assert x.dtype == jnp.bfloat16
        return (x.astype(jnp.float32) * cot.astype(jnp.bfloat16).astype(jnp.float32)).sum()

    got = jax.grad(loss)(params)["embed"]["embedding"][...]
    onehot = jax.nn.one_hot(ids.reshape(-1), cfg.vocab_size, dtype=jnp.float32)
    want = onehot.T @ cot.astype(jnp.bfloat16).astype(jnp.float32).reshape(-1, cfg.d_model)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    hlo = jax.jit(jax.grad(loss)).lower(params).as_text(dialect="hlo")
    scatters = [
        line.split("=", 1)[1].split()[0] for line in hlo.splitlines() if " scatter(" in line
    ]  # the result types: "f32[64,128]"
    assert scatters and all(t.startswith("f32[") for t in scatters), scatters
    x_embed = nnx.merge(graphdef, params).embed(ids)  # the same forward values
    np.testing.assert_array_equal(model.embed_tokens(ids), x_embed)


def _project_case(widths):
    """bf16 dense layers [16 -> width] for ``widths``, an input x [2, 6, 16], their params and
    loss(params, x, how) = sum of each output times a fixed cotangent, the outputs by
    ``linear.project`` (how == "project", or a tuple of its groups) or one layer at a time
    (how == "autodiff": autodiff's sums)."""
    layers = [
        dense(
            16, n, ("embed", "heads"), dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=nnx.Rngs(i)
        )
        for i, n in enumerate(widths)
    ]
    x = jax.random.normal(jax.random.key(5), (2, 6, 16), jnp.bfloat16)
    cots = [jax.random.normal(jax.random.key(10 + i), (2, 6, n)) for i, n in enumerate(widths)]
    graphdef, params = nnx.split(nnx.List(layers), nnx.Param)

    def loss(p, x, how):
        ls = nnx.merge(graphdef, p)
        if how == "autodiff":
            ys = [layer(x) for layer in ls]
        else:  # "project", or project's groups
            ys = project(x, list(ls), () if how == "project" else how)
        return sum((y.astype(jnp.float32) * c).sum() for y, c in zip(ys, cots))

    return layers, x, params, loss


def test_project_equals_each_layer_and_sums_gradients_new_product_first():
    """linear.project gives each layer's output and autodiff's gradients (bitwise on CPU: the
    same sums in the same order), and every sum of x's gradient takes the new product as its
    first operand, the form XLA's GEMM rewriter folds into that product's GEMM."""
    layers, x, params, loss = _project_case((8, 24, 4, 8))
    for a, b in zip(project(x, layers), [layer(x) for layer in layers]):
        np.testing.assert_array_equal(a, b)
    got = jax.grad(loss, argnums=(0, 1))(params, x, "project")
    want = jax.grad(loss, argnums=(0, 1))(params, x, "autodiff")
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    for how, first_is_product in (("project", True), ("autodiff", False)):
        n, firsts, _ = _gradient_sums(loss, params, x, how)
        assert n == len(layers) - 1
        assert all(firsts) == first_is_product, (how, firsts)
    with pytest.raises(ValueError, match="share one compute dtype"):
        project(
            x,
            layers
            + [
                dense(
                    16,
                    4,
                    ("embed", "heads"),
                    dtype=jnp.float32,
                    param_dtype=jnp.float32,
                    rngs=nnx.Rngs(9),
                )
            ],
        )


def _gradient_sums(loss, params, x, how):
    """x's gradient under ``loss(params, x, how)``: (its adds, whether each add's first operand
    is a product, the contraction widths of the products that form it, sorted)."""
    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=1), static_argnums=2)(params, x, how)
    eqns = list(_eqns(jaxpr.jaxpr))
    producer = {v: e.primitive.name for e in eqns for v in e.outvars}
    adds = [
        e
        for e in eqns
        if e.primitive.name in ("add", "add_any") and e.outvars[0].aval.shape == x.shape
    ]
    dots = [
        e for e in eqns if e.primitive.name == "dot_general" and e.outvars[0].aval.shape == x.shape
    ]
    firsts = [producer.get(e.invars[0]) == "dot_general" for e in adds]
    return len(adds), firsts, sorted(e.invars[1].aval.shape[1] for e in dots)


def test_project_takes_the_narrow_layers_as_one_product():
    """Two or more layers whose widths are not a multiple of 8 (GDN's a and b) are one GEMM
    forward and backward, whose product starts x's gradient sum: per layer the same outputs,
    gradients within bf16 rounding of autodiff's, one add per wide layer, each with the new
    product first, and no GEMM of a narrow layer alone."""
    layers, x, params, loss = _project_case((8, 15, 24, 15, 8))
    for a, b in zip(project(x, layers), [layer(x) for layer in layers]):
        assert a.shape == b.shape
        np.testing.assert_allclose(np.float32(a), np.float32(b), rtol=1e-2, atol=1e-2)
    got = jax.grad(loss, argnums=(0, 1))(params, x, "project")
    want = jax.grad(loss, argnums=(0, 1))(params, x, "autodiff")
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(np.float32(a), np.float32(b), rtol=2e-2, atol=2e-2)
    n, firsts, widths = _gradient_sums(loss, params, x, "project")
    assert n == 3 and all(firsts) and widths == [8, 8, 24, 30]


def test_project_takes_each_group_as_one_product():
    """A group (HwH's FA q, k, v) is one GEMM forward and backward, in x's gradient sum where
    its first layer's product was: per layer the same outputs, gradients within bf16 rounding
    of autodiff's, one add per other product with the new product first; beside the narrow
    layers' product; bad groups are refused by name."""
    layers, x, params, loss = _project_case((8, 24, 24, 40, 15, 15))
    groups = ((0, 1, 2),)
    for a, b in zip(project(x, layers, groups), [layer(x) for layer in layers]):
        assert a.shape == b.shape
        np.testing.assert_allclose(np.float32(a), np.float32(b), rtol=1e-2, atol=1e-2)
    got = jax.grad(loss, argnums=(0, 1))(params, x, groups)
    want = jax.grad(loss, argnums=(0, 1))(params, x, "autodiff")
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(np.float32(a), np.float32(b), rtol=2e-2, atol=2e-2)
    n, firsts, widths = _gradient_sums(loss, params, x, groups)
    assert n == 2 and all(firsts) and widths == [30, 40, 56]
    for bad in (((0, 1), (1, 2)), ((0, 6),)):
        with pytest.raises(ValueError, match="disjoint indices into the 6 layers"):
            project(x, layers, bad)


@pytest.mark.parametrize("spec", [LayerSpec(2, 6), LayerSpec(8, 0)], ids=["narrow", "wide"])
def test_mixer_takes_a_narrow_fa_branch_as_one_product(spec, monkeypatch):
    """HeadwiseMixer multiplies a narrow FA branch's q, k, v as one product and a wide one (a
    Transformer layer's) as three, with the outputs of one product per projection. (The tiny
    size's heads are 16 wide: the bound is scaled to them, 2 heads narrow, 8 wide.)"""
    from hwh_jax.layers import mixer as mixer_module

    cfg = model_config("hwh", "tiny", dtype="float32")
    monkeypatch.setattr(mixer_module, "FA_ONE_PRODUCT_WIDTH", 5 * cfg.head_dim)
    m = HeadwiseMixer(cfg, spec, rngs=nnx.Rngs(0))
    narrow = spec.num_fa == 2
    assert m._groups() == (((0, 1, 2),) if narrow else ())
    x = jax.random.normal(jax.random.key(1), (2, 5, cfg.d_model))
    fa, la = m.project(x)
    fa_layers, la_layers = m.input_projections()
    for y, want in zip(fa + (la or []), project(x, fa_layers + la_layers)):
        np.testing.assert_allclose(y, want, atol=1e-5, rtol=1e-5)
    jaxpr = jax.make_jaxpr(lambda x: m.project(x))(x)
    widths = sorted(
        e.outvars[0].aval.shape[-1] for e in _eqns(jaxpr.jaxpr) if e.primitive.name == "dot_general"
    )
    fa_width = sum(p.kernel.shape[1] for p in fa_layers)
    assert (fa_width in widths) == narrow
    if narrow:  # FA heads split over a tensor axis: three products; over fsdp alone: one
        from jax.sharding import Mesh

        from kernels_pallas.sharding import kernel_mesh

        devices = np.array(jax.devices()[:4])
        for shape, groups in (((1, 2, 2), ()), ((1, 4, 1), ((0, 1, 2),))):
            mesh = Mesh(devices.reshape(shape), ("data", "fsdp", "tensor"))
            with kernel_mesh(mesh):
                assert m._groups() == groups, shape


def _eqns(jp):
    for eqn in jp.eqns:
        yield eqn
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from _eqns(sub)


def test_full_remat_gives_the_same_loss_and_gradients_with_less_memory():
    """model.remat="full" ("block") recomputes each block in the backward pass: the loss and every
    gradient as without it (fp32), and the compiled gradient keeps fewer temporaries. (The
    Transformer: the remat wraps whole blocks whatever their mixer; it compiles fastest.)"""
    cfg = model_config("transformer", "tiny", dtype="float32")
    x = tokens(2, 64, cfg.vocab_size, seed=2)
    got = {}
    for remat in ("none", "full"):
        model = HybridLM(dataclasses.replace(cfg, remat=remat), rngs=nnx.Rngs(0))
        graphdef, params = nnx.split(model)
        loss = lambda p: jnp.mean(nnx.merge(graphdef, p)(x) ** 2)
        grad = jax.jit(jax.value_and_grad(loss)).lower(params).compile()
        got[remat] = (*grad(params), grad.memory_analysis().temp_size_in_bytes)
    (l0, g0, t0), (l1, g1, t1) = got["none"], got["full"]
    np.testing.assert_allclose(l1, l0, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)
    assert t1 < t0, (t1, t0)
    with pytest.raises(ValueError, match="remat"):
        dataclasses.replace(cfg, remat="most")


def test_no_mlp_and_learned_positions():
    """model.mlp_hidden=0 (a block is its mixer alone) and model.abs_positions (learned absolute
    positions added to the token embeddings, as Zoology's models have): the fast parameter
    count equals the whole model's; decoding a prompt's chunk and then token by token over the
    cache gives the forward pass's logits (the positions follow the cache); other positions
    change the output; a sequence or a decode cache longer than the table is refused naming
    the key."""
    cfg = model_config("hwh", "tiny").replace(mlp_hidden=0, abs_positions=32, dtype="float32")
    assert count_params(cfg) == count_params_whole(cfg)
    model = HybridLM(cfg, rngs=nnx.Rngs(0))
    assert model.blocks[0].mlp is None and model.positions[...].shape == (32, cfg.d_model)
    tokens = jax.random.randint(jax.random.key(1), (2, 24), 0, cfg.vocab_size)
    full = model(tokens)
    cache = model.init_cache(2, 32, dtype=jnp.float32)
    logits, cache = model.extend(tokens[:, :10], cache, fresh=True)
    steps = [logits]
    for t in range(10, 24):
        step, cache = model.extend(tokens[:, t : t + 1], cache)
        steps.append(step)
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5, rtol=1e-5)
    moved = model(tokens, positions=jnp.arange(24)[None] + 1)
    assert np.abs(np.asarray(moved) - np.asarray(full)).max() > 1e-2
    with pytest.raises(ValueError, match="model.abs_positions=32"):
        model(jnp.zeros((1, 40), jnp.int32))
    with pytest.raises(ValueError, match="cache of 40 time steps does not fit"):
        model.init_cache(1, 40)
