r"""Generate text from a trained run: ``python -m launch.generate --checkpoint=runs/x
--prompt="It was the best of times" --max_new_tokens=64 [--temperature=0.8 --top_p=0.95]``.

Several ``--prompt`` flags make one batch (left-padded, decoded together). Prints the
continuations, prefill and decode timings, and the decode cache's memory at this length.
"""

from absl import flags

from launch import begin, first_process_writes, one_line_errors, run_main

flags.DEFINE_string("checkpoint", None, "launch.train workdir")
flags.DEFINE_integer("step", None, "checkpoint step (default: the newest that proves itself)")
flags.DEFINE_multi_string("prompt", ["It was"], "prompt text (repeat for a batch)")
flags.DEFINE_integer("max_new_tokens", 64, "tokens to generate per prompt")
flags.DEFINE_float("temperature", 0.0, "0 = greedy")
flags.DEFINE_float("top_p", 1.0, "nucleus sampling mass")
flags.DEFINE_integer("seed", 0, "sampling seed")
flags.DEFINE_integer("prefill_chunk", 0, "prefill long prompts in chunks of this many tokens")
flags.mark_flags_as_required(["checkpoint"])
FLAGS = flags.FLAGS


def main(argv):
    del argv
    begin()
    with one_line_errors(), first_process_writes():  # several processes: the first prints
        generate()


def generate():
    from hwh_jax.inference import Generator, cache_bytes
    from hwh_jax.training.restore import load_run

    run = load_run(FLAGS.checkpoint, FLAGS.step)
    print(f"== {run.name} (step {run.step})", flush=True)
    tok = run.tokenizer
    gen = Generator(
        run.model,
        eos_id=tok.eos_id,
        vocab=tok.vocab_size,
        pad_id=tok.pad_id,
        prefill_chunk=FLAGS.prefill_chunk,
    )
    prompts = [tok.encode(p) for p in FLAGS.prompt]
    outs, timing = gen.generate(
        prompts,
        FLAGS.max_new_tokens,
        temperature=FLAGS.temperature,
        top_p=FLAGS.top_p,
        seed=FLAGS.seed,
    )
    for text, ids, out in zip(FLAGS.prompt, prompts, outs):
        # decoded with its prompt, so the tokenizer places the space between them
        print(f"--- {text!r}\n{text}{continuation(tok, ids, list(out))}\n")
    length = timing["padded_prompt"] + FLAGS.max_new_tokens
    mem = cache_bytes(run.model_cfg, len(prompts), length)
    steps = FLAGS.max_new_tokens
    print(
        f"prefill {timing['prefill_s']:.3f}s ({timing['padded_prompt']} tokens x "
        f"{len(prompts)}), decode {timing['decode_s']:.3f}s for {steps} steps "
        f"(incl. compile on first use); cache {mem['total'] / 2**20:.2f} MiB at length "
        f"{length} (FA {mem['fa'] / 2**20:.2f}, GDN {mem['la'] / 2**20:.2f})",
        flush=True,
    )


def continuation(tok, prompt_ids, out_ids) -> str:
    """The text ``out_ids`` add after the prompt (SentencePiece drops a leading space when a
    continuation is decoded alone: "It was" + "the" -> "It wasthe")."""
    prompt = tok.decode(prompt_ids)
    full = tok.decode(list(prompt_ids) + out_ids)
    return full[len(prompt) :] if full.startswith(prompt) else tok.decode(out_ids)


if __name__ == "__main__":
    run_main(main)
