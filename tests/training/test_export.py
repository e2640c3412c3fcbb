"""The training step, prefill and decode lowered for TPU (and the training step and the decay
kernels for CUDA) on this CPU host through ``jax.export``: the Pallas kernels must be in the
program where they are meant to run (Mosaic custom calls on TPU, Triton ones on GPU), lowered
with their platform's checks, and the weights' shardings over an 8-device FSDP mesh must be in
the module."""

import jax
import pytest

from configs import base
from hwh_jax.models import model_config
from hwh_jax.training import export

pytestmark = pytest.mark.skipif(
    jax.device_count() < 8, reason="needs 8 devices (conftest's CPU devices)"
)

GDN_TRAIN = {
    "gdn_wy_inverse",
    "gdn_wy_apply",
    "gdn_scan_fwd",
    "gdn_scan_bwd",
    "gdn_state_grads",
    "gdn_wy_bwd",
}
SPLASH_TRAIN = {  # train.document_mask (the default): splash's kernels that take segment ids
    "splash_mqa_fwd_segmented_residuals",
    "splash_mqa_dkv_segmented_no_residuals",
    "splash_mqa_dq_segmented_no_residuals",
}


def config_380m(arch, size="380m", **model):
    config = base.get_config(f"{arch}_{size}")
    config.train.batch_size = 16
    config.train.mesh = (1, 8, 1)
    for k, v in model.items():
        if isinstance(v, dict):  # a kernel op's settings
            getattr(config.model, k).update(v)
        else:
            setattr(config.model, k, v)
    return config


@pytest.mark.parametrize(
    "arch,kernels", [("hwh", GDN_TRAIN | SPLASH_TRAIN), ("transformer", SPLASH_TRAIN)]
)
def test_the_380m_training_step_lowers_for_tpu_with_its_mosaic_kernels(arch, kernels):
    summary = export.summarize(
        export.export_train_step(config_380m(arch), platform="tpu", mesh=(1, 8, 1))
    )
    assert summary["platforms"] == ["tpu"] and summary["devices"] == 8
    assert set(summary["kernels"]) == kernels, summary["kernels"]
    assert summary["custom_calls"] == {"tpu_custom_call": sum(summary["kernels"].values())}
    assert '"fsdp"=8' in summary["mesh"]
    sharded = sum(n for spec, n in summary["input_shardings"].items() if '"fsdp"' in spec)
    assert sharded > 100  # the weights and their moments over fsdp


def test_prefill_and_decode_lower_for_tpu():
    steps = export.export_inference_steps(
        model_config("hwh", "380m"), platform="tpu", batch=2, context=4096
    )
    prefill, decode = (export.summarize(steps[k]) for k in ("prefill", "decode"))
    assert set(prefill["kernels"]) == {
        "gdn_wy_inverse",
        "gdn_wy_apply",
        "gdn_scan_fwd",
        "splash_mqa_fwd_no_residuals",
    }
    assert decode["kernels"] == {} and decode["platforms"] == ["tpu"]  # one token: XLA


def test_the_training_step_lowers_for_cuda_with_its_triton_kernels():
    # cuDNN's attention checks its library at trace time, which this host lacks
    summary = export.summarize(
        export.export_train_step(
            config_380m("hwh", attention={"impl": "reference"}), platform="gpu", mesh=(1, 8, 1)
        )
    )
    assert summary["platforms"] == ["cuda"]
    assert GDN_TRAIN | {
        "short_conv_fwd",
        "short_conv_bwd",
        "short_conv_dx",
        "rms_norm_fwd",
        "rms_norm_bwd",
        "softmax_xent",
    } == set(summary["kernels"])


def test_a_kernel_taken_off_the_tpu_path_or_a_bad_block_fails_the_export(monkeypatch):
    """What the tests above would see if the TPU path lost its GDN kernels (at `small` and 512
    tokens: the size does not change which kernels a path takes), and that Mosaic's
    block-shape check runs here (a value block of 96 columns is not a multiple of 128)."""
    from kernels_pallas import GDNSettings

    monkeypatch.setattr(GDNSettings, "AUTO", {"gpu": "pallas"})
    config = config_380m("hwh", size="small")
    config.seq_len = 512
    summary = export.summarize(export.export_train_step(config, platform="tpu", mesh=(1, 8, 1)))
    assert not GDN_TRAIN & set(summary["kernels"])
    monkeypatch.undo()
    import jax.numpy as jnp

    from kernels_pallas import gated_delta_rule

    x = jax.ShapeDtypeStruct((1, 128, 2, 128), jnp.bfloat16)
    gate = jax.ShapeDtypeStruct((1, 128, 2), jnp.float32)
    bad = GDNSettings(impl="pallas", platform="tpu", block_v=96)
    with pytest.raises(ValueError, match="divisible by 8 and 128"):
        jax.export.export(
            jax.jit(lambda *a: gated_delta_rule(*a, settings=bad)[0]), platforms=["tpu"]
        )(x, x, jax.ShapeDtypeStruct((1, 128, 2, 192), jnp.bfloat16), gate, gate)


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_the_decay_kernels_lower_with_their_gradients(platform):
    """Gated linear attention's Pallas kernels, a decay per head and per key dimension, forward
    and backward at a training shape (bf16, K = V = 128, chunks of 64), lowered for CUDA (Triton)
    and TPU (Mosaic, with its block-shape checks)."""
    import jax.numpy as jnp

    from kernels_pallas import DecaySettings, decay_attention

    settings = DecaySettings(impl="pallas", platform=platform)
    x = jax.ShapeDtypeStruct((2, 256, 4, 128), jnp.bfloat16)
    want = {
        3: {
            "linear_scan_fwd",
            "linear_scan_out",
            "linear_scan_bwd",  # no delta rule
            "linear_state_grads",
            "linear_score_grads",
        },
        4: {
            "chunk_cumsum",
            "gla_scan_fwd",
            "gla_scan_out",
            "gla_scan_bwd",
            "gla_state_grads",
            "gla_values_grad",
            "gla_intra_fwd",
            "gla_intra_fwd_exact",
            "gla_intra_bwd",
            "gla_intra_bwd_exact",
        },
    }
    for g_dims, kernels in want.items():
        g = jax.ShapeDtypeStruct((2, 256, 4, 128)[:g_dims], jnp.float32)

        def fwd_bwd(q, k, v, g):
            o, vjp = jax.vjp(lambda *a: decay_attention(*a, settings=settings)[0], q, k, v, g)
            return vjp(o)

        summary = export.summarize(export._export(jax.jit(fwd_bwd), platform)(x, x, x, g))
        assert set(summary["kernels"]) == kernels, summary["kernels"]


def test_the_decode_step_lowers_for_cuda_with_its_attention_and_product_kernels():
    """One decode token on a GPU at 8 rows: every layer with FA heads reads its cache through
    the decode kernel (Triton), not the fp32 reference, and the products are XLA's GEMMs; at
    one row each layer's four products (the mixer's fused inputs, o_proj, the MLP's gate and
    up as one, down) run the few-row product kernel."""
    cfg = model_config(
        "hwh", "380m", attention={"impl": "reference"}
    )  # cuDNN: no library on this host
    decode = export.summarize(
        export.export_inference_steps(cfg, platform="gpu", batch=8, context=4096)["decode"]
    )
    assert decode["platforms"] == ["cuda"]
    assert decode["kernels"]["decode_attention"] == sum(n > 0 for n in cfg.fa_heads) == 22
    assert "skinny_matmul" not in decode["kernels"]
    one = export.summarize(
        export.export_inference_steps(cfg, platform="gpu", batch=1, context=4096)["decode"]
    )
    assert one["kernels"]["skinny_matmul"] == 4 * cfg.num_layers
