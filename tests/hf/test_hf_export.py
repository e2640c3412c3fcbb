"""Export to Hugging Face format: the Transformer as a standard LlamaForCausalLM folder, every
other architecture with linear heads of a PyTorch form as HwhForCausalLM (its modeling code in
the folder); logits, cached decoding and greedy continuations equal the JAX model's, the
importers read the folders back exactly, and transformers alone loads them in a fresh Python;
what has no PyTorch form is refused in one line."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import main_job_run
from flax import nnx

from hwh_jax.data.paths import resolve
from hwh_jax.data.tokenizers import GPT2BPE
from hwh_jax.hf.export import export_hwh, export_llama, import_hwh
from hwh_jax.inference import Generator
from hwh_jax.models import HybridLM, model_config

PROMPTS = ["It was the best of times, it was the worst", "Call me Ishmael."]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A random-initialised tiny Transformer (GQA 2:1, untied head) exported in fp32."""
    cfg = model_config("transformer", "tiny", dtype="float32").replace(
        q_per_kv=2, tie_embeddings=False, rope_theta=5000.0, vocab_size=50304
    )
    model = HybridLM(cfg, rngs=nnx.Rngs(3))
    tok = GPT2BPE(resolve("gpt2_bpe"))
    out = tmp_path_factory.mktemp("hf")
    names = export_llama(model, cfg, tok, out, max_positions=256)
    return model, cfg, tok, out, names


def test_logits_generation_and_tokenizer_equal_the_jax_models(exported):
    """fp32: logits within 1e-4 of the JAX model's on prompts of 11 and 6 tokens (not a
    multiple of any chunk), 8 greedy tokens identical to the project's Generator, and the
    exported tokenizer encodes and decodes as the project's."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, cfg, tok, out, names = exported
    assert {"config.json", "model.safetensors", "vocab.json", "merges.txt"} <= set(names)
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(hf).__name__ == "LlamaForCausalLM"
    hf_tok = AutoTokenizer.from_pretrained(out)
    ids = [tok.encode(p) for p in PROMPTS]
    assert [hf_tok.encode(p) for p in PROMPTS] == ids and [len(i) for i in ids] == [11, 6]
    for row in ids:
        ours = np.asarray(model(jnp.asarray([row], jnp.int32)))
        with torch.no_grad():
            theirs = hf(torch.tensor([row])).logits.numpy()
        np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=1e-4)
    gen = Generator(model, eos_id=None, vocab=tok.vocab_size, pad_id=tok.pad_id)
    for row in ids:
        ours = gen.generate([row], 8)[0][0]
        with torch.no_grad():
            theirs = hf.generate(
                torch.tensor([row]), max_new_tokens=8, do_sample=False, pad_token_id=tok.eos_id
            )[0, len(row) :].tolist()
        assert theirs == ours
        assert hf_tok.decode(theirs) == tok.decode(ours)


def test_the_importer_reads_the_export_back_exactly(exported):
    from hwh_jax.hf.load import load_hf_checkpoint

    model, cfg, _, out, _ = exported
    back, back_cfg, _ = load_hf_checkpoint(out)
    assert back_cfg.layers == cfg.layers and back_cfg.q_per_kv == 2
    x = jnp.asarray([list(range(1, 30))], jnp.int32)
    np.testing.assert_array_equal(np.asarray(back(x)), np.asarray(model(x)))


def test_launch_export_hf_then_transformers_alone_generates_text(tmp_path):
    """The main job's run (configs/hwh_tiny.py: HwH, a trained SentencePiece vocabulary; 4
    steps) through ``launch.export_hf``, then a fresh Python that imports transformers and not
    this project encodes as the project does and generates from the folder."""
    from hwh_jax.training.restore import load_run

    work, out = main_job_run(), tmp_path / "hf"
    argv = ["launch.export_hf", f"--checkpoint={work}", f"--out={out}"]
    done = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "(step 4) -> " in done.stdout and "HwhForCausalLM, trust_remote_code=True" in done.stdout
    text = "It was  the best\n\nof times,\tit was"
    ids = load_run(str(work), None).tokenizer.encode(text)
    code = (
        "import sys; from transformers import AutoModelForCausalLM, AutoTokenizer; "
        f"m = AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True); "
        f"t = AutoTokenizer.from_pretrained({str(out)!r}, trust_remote_code=True); "
        f"print(t({text!r}).input_ids); "
        "g = m.generate(t('ROMEO:', return_tensors='pt').input_ids, max_new_tokens=5, do_sample=False); "
        "print(repr(t.decode(g[0]))); "
        "assert not [k for k in sys.modules if k.startswith('hwh_jax')]"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs, generated = done.stdout.strip().splitlines()[-2:]
    assert theirs == str(ids)
    assert generated.startswith("'ROMEO:") and len(generated) > len("'ROMEO:'")


def test_bfloat16_and_refusals(exported, tmp_path):
    import ml_dtypes
    from safetensors.numpy import load_file

    model, cfg, tok, _, _ = exported
    export_llama(model, cfg, tok, tmp_path / "bf16", max_positions=256, dtype="bfloat16")
    w = load_file(str(tmp_path / "bf16" / "model.safetensors"))["model.embed_tokens.weight"]
    assert w.dtype == ml_dtypes.bfloat16
    import torch
    from transformers import AutoModelForCausalLM

    hwh_model, hwh_cfg, _ = _hwh_export("hwh", tmp_path / "hwh_fp32")  # the same model in bf16:
    export_hwh(hwh_model, hwh_cfg, tok, tmp_path / "hwh_bf16", max_positions=64, dtype="bfloat16")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hwh_bf16", trust_remote_code=True)
    assert hf.dtype == torch.bfloat16
    row = list(range(5, 40))
    with torch.no_grad():
        theirs = hf(torch.tensor([row])).logits.float().numpy()
    ours = np.asarray(hwh_model(jnp.asarray([row], jnp.int32)))
    rms = lambda x: float(np.sqrt(np.mean(np.square(x))))
    assert rms(theirs - ours) < 0.05 * rms(ours)  # bf16 weights and products: a few % apart
    hwh = model_config("hwh", "tiny")
    with pytest.raises(ValueError, match="model.arch='hwh' has no Llama form: layer 0 has 8"):
        export_llama(jax.eval_shape(lambda: 0), hwh, tok, tmp_path / "x", max_positions=64)
    mamba = hwh.replace(la_kind="mamba2")
    with pytest.raises(ValueError, match="no PyTorch form here yet: its linear heads are 'mamba2'"):
        export_hwh(jax.eval_shape(lambda: 0), mamba, tok, tmp_path / "x", max_positions=64)
    other = type("Tok", (), {"name": "char", "eos_id": 1})()
    with pytest.raises(ValueError, match="tokenizer 'char' has no transformers form here"):
        export_llama(model, cfg, other, tmp_path / "other", max_positions=256)


# (arch, changes to its tiny config): every linear-head kind with a PyTorch form, RoPE and NoPE
# heads, a sliding window, GQA with q/k norms, learned positions without an MLP
HWH_CASES = {
    "hwh": ("hwh", {}),
    "gdn": ("gdn", {}),
    "layerwise": ("layerwise", {}),
    "swa_gqa_qknorm": (
        "swa",
        {"window": 8, "q_per_kv": 2, "qk_norm": True, "tie_embeddings": False},
    ),
    "hwh_deltanet": ("hwh", {"la_kind": "deltanet"}),
    "hwh_lightning_conv": ("hwh", {"la_kind": "lightning", "la_short_conv": True}),
    "hwh_retnet_nomlp_abspos": ("hwh", {"la_kind": "retnet", "mlp_hidden": 0, "abs_positions": 64}),
}


def _hwh_export(case, out):
    arch, changes = HWH_CASES[case]
    changes = dict(changes)
    window = changes.pop("window", None)  # of the SWA layers: 8, shorter than the test's rows
    cfg = model_config(arch, "tiny", dtype="float32", window=window).replace(
        vocab_size=50304, la_chunk_size=16, **changes
    )
    model = HybridLM(cfg, rngs=nnx.Rngs(5))
    # weights 6x their initial scale: logits that vary with the context, so that greedy and
    # beam continuations differ from row to row and a cache out of step changes them
    params = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda x: x * 6.0 if x.ndim == 2 else x, params))
    tok = GPT2BPE(resolve("gpt2_bpe"))
    export_hwh(model, cfg, tok, out, max_positions=64)
    return model, cfg, tok


@pytest.mark.parametrize("case", list(HWH_CASES))
def test_hwh_form_logits_and_cached_steps_equal_the_jax_models(case, tmp_path):
    """fp32, tolerance 1e-4: the whole-sequence logits of 37 tokens (chunks of 16: a partial
    last chunk), then the same sequence through the cache as a prompt of 21 tokens, a chunk of
    5 and 11 single tokens (the chunked form from a state, and the recurrent step)."""
    import torch
    from transformers import AutoModelForCausalLM

    model, cfg, _ = _hwh_export(case, tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True, dtype=torch.float32)
    assert type(hf).__name__ == "HwhForCausalLM"
    row = np.random.RandomState(1).randint(0, cfg.vocab_size, 37).tolist()
    ours = np.asarray(model(jnp.asarray([row], jnp.int32)))[0]
    pieces, cache, steps = [row[:21], row[21:26]] + [[t] for t in row[26:]], None, []
    with torch.no_grad():
        whole = hf(torch.tensor([row])).logits[0].numpy()
        for piece in pieces:
            out = hf(torch.tensor([piece]), cache=cache, use_cache=True)
            cache = out.cache
            steps.append(out.logits[0].numpy())
    np.testing.assert_allclose(whole, ours, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(np.concatenate(steps), ours, atol=1e-4, rtol=1e-4)
    for spec, layer in zip(cfg.layers, cache.layers, strict=True):  # windows keep window - 1 keys
        if spec.num_fa:
            assert layer["fa"]["k"].shape[1] == min(37, (spec.window or 99) - 1)


def test_hwh_form_generates_as_the_project_and_reads_back_exactly(tmp_path):
    """HwH: greedy continuations of two prompts, alone and left-padded in one batch, equal the
    project's Generator's; ``import_hwh`` gives logits identical to the exported model's."""
    import torch
    from transformers import AutoModelForCausalLM

    model, cfg, tok = _hwh_export("hwh", tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True, dtype=torch.float32)
    rows = [tok.encode(p) for p in PROMPTS]
    ours = Generator(model, eos_id=None, vocab=tok.vocab_size, pad_id=tok.pad_id).generate(rows, 8)[
        0
    ]
    L = max(map(len, rows))
    ids = torch.tensor([[tok.eos_id] * (L - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (L - len(r)) + [1] * len(r) for r in rows])
    with torch.no_grad():
        for r, o in zip(rows, ours):
            alone = hf.generate(torch.tensor([r]), max_new_tokens=8, do_sample=False)
            assert alone[0, len(r) :].tolist() == list(o)
        batch = hf.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    assert batch[:, L:].tolist() == [list(o) for o in ours]
    with torch.no_grad():  # beam search (the cache reordered) and sampling: as without a cache
        for kw in (dict(num_beams=3, do_sample=False), dict(do_sample=True, top_k=50)):
            runs = []
            for use_cache in (True, False):
                torch.manual_seed(0)
                runs.append(
                    hf.generate(
                        ids, attention_mask=mask, max_new_tokens=6, use_cache=use_cache, **kw
                    )
                )
            assert runs[0].tolist() == runs[1].tolist()
    back, back_cfg = import_hwh(tmp_path)
    assert back_cfg.layers == cfg.layers and back_cfg.la_kind == "gdn"
    x = jnp.asarray([list(range(1, 30))], jnp.int32)
    np.testing.assert_array_equal(np.asarray(back(x)), np.asarray(model(x)))


def test_hwh_form_gradients_equal_the_jax_models(tmp_path):
    """Fine-tuning in PyTorch: the next-token loss of 37 tokens and every parameter's gradient
    (autograd through the chunked form) equal the JAX model's (fp32; gradients within 1e-4 of
    the largest)."""
    import optax
    import torch
    from transformers import AutoModelForCausalLM

    from hwh_jax.hf.export import _to_torch, torch_name
    from hwh_jax.hf.load import param_path

    model, cfg, _ = _hwh_export("hwh", tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True, dtype=torch.float32)
    row = np.random.RandomState(2).randint(0, cfg.vocab_size, 37).tolist()
    tokens = jnp.asarray([row], jnp.int32)

    def loss_fn(m):
        logits = m(tokens)[:, :-1]
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    out = hf(torch.tensor([row]), labels=torch.tensor([row]))
    out.loss.backward()
    assert out.loss.item() == pytest.approx(float(loss), rel=1e-5)
    theirs = dict(hf.named_parameters())
    flat = jax.tree_util.tree_flatten_with_path(nnx.state(grads, nnx.Param))[0]
    assert len(flat) == len(theirs)
    for p, g in flat:
        name, how = torch_name(param_path(p))
        ours = _to_torch(np.asarray(g), how)
        got = theirs[name].grad.numpy()
        np.testing.assert_allclose(got, ours, atol=1e-4 * np.abs(ours).max() + 1e-7, err_msg=name)
