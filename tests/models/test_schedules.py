"""Allocation rules of the named schedules."""

import json

import pytest

from hwh_jax.models import SIZES, model_config, schedules


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("arch", ["hwh", "hwh_rope"])
def test_hwh_rules(arch, size):
    cfg = model_config(arch, size)
    assert cfg.fa_share < 0.25
    assert cfg.fa_heads[0] == 0 and cfg.fa_heads[-1] == 0
    assert all(s.num_fa + s.num_la == cfg.num_heads for s in cfg.layers)
    assert all(s.fa_rope == (arch == "hwh_rope") for s in cfg.layers if s.num_fa)
    # concentrated in the middle: the middle half holds most FA heads
    L = cfg.num_layers
    mid = sum(cfg.fa_heads[L // 4 : L - L // 4])
    assert mid > sum(cfg.fa_heads) / 2


def test_uniform_ablation_same_budget():
    mid, uni = model_config("hwh", "380m"), model_config("hwh_uniform", "380m")
    assert sum(mid.fa_heads) == sum(uni.fa_heads)
    assert max(uni.fa_heads) - min(uni.fa_heads) <= 1


def test_layerwise_one_in_four():
    cfg = model_config("layerwise", "380m")
    assert [l for l, n in enumerate(cfg.fa_heads) if n] == [3, 7, 11, 15, 19, 23]
    assert all(s.fa_rope for s in cfg.layers if s.num_fa)
    assert not any(s.fa_rope for s in model_config("layerwise_nope", "380m").layers)


def test_swa_windows():
    cfg = model_config("swa", "small", window=128)
    assert [s.window for s in cfg.layers[:4]] == [128, 128, 128, None]


def test_transformer_and_gdn():
    assert set(model_config("transformer", "small").la_heads) == {0}
    assert set(model_config("gdn", "small").fa_heads) == {0}


def test_explicit_counts_and_json(tmp_path):
    cfg = model_config("hwh", "tiny", counts=[0, 2, 1, 0])
    assert cfg.fa_heads == (0, 2, 1, 0)
    path = tmp_path / "alloc.json"
    path.write_text(json.dumps({"fa_heads": [0, 1, 3, 0]}))
    assert model_config("hwh", "tiny", counts=str(path)).fa_heads == (0, 1, 3, 0)


@pytest.mark.parametrize(
    "counts,match",
    [
        ([1, 1, 1, 0], "first/last"),
        ([0, 8, 8, 0], "share"),
        ([0, 1, 0], "layers"),
        ([0, 9, 0, 0], "asks for"),
    ],
)
def test_rule_violations_raise(counts, match):
    with pytest.raises(ValueError, match=match):
        model_config("hwh", "tiny", counts=counts)


def test_gqa_unit_respected():
    cfg = model_config("hwh", "380m", q_per_kv=2)
    assert all(n % 2 == 0 for n in cfg.fa_heads)
    with pytest.raises(ValueError, match="q_per_kv"):
        model_config("hwh", "tiny", counts=[0, 3, 1, 0], q_per_kv=2)


def test_bad_names_raise():
    with pytest.raises(ValueError, match="architecture"):
        model_config("mamba", "tiny")
    with pytest.raises(ValueError, match="size"):
        model_config("hwh", "7b")
    with pytest.raises(FileNotFoundError, match="missing.json"):
        schedules.load_counts("missing.json")


def test_an_architecture_is_one_registration(monkeypatch):
    """A new architecture is an ``Architecture`` registered under its name: model_config
    builds it at every size; a name taken twice and an unknown name are errors that say so."""
    from hwh_jax.models import variants

    monkeypatch.setattr(variants, "_ARCHS", dict(variants._ARCHS))
    arch = variants.Architecture(
        "alternating",
        lambda L, H, o: schedules.layerwise(L, H, (1, 1), fa_rope=True),
        "FA and linear layers in turn",
    )
    variants.register_arch(arch)
    cfg = model_config("alternating", "tiny")
    assert [s.num_fa for s in cfg.layers] == [0, 8, 0, 8]
    with pytest.raises(ValueError, match="'alternating' is registered twice"):
        variants.register_arch(arch)
    with pytest.raises(ValueError, match="unknown architecture 'hybrid'.*'alternating'"):
        model_config("hybrid", "tiny")


def test_num_layers_sets_the_depth_at_the_sizes_widths():
    """``model.num_layers``: another depth, the size's widths kept and HwH's allocation made for
    that depth (the rules hold); 0 is the size's; a bad value names the key."""
    from configs import base
    from hwh_jax.models.variants import model_config_from_dict

    config = base.get_config("hwh_1b4")
    default = model_config_from_dict(config.model)
    config.model.num_layers = 8
    cfg = model_config_from_dict(config.model)
    assert (len(default.layers), len(cfg.layers)) == (SIZES["1b4"].num_layers, 8)
    assert (cfg.d_model, cfg.head_dim, cfg.num_heads) == (2048, 128, 16)
    fa = [s.num_fa for s in cfg.layers]
    assert fa[0] == fa[-1] == 0 and 0 < sum(fa) < 0.25 * 8 * 16
    config.model.num_layers = -1
    with pytest.raises(ValueError, match="model.num_layers must be >= 1"):
        model_config_from_dict(config.model)
