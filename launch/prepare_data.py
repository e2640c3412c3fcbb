r"""Tokenise a corpus once, in parallel, into token shards that training streams.

  python -m launch.prepare_data --input=/data/fineweb_edu/ --tokenizer=gpt2 --out=/data/fwe_gpt2
  python -m launch.prepare_data --tfds_name=fineweb_edu --tfds_split=train --out=/data/fwe_gpt2
  python -m launch.train --config=configs/hwh_1b4.py --workdir=DIR \
      --config.data.source=shards "--config.data.paths=('/data/fwe_gpt2',)"

Inputs: text files or folders of them (``.txt``, ``.txt.gz``, ``.zip``, ``.jsonl``, ``.jsonl.gz``,
``.parquet``; ``--text_field`` names the text of JSON lines and Parquet rows), or a prepared TFDS
dataset. Writes ``OUT/tokens-NNNNN.array_record`` and ``OUT/manifest.json`` (the tokenizer and
its hash, documents, tokens, source, date); stopped, it resumes where its last shard ended when
run again. Prints progress (documents, tokens/s, MiB/s of text, ETA). The logic is
``hwh_jax.data.shards``; docs/training.md ("Data at scale") has the figures.
"""

import os

from absl import flags

from launch import one_line_errors, run_main, setup_logging

flags.DEFINE_list("input", [], "text files or folders")
flags.DEFINE_string("text_field", "text", "the text field of JSON lines / Parquet rows")
flags.DEFINE_string("tfds_name", "", "a prepared TFDS dataset instead of --input")
flags.DEFINE_string("tfds_split", "train", "its split")
flags.DEFINE_string("tfds_data_dir", "", "its data_dir (default: TFDS's)")
flags.DEFINE_enum("tokenizer", "gpt2", ["gpt2", "sentencepiece"], "GPT-2 BPE or a .model")
flags.DEFINE_string("sp_model", "", "the SentencePiece .model for --tokenizer=sentencepiece")
flags.DEFINE_enum("decode_errors", "replace", ["replace", "strict"], "invalid UTF-8 in text")
flags.DEFINE_integer("workers", 0, "tokenising processes (0: every core)")
flags.DEFINE_string("out", None, "the prepared folder")
flags.mark_flags_as_required(["out"])
FLAGS = flags.FLAGS


def main(argv):
    del argv
    setup_logging()
    with one_line_errors():
        prepare()


def prepare():
    from hwh_jax.data import shards, sources
    from hwh_jax.data.pipeline import DataSpec, load_tokenizer

    if bool(FLAGS.input) == bool(FLAGS.tfds_name):
        raise ValueError("give --input (files or folders) or --tfds_name, one of them")
    spec = DataSpec(
        source="tfds" if FLAGS.tfds_name else "text",
        paths=tuple(FLAGS.input),
        text_field=FLAGS.text_field,
        tfds_name=FLAGS.tfds_name,
        tfds_split=FLAGS.tfds_split,
        tfds_data_dir=FLAGS.tfds_data_dir,
        tokenizer=FLAGS.tokenizer,
        sp_model=FLAGS.sp_model,
        decode_errors=FLAGS.decode_errors,
    )
    spec.validate()
    tokenizer = load_tokenizer(spec)
    if FLAGS.tfds_name:
        documents = sources.tfds_documents(
            FLAGS.tfds_name,
            FLAGS.tfds_split,
            data_dir=FLAGS.tfds_data_dir or None,
            text_field=FLAGS.text_field,
        )
        source, size = {"tfds": FLAGS.tfds_name, "split": FLAGS.tfds_split}, None
    else:
        from hwh_jax.data.paths import resolve

        files = sources.expand([resolve(p) for p in FLAGS.input])
        documents = (
            d
            for f in files
            for d in sources.text_documents(f, FLAGS.text_field, FLAGS.decode_errors)
        )
        source = {"paths": [str(f) for f in files], "text_field": FLAGS.text_field}
        size = sum(f.stat().st_size for f in files)
    shards.prepare(
        documents,
        tokenizer,
        FLAGS.out,
        source=source,
        workers=FLAGS.workers or os.cpu_count() or 1,
        total_chars=size,
    )


if __name__ == "__main__":
    run_main(main)
