r"""lm-evaluation-harness over trained runs: ``python -m launch.lm_eval --model hwh
--model_args pretrained=RUN --tasks hwh_arc_easy,hwh_piqa [any lm_eval argument]``.

lm-eval's own command line (``lm_eval``'s arguments, its output and ``--output_path``) with the
project's model registered as ``hwh`` (``RunLM``: a run scored by ``hwh_jax.eval.harness``) and
the shipped evaluation sets as tasks (arc_easy, arc_challenge, piqa, openbook_qa, hellaswag,
winogrande, lambada_openai), no download: ``hwh_<task>`` (the in-house suite's prompts as
harness YAML) and ``harness_<task>`` (the harness's own YAML of the task over the same
examples), written for ``--include_path`` when a task of those names is asked for. lm-eval
finds models only in the registry its own package fills (no plugin or entry-point discovery in
0.4.x), so this command, which registers ``RunLM`` before lm-eval parses its arguments, is how
lm-eval runs the model; it also runs on several processes. The harness's own tasks run by name
where their datasets are cached. An exported folder (``launch.export_hf``) runs under the
plain command as ``lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True``.

Several processes (one model sharded over hosts; every host the same command): each starts
``jax.distributed`` as the other launchers do and runs every request in step with the others
(the model reports itself to lm-eval as one process); the first process writes
(``--output_path``, ``--log_samples``, W&B and Hub logging) and prints the results, the others
run with those arguments removed and their console output dropped.
"""

import contextlib
import multiprocessing
import os
import shutil
import sys

import launch

# lm-eval's arguments that write or upload results: given to the first process only
WRITERS = {
    "--output_path": 1,
    "-o": 1,
    "--log_samples": 0,
    "-s": 0,
    "--wandb_args": 1,
    "--wandb_config_args": 1,
    "--hf_hub_log_args": 1,
}


def main():
    from lm_eval.__main__ import cli_evaluate

    register()  # starts the process set-up first
    import jax

    from hwh_jax.eval import harness

    argv = first_process_argv(sys.argv[1:], jax.process_index())
    folder = harness.task_folder((_value(argv, "--tasks") or "").split(","))
    if folder is not None and _value(argv, "--include_path") is None:
        argv += ["--include_path", folder]
    sys.argv = [sys.argv[0], *argv]
    try:
        with contextlib.ExitStack() as stack:
            if jax.process_index():  # the first process prints the results
                devnull = stack.enter_context(open(os.devnull, "w"))
                stack.enter_context(contextlib.redirect_stdout(devnull))
            cli_evaluate()
    finally:  # the shipped tasks' JSONL and YAML, written for this run
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


_started = False


def start() -> None:
    """Once a process: lm-eval's worker pools spawned, not forked, and ``launch.begin``."""
    global _started
    if _started:
        return
    # lm-eval bootstraps some metrics' stderr in a process pool: forked from a process running
    # JAX (many threads) that can deadlock, so the pool's processes start fresh
    multiprocessing.set_start_method("spawn", force=True)
    launch.begin()  # jax.distributed where several processes run the job
    _started = True


def first_process_argv(argv, process_index: int) -> list[str]:
    """``argv`` for the process ``process_index``: as given on the first, without ``WRITERS``
    (and their values) on the others."""
    if process_index == 0:
        return list(argv)
    out, skip = [], 0
    for a in argv:
        if skip:
            skip -= 1
            continue
        name = a.split("=", 1)[0]
        if name in WRITERS:
            skip = WRITERS[name] if "=" not in a else 0
            continue
        out.append(a)
    return out


def check_args(argv) -> None:
    """Parse ``argv`` as lm-eval's command line (``lm_eval.__main__``'s parser) does, without
    running it (argparse exits on a bad argument): the docs' commands are checked with it."""
    from lm_eval.__main__ import HarnessCLI

    saved = sys.argv
    try:
        sys.argv = ["lm_eval", *argv]
        HarnessCLI().parse_args()
    finally:
        sys.argv = saved


def register():
    """Register ``RunLM`` as lm-eval's model "hwh" through lm-eval's public registry, after
    ``start`` (so the device defaults are set before JAX starts); returns the class."""
    start()
    # lm-eval's own models first: it looks them up only while its registry is empty
    import lm_eval.models  # noqa: F401 (imported for its registrations)
    from lm_eval.api.registry import get_model, model_registry, register_model

    from launch.lm_eval_model import RunLM

    if "hwh" in model_registry and get_model("hwh") is RunLM:
        return RunLM
    register_model("hwh")(RunLM)
    return RunLM


def _value(argv, flag):
    """The value given to ``flag`` (``--flag v`` or ``--flag=v``), or None."""
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


if __name__ == "__main__":
    main()
