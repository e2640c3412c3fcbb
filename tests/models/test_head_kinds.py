"""The linear-head registry (hwh_jax/layers/heads): a kind added as one module outside the
package (tests/toy_kind.py, named in $HWH_HEAD_KINDS) decodes, packs and trains as the zoo's
kinds do, trains through the trainer, generates from its checkpoint and counts its FLOPs;
``launch.describe --table`` lists it (tests/launch/test_launch.py). Unknown and doubled names are
errors that say what to change."""

import numpy as np
import pytest
import toy_kind
from test_zoo import check_kind

from configs import base
from hwh_jax.data.paths import resolve
from hwh_jax.data.sources import read_text
from hwh_jax.layers import heads


def test_a_kind_from_one_module_decodes_packs_and_trains():
    assert "toy_ema" in heads.names() and heads.names()[:2] == ("gdn", "deltanet")
    check_kind("toy_ema")


def test_a_kind_from_one_module_trains_in_the_trainer_and_generates(tmp_path, monkeypatch):
    from hwh_jax.inference import Generator
    from hwh_jax.models.params import param_table
    from hwh_jax.training.flops import flops_per_token
    from hwh_jax.training.restore import load_run
    from hwh_jax.training.trainer import train_and_evaluate

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(read_text(resolve("tinyshakespeare/input.txt.gz"))[:100_000])
    monkeypatch.setenv("HWH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HWH_HEAD_KINDS", "toy_kind")  # the run config's model.toy_ema section
    config = base.get_config("hwh_tiny")
    config.model.la_kind = "toy_ema"
    config.model.toy_ema.decay = 0.25  # the kind's own kernel settings, as a run sets them
    config.seq_len, config.model.dtype = 32, "float32"
    config.data.paths, config.data.sp_vocab_size = (str(corpus),), 512
    t = config.train
    t.steps, t.batch_size, t.lr, t.warmup_steps, t.mesh = 4, 8, 3e-3, 1, (1, 1, 1)
    t.log_every, t.eval_every, t.checkpoint_every, t.eval_sequences = 1, 0, 0, 8
    config.eval.at_end = False
    result = train_and_evaluate(config, tmp_path / "run")
    assert sorted(result.losses) == [1, 2, 3, 4] and np.isfinite(result.losses[4])

    run = load_run(tmp_path / "run")
    assert run.model.blocks[1].mixer.la.__class__ is toy_kind.EMAHeads
    assert run.model.blocks[1].mixer.la.settings.decay == 0.25  # saved with the run, read back
    tokens = run.tokenizer.encode("ROMEO:")
    out = Generator(run.model, eos_id=-1).generate([tokens], 5)[0]
    assert len(out[0]) == 5
    # the FLOPs count asks the kind: 9 V per linear head and token beside the weights' and
    # the attention's (hwh_jax/training/flops.py)
    cfg = run.model.cfg
    p = param_table(cfg)
    weights = 6.0 * (p["non_embedding"] + cfg.vocab_size * cfg.d_model - p["norms"])
    attention = sum(6.0 * s.num_fa * cfg.head_dim * 32 for s in cfg.layers)
    linear = sum(cfg.la_heads) * 9.0 * cfg.la_value_dim
    assert flops_per_token(cfg, 32) == pytest.approx(weights + attention + linear, rel=1e-12)


def test_unknown_and_doubled_kinds_say_what_to_change():
    from hwh_jax.layers.config import LayerSpec, ModelConfig

    with pytest.raises(
        ValueError, match=r"model.la_kind='nope' is not a linear-head kind; known: \['gdn'"
    ):
        ModelConfig(
            vocab_size=8,
            d_model=8,
            num_heads=2,
            head_dim=4,
            la_key_dim=4,
            la_value_dim=4,
            mlp_hidden=8,
            layers=(LayerSpec(1, 1),),
            la_kind="nope",
        )
    toy = heads.get("toy_ema")
    assert heads.register(toy) is toy  # the same kind again (a module imported twice): fine
    with pytest.raises(ValueError, match="'toy_ema' is registered twice"):
        heads.register(heads.HeadKind("toy_ema", toy.build, toy.flops))


def test_a_kind_with_kernel_settings_of_its_own(monkeypatch):
    """``HeadKind.settings`` (the toy's ``EMASettings``): a run config section model.toy_ema
    where $HWH_HEAD_KINDS names the module (not where a process merely imported it), kept in
    ModelConfig.kind_settings, read by the heads; its values reach the recurrence, and a wrong
    key or value is an error naming model.toy_ema."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from hwh_jax.models import model_config
    from hwh_jax.models.variants import model_config_from_dict

    monkeypatch.delenv("HWH_HEAD_KINDS", raising=False)
    assert "toy_ema" not in base.get_config("hwh_tiny").model  # imported, not named
    monkeypatch.setenv("HWH_HEAD_KINDS", "toy_kind")
    config = base.get_config("hwh_tiny")
    assert dict(config.model.toy_ema) == {"decay": 0.5, "impl": "auto"}
    config.model.la_kind, config.model.toy_ema.decay = "toy_ema", 0.25
    cfg = model_config_from_dict(config.model)
    assert cfg.kind_settings == (("toy_ema", toy_kind.EMASettings(decay=0.25)),)
    assert cfg.kind_settings_for().decay == 0.25
    assert cfg.replace(kernel_platform="cpu").kind_settings_for().platform == "cpu"
    assert cfg.kind_settings_for("gdn") is None  # a kind on a ModelConfig field's settings
    assert model_config("hwh", "tiny", la_kind="toy_ema").kind_settings_for().decay == 0.5

    heads_ = toy_kind.EMAHeads(cfg, 2, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    v = jax.random.normal(jax.random.key(1), (1, 6, 2 * cfg.la_value_dim))
    h, want = heads_.mix(v), np.zeros(v.shape[-1])
    for t in range(6):  # h_t = d h_{t-1} + (1 - d) v_t with d = 0.25
        want = 0.25 * want + 0.75 * np.asarray(v[0, t])
        np.testing.assert_allclose(np.asarray(h[0, t]), want, rtol=1e-5, atol=1e-6)

    with pytest.raises(ValueError, match=r"model.toy_ema has no setting \['nope'\]; EMASettings"):
        model_config("hwh", "tiny", la_kind="toy_ema", toy_ema={"nope": 1})
    with pytest.raises(ValueError, match=r"model.toy_ema: decay must be in \[0, 1\), got 1.5"):
        model_config("hwh", "tiny", la_kind="toy_ema", toy_ema={"decay": 1.5})
    with pytest.raises(ValueError, match="names 'gdn', which is not a linear-head kind with"):
        cfg.replace(kind_settings=(("gdn", toy_kind.EMASettings()),))
