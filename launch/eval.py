r"""Evaluate trained runs: ``python -m launch.eval --checkpoint=runs/a,runs/b --suite=niah,ppl``.

In a job of several processes each computes the whole evaluation on its own devices and the
first writes it. Writes, under ``--out`` (default ``<first checkpoint>/evals/<suites>_step<N>``,
never the training run's own closing evaluation in ``<workdir>/eval``): one folder per run with its
``results.json``, NIAH heatmaps (depth x length per task) and perplexity by position, plus the
cross-model extrapolation chart and perplexity chart. The logic is ``hwh_jax.eval.suite``.
"""

import json

from absl import flags

from hwh_jax import storage
from launch import begin, first_process_writes, one_line_errors, run_main

flags.DEFINE_list("checkpoint", None, "launch.train workdir(s), comma-separated")
flags.DEFINE_string("out", "", "output folder (default <first checkpoint>/evals/<suites>_step<N>)")
flags.DEFINE_integer("step", None, "checkpoint step (default: the newest)")
# Evaluation settings: unset flags keep hwh_jax.eval.EvalSpec's defaults (its docstring).
flags.DEFINE_list(
    "suite",
    None,
    "any of niah, mqar, ppl, longppl, retrieval, commonsense, and lm_eval:TASK[,TASK...] "
    "(lm-evaluation-harness tasks: the shipped hwh_<task> or the harness's own)",
)
flags.DEFINE_list(
    "niah_tasks",
    None,
    "default niah_single_1,2,3; also niah_multikey_1/2/3, niah_multivalue, niah_multiquery",
)
flags.DEFINE_list("niah_factors", None, "NIAH lengths as multiples of the training length")
flags.DEFINE_integer("niah_depths", None, "evenly spaced needle depths (RULER uses 40)")
flags.DEFINE_integer("niah_samples", None, "samples per (length, depth)")
flags.DEFINE_integer("ppl_factor", None, "perplexity windows of this many training lengths")
flags.DEFINE_string("ppl_text", None, "text file for perplexity (default: held-out split)")
flags.DEFINE_list("commonsense_tasks", None, "default: all seven")
flags.DEFINE_integer("commonsense_limit", None, "first N examples per task (0 = all)")
flags.DEFINE_integer("lm_eval_limit", None, "first N examples per harness task (0 = all)")
flags.DEFINE_integer("mqar_examples", None, "sequences per MQAR setting")
flags.DEFINE_integer("longppl_factor", None, "LongPPL windows as multiples of the training length")
flags.DEFINE_integer(
    "longppl_short", None, "LongPPL's short context in tokens (default: the training length)"
)
flags.DEFINE_string(
    "longppl_evaluator",
    None,
    "a launch.train workdir whose model chooses "
    "LongPPL's key tokens (default: each evaluated model itself)",
)
flags.DEFINE_integer("batch_size", None, "sequences per forward / generate call")
flags.mark_flags_as_required(["checkpoint"])
FLAGS = flags.FLAGS
SPEC_FLAGS = {
    "suite": ("suites", tuple),
    "niah_tasks": ("niah_tasks", tuple),
    "niah_factors": ("niah_factors", lambda v: tuple(float(f) for f in v)),
    "niah_depths": ("niah_depths", int),
    "niah_samples": ("niah_samples", int),
    "ppl_factor": ("ppl_factor", int),
    "ppl_text": ("ppl_text", str),
    "commonsense_tasks": ("commonsense_tasks", tuple),
    "commonsense_limit": ("commonsense_limit", int),
    "lm_eval_limit": ("lm_eval_limit", int),
    "mqar_examples": ("mqar_examples", int),
    "batch_size": ("batch_size", int),
    "longppl_factor": ("longppl_factor", int),
    "longppl_short": ("longppl_short", int),
}


def main(argv):
    del argv
    begin()
    with one_line_errors():
        evaluate()


def evaluate():
    from hwh_jax.eval import suite

    given = {
        field: cast(FLAGS[name].value)
        for name, (field, cast) in SPEC_FLAGS.items()
        if FLAGS[name].value is not None
    }
    given.update(_harness_tasks(given.get("suites", ())))
    spec = suite.EvalSpec(**given)
    spec.validate()  # before loading anything
    with first_process_writes(FLAGS.out or default_out(spec.suites)) as out:
        _evaluate(spec, out)


def _harness_tasks(items) -> dict:
    """``--suite`` with ``lm_eval:TASK`` items: the suite "lm_eval" and its tasks, each
    ``lm_eval:`` item and the items after it that are not suites (``lm_eval:hwh_arc_easy,
    hwh_piqa``)."""
    from hwh_jax.eval import suite

    suites, tasks, harness = [], [], False
    for item in items:
        if item.startswith("lm_eval:"):
            harness = True
            tasks.append(item[len("lm_eval:") :])
            if "lm_eval" not in suites:
                suites.append("lm_eval")
        elif harness and item not in suite.SUITES:
            tasks.append(item)
        else:
            harness = False
            suites.append(item)
    return {"suites": tuple(suites), "lm_eval_tasks": tuple(tasks)} if tasks else {}


def default_out(suites) -> storage.PathLike:
    """``<first checkpoint>/evals/<suites>_step<N>``: a folder of its own for each evaluation
    (N: ``--step`` or the newest checkpoint's), apart from the training's ``eval/``."""
    run = storage.path(FLAGS.checkpoint[0])
    folder = run / "checkpoints"
    steps = (
        sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.exists() else []
    )
    step = FLAGS.step if FLAGS.step is not None else (steps[-1] if steps else "latest")
    return run / "evals" / f"{'+'.join(suites)}_step{step}"


def _evaluate(spec, out: storage.PathLike):
    from hwh_jax.eval import suite
    from hwh_jax.training.restore import load_run

    results = []
    evaluator = load_run(FLAGS.longppl_evaluator).eval_model() if FLAGS.longppl_evaluator else None
    for i, ckpt in enumerate(FLAGS.checkpoint):
        loaded = load_run(ckpt, FLAGS.step)
        print(f"== {loaded.name} (step {loaded.step})", flush=True)
        results.append(
            suite.run_suite(
                loaded.eval_model(),
                spec,
                out / f"{i}_{loaded.name.replace('@', '_')}",
                evaluator=evaluator,
            )
        )
    suite.compare(results, out)
    (out / "summary.json").write_text(
        json.dumps([{k: r[k] for k in r if k not in ("niah",)} for r in results], indent=2)
    )
    print(f"results and plots in {out}", flush=True)


if __name__ == "__main__":
    run_main(main)
