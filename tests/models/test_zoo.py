"""The efficient-mixer zoo as the linear heads of a head-wise hybrid (``model.la_kind``): for
every kind, a prompt prefilled then decoded token by token (with a left-padded row) equals the
parallel forward, packed documents equal the documents alone, and a tiny model trains a few
AdamW steps with a finite, falling loss. The state recurrences themselves are tested in
test_decay_attention.py (and GDN's in test_gdn_reference.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from hwh_jax.layers import heads
from hwh_jax.layers.config import LayerSpec, ModelConfig
from hwh_jax.models import HybridLM

VOCAB = 128
KINDS = [
    k for k in heads.ORDER if k != "gdn"
]  # GDN: tests/inference/test_inference.py, test_model.py
CONV_OPTIONAL = [k for k in heads.ORDER if heads.get(k).conv_optional]


def _model(kind):
    """Two head-wise layers (1 FA + 3 linear heads, then 2 + 2), small enough to compile fast;
    KIND+conv: ``la_short_conv``."""
    kind, _, conv = kind.partition("+")
    cfg = ModelConfig(
        vocab_size=VOCAB,
        d_model=64,
        num_heads=4,
        head_dim=16,
        la_key_dim=16,
        la_value_dim=16,
        mlp_hidden=128,
        layers=(LayerSpec(1, 3), LayerSpec(2, 2)),
        dtype="float32",
        la_chunk_size=8,
        la_kind=kind,
        la_short_conv=bool(conv),
    )
    return HybridLM(cfg, rngs=nnx.Rngs(0))


def _tokens(B, T, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(1, VOCAB, (B, T)), jnp.int32)


@pytest.mark.parametrize("kind", KINDS + [f"{k}+conv" for k in CONV_OPTIONAL])
def test_every_kind_decodes_packs_and_trains(kind):
    check_kind(kind)


def check_kind(kind):
    """Prefill then decode equals the forward (a left-padded row too), packed documents equal
    each alone, and a few AdamW steps lower the loss (tests/models/test_head_kinds.py's toy too)."""
    model = _model(kind)
    # prefill 13 tokens (crossing chunks of 8), then one token at a time; row 0 left-padded
    x = _tokens(2, 20)
    fwd = nnx.jit(lambda m, x, p=None, s=None: m(x, p, s))
    full = fwd(model, x)
    short = fwd(model, x[:1, 4:])
    extend = nnx.jit(lambda m, x, c: m.extend(x, c))
    padded = x.at[0, :4].set(0)
    cache = model.init_cache(2, 20, start=[4, 0])
    logits, cache = extend(model, padded[:, :13], cache)
    outs = [logits]
    for t in range(13, 20):
        logits, cache = extend(model, padded[:, t : t + 1], cache)
        outs.append(logits)
    got = jnp.concatenate(outs, 1)
    np.testing.assert_allclose(got[1], full[1], atol=2e-4, rtol=0)
    np.testing.assert_allclose(got[0, 4:], short[0], atol=2e-4, rtol=0)
    # packed: two documents in one row equal each run alone
    seg = jnp.asarray([[0] * 4 + [1] * 16])
    pos = jnp.asarray([list(range(4)) + list(range(16))])
    packed = fwd(model, x[1:], pos, seg)
    alone = fwd(model, x[1:, 4:])
    np.testing.assert_allclose(packed[0, 4:], alone[0], atol=2e-4, rtol=1e-4)
    # trains: AdamW on a repeated batch, loss finite and falling
    graphdef, params = nnx.split(model, nnx.Param)
    tx = optax.adamw(3e-3)
    opt = tx.init(params)
    batch = _tokens(4, 33, seed=5)

    @jax.jit
    def step(params, opt):
        def loss_fn(p):
            logits = nnx.merge(graphdef, p)(batch[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

        loss, g = jax.value_and_grad(loss_fn)(params)
        updates, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, updates), opt, loss

    losses = []
    for _ in range(4):
        params, opt, loss = step(params, opt)
        losses.append(float(loss))
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses


def test_short_conv_is_where_the_kind_has_none():
    """la_short_conv: a convolution on q, k, v (HGRN-2: q and its input; its forget gate stays
    the token's own) that changes the output, and a refusal naming the key for the kinds that
    have one already or no q, k."""
    x = _tokens(1, 12)
    for kind in CONV_OPTIONAL:
        plain, conv = _model(kind), _model(kind + "+conv")
        heads = conv.blocks[0].mixer.la
        assert [c is not None for c in heads._convs()] == [True, kind != "hgrn2", True], kind
        assert not np.allclose(plain(x), conv(x), atol=1e-3), kind
    for kind in ("gdn", "deltanet", "mamba2", "hgrn"):
        with pytest.raises(ValueError, match=f"la_short_conv .*la_kind='{kind}'"):
            _model(kind + "+conv")


def test_named_zoo_configs_build_what_they_name():
    """configs/zoo.py: each form gives the layers it names, parameters matched to the
    Transformer's (within 1%), and a ratio or value that cannot be built is refused by name."""
    from configs import zoo
    from hwh_jax.models import model_config
    from hwh_jax.models.params import count_params
    from hwh_jax.models.variants import model_config_from_dict

    def layers(arg):
        return model_config_from_dict(zoo.get_config(arg).model)

    base = count_params(model_config("transformer", "small"))
    cfg = layers("layerwise,gla,3")
    assert cfg.la_kind == "gla" and [s.num_fa for s in cfg.layers] == [0, 0, 0, 10] * 3
    assert all(s.fa_rope for s in cfg.layers if s.num_fa)
    assert not any(s.fa_rope for s in layers("layerwise_nope,hgrn,6").layers if s.num_fa)
    assert all(s.num_fa == 0 for s in layers("pure,mamba2").layers)
    assert sum(s.num_fa for s in layers("hwh,retnet").layers) == 22
    swa = layers("swa_nope,256").layers
    assert [s.window for s in swa[:4]] == [256, 256, 256, None] and not swa[3].fa_rope
    for arg in ("layerwise,gla,3", "pure,hgrn2", "hwh,lightning", "swa,1024"):
        assert abs(count_params(layers(arg)) / base - 1) < 0.01, arg
    conv = zoo.get_config("hwh,gla")
    conv.model.la_short_conv = True
    assert model_config_from_dict(conv.model).arch == "hwh/gla+conv"
    with pytest.raises(ValueError, match="model.ratio=.1, 24. .* 12 layers"):
        layers("layerwise,gdn,24")
    with pytest.raises(ValueError, match="kind 'mamba' is not one of"):
        zoo.get_config("hwh,mamba")
    with pytest.raises(ValueError, match="the window W must be a positive integer, got 'big'"):
        zoo.get_config("swa,big")
    with pytest.raises(ValueError, match="size '2b' is not one of"):
        zoo.get_config("pure,gla,2b")
