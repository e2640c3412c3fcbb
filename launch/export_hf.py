r"""A trained run as a Hugging Face folder: ``python -m launch.export_hf --checkpoint=RUN
--out=DIR [--dtype=bfloat16] [--step=N]``.

Writes ``config.json``, ``model.safetensors``, ``generation_config.json`` and the tokenizer's
files, which ``transformers.AutoModelForCausalLM.from_pretrained(DIR)`` and
``AutoTokenizer.from_pretrained(DIR)`` load without this project: the Transformer as Llama, the
hybrids and linear-attention models with the modeling code written beside them
(``trust_remote_code=True``; ``hwh_jax.hf.export`` says which linear heads have a
PyTorch form; the others are refused in one line).
"""

from absl import flags

from launch import begin, one_line_errors, run_main

flags.DEFINE_string("checkpoint", None, "launch.train workdir")
flags.DEFINE_integer("step", None, "checkpoint step (default: the newest that proves itself)")
flags.DEFINE_string("out", None, "folder to write")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "dtype of the saved weights")
flags.DEFINE_integer(
    "max_length",
    2048,
    "the longest input config.json declares (max_position_embeddings; lm-eval's hf model cuts "
    "its inputs to it), at least the training length: the length lm-eval's hwh model scores at "
    "by default; the training length is written beside it (trained_length)",
)
flags.mark_flags_as_required(["checkpoint", "out"])
FLAGS = flags.FLAGS


def main(argv):
    del argv
    begin()
    with one_line_errors():
        export()


def export():
    from hwh_jax.hf.export import export
    from hwh_jax.training.restore import load_run

    run = load_run(FLAGS.checkpoint, FLAGS.step)
    trained = run.train.seq_len
    longest = max(trained, FLAGS.max_length)
    if run.model_cfg.abs_positions:  # learned positions: no further than the table
        longest = min(longest, run.model_cfg.abs_positions)
    form, names = export(
        run.model,
        run.model_cfg,
        run.tokenizer,
        FLAGS.out,
        max_positions=longest,
        dtype=FLAGS.dtype,
        trained_length=trained,
    )
    how = "LlamaForCausalLM" if form == "llama" else "HwhForCausalLM, trust_remote_code=True"
    print(f"{run.name} (step {run.step}) -> {FLAGS.out} ({how}): {', '.join(names)}", flush=True)


if __name__ == "__main__":
    run_main(main)
