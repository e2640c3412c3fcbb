r"""A trained run as a Hugging Face folder: ``python -m launch.export_hf --checkpoint=RUN
--out=DIR [--dtype=bfloat16] [--step=N]``.

Writes ``config.json``, ``model.safetensors``, ``generation_config.json`` and the tokenizer's
files, which ``transformers.AutoModelForCausalLM.from_pretrained(DIR)`` and
``AutoTokenizer.from_pretrained(DIR)`` load without this project: the Transformer as Llama, the
hybrids and linear-attention models with the modeling code written beside them
(``trust_remote_code=True``; ``hwh_jax.training.hf_export`` says which linear heads have a
PyTorch form; the others are refused in one line).
"""

from absl import flags

from launch import begin, one_line_errors, run_main

flags.DEFINE_string("checkpoint", None, "launch.train workdir")
flags.DEFINE_integer("step", None, "checkpoint step (default: the newest that proves itself)")
flags.DEFINE_string("out", None, "folder to write")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "dtype of the saved weights")
flags.mark_flags_as_required(["checkpoint", "out"])
FLAGS = flags.FLAGS


def main(argv):
    del argv
    begin()
    with one_line_errors():
        export()


def export():
    from hwh_jax.training.hf_export import export
    from hwh_jax.training.restore import load_run

    run = load_run(FLAGS.checkpoint, FLAGS.step)
    form, names = export(
        run.model,
        run.model_cfg,
        run.tokenizer,
        FLAGS.out,
        max_positions=int(run.config.seq_len),
        dtype=FLAGS.dtype,
    )
    how = "LlamaForCausalLM" if form == "llama" else "HwhForCausalLM, trust_remote_code=True"
    print(f"{run.name} (step {run.step}) -> {FLAGS.out} ({how}): {', '.join(names)}", flush=True)


if __name__ == "__main__":
    run_main(main)
