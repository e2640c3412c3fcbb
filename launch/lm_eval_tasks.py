r"""The shipped evaluation sets as lm-eval tasks in a folder, for lm-eval's ``--include_path``:
``python -m launch.lm_eval_tasks --out=DIR [--tasks=hwh_piqa,harness_piqa] [--limit=N]``, then
``python -m launch.lm_eval --model hwh --model_args pretrained=RUN --tasks hwh_piqa
--include_path DIR`` (or the plain ``lm_eval --model hf`` on an exported folder).

Writes ``hwh_<task>`` (the in-house suite's prompts as harness YAML) and ``harness_<task>`` (the
harness's own YAML of the task over the same examples) with their JSONL, no download: the folder
``python -m launch.lm_eval`` writes for itself on every run (``hwh_jax.eval.harness``). The YAML
names the JSONL by absolute path: move the folder and write it again.
"""

from absl import flags

from hwh_jax.eval import commonsense
from launch import one_line_errors, run_main

ALL = [f"{kind}_{t}" for kind in ("hwh", "harness") for t in commonsense.TASKS]
ALL.append("harness_wikitext2")  # rolling log-likelihood over the shipped WikiText-2 articles

flags.DEFINE_string("out", None, "folder to write the tasks into")
flags.DEFINE_list("tasks", ALL, "hwh_<task> and harness_<task> names")
flags.DEFINE_integer("limit", None, "the first N examples of each task (default: all)")
flags.mark_flags_as_required(["out"])
FLAGS = flags.FLAGS


def main(argv):
    del argv
    from hwh_jax.eval import harness

    with one_line_errors():
        unknown = [t for t in FLAGS.tasks if t not in ALL]
        if unknown:
            raise ValueError(f"--tasks: no shipped task {unknown}; shipped: {','.join(ALL)}")
        harness.task_folder(FLAGS.tasks, folder=FLAGS.out, limit=FLAGS.limit)
    print(f"{len(FLAGS.tasks)} tasks -> {FLAGS.out} (lm_eval --include_path {FLAGS.out})")


if __name__ == "__main__":
    run_main(main)
