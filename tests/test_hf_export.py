"""Export to Hugging Face format: the Transformer as a standard LlamaForCausalLM folder whose
logits and greedy continuations equal the JAX model's, read back exactly by the importer, and
loaded with transformers alone in a fresh Python; architectures without a PyTorch form are
refused in one line."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hwh_jax.data.paths import resolve
from hwh_jax.data.tokenizers import GPT2BPE
from hwh_jax.inference import Generator
from hwh_jax.models import HybridLM, model_config
from hwh_jax.training.hf_export import export_llama

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
    from hwh_jax.analysis.hf_import import load_hf_checkpoint

    model, cfg, _, out, _ = exported
    back, back_cfg, _ = load_hf_checkpoint(out)
    assert back_cfg.layers == cfg.layers and back_cfg.q_per_kv == 2
    x = jnp.asarray([list(range(1, 30))], jnp.int32)
    np.testing.assert_array_equal(np.asarray(back(x)), np.asarray(model(x)))


def test_launch_export_hf_then_transformers_alone_generates_text(tmp_path):
    """A trained run (tiny Transformer, GPT-2 BPE, 4 steps) through ``launch.export_hf``, then a
    fresh Python that imports transformers and not this project generates from the folder."""
    from hwh_jax.data.sources import read_text

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(read_text(resolve("tinyshakespeare/input.txt.gz"))[:60_000])
    work, out = tmp_path / "run", tmp_path / "hf"
    for argv in (
        [
            "launch.train",
            "--config=configs/base.py:transformer_tiny",
            f"--workdir={work}",
            "--config.seq_len=64",
            "--config.data.tokenizer=gpt2",
            f"--config.data.paths=('{corpus}',)",
            "--config.data.heldout_fraction=0.1",
            "--config.train.steps=4",
            "--config.train.batch_size=4",
            "--config.train.warmup_steps=1",
            "--config.train.eval_every=0",
            "--config.train.mesh=1,1,1",
            "--config.eval.at_end=False",
        ],
        ["launch.export_hf", f"--checkpoint={work}", f"--out={out}"],
    ):
        done = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
    assert "transformer@run (step 4) -> " in done.stdout
    code = (
        "import sys; from transformers import AutoModelForCausalLM, AutoTokenizer; "
        f"m = AutoModelForCausalLM.from_pretrained({str(out)!r}); "
        f"t = AutoTokenizer.from_pretrained({str(out)!r}); "
        "ids = t('It was', return_tensors='pt').input_ids; "
        "g = m.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=t.eos_token_id); "
        "print(repr(t.decode(g[0]))); "
        "assert not [k for k in sys.modules if k.startswith('hwh_jax')]"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().startswith("'It was") and len(done.stdout.strip()) > 9


def test_bfloat16_and_refusals(exported, tmp_path):
    import ml_dtypes
    from safetensors.numpy import load_file

    model, cfg, tok, _, _ = exported
    export_llama(model, cfg, tok, tmp_path / "bf16", max_positions=256, dtype="bfloat16")
    w = load_file(str(tmp_path / "bf16" / "model.safetensors"))["model.embed_tokens.weight"]
    assert w.dtype == ml_dtypes.bfloat16
    hwh = model_config("hwh", "tiny")
    with pytest.raises(ValueError, match="model.arch='hwh' has no PyTorch form here yet: layer"):
        export_llama(jax.eval_shape(lambda: 0), hwh, tok, tmp_path / "x", max_positions=64)
    sp = type("SP", (), {"name": "sp_0123", "eos_id": 1})()
    with pytest.raises(ValueError, match="tokenizer 'sp_0123' has no exact transformers form"):
        export_llama(model, cfg, sp, tmp_path / "sp", max_positions=256)
