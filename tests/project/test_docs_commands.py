"""Every command shown in README.md and docs/*.md runs as written: each `python -m launch.X` line's
flags and `--config.*` overrides parse against the real flags and config (absl's
parse, as `--only_check_args` checks: nothing runs), each `python bench/X.py` / `tools/X.py` line names only
options its parser knows, and each script it names exists."""

import concurrent.futures
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"```(?:bash|sh|shell)\n(.*?)```", re.S)
PYTHON = re.compile(r"(^|/)python3?$")


def commands():
    """(doc, line, kind, target, args): kind "launch" (target a module), "script" (a .py path)
    or "shell" (a .sh path), for every command of every fenced shell block."""
    out = []
    for doc in DOCS:
        for block in FENCE.findall(doc.read_text()):
            for line in block.replace("\\\n", "").splitlines():  # bash's line continuation
                try:
                    words = shlex.split(line, comments=True)
                except ValueError as e:
                    raise AssertionError(f"{doc.name}: cannot parse {line!r}: {e}") from None
                segment = []
                for w in words + [";"]:
                    if w in ("&&", "||", ";", "|", "&"):
                        found = _command(segment)
                        if found:
                            out.append((doc.name, line.strip(), *found))
                        segment = []
                    else:
                        segment.append(w)
    return out


def _command(words):
    words = [w for w in words if not re.match(r"^[A-Z_][A-Z0-9_]*=", w)]  # env assignments
    for i, w in enumerate(words):
        if PYTHON.search(w):
            rest = words[i + 1 :]
            if rest[:1] == ["-m"] and len(rest) > 1 and rest[1].startswith("launch."):
                return "launch", rest[1], rest[2:]
            if rest and rest[0].endswith(".py"):
                return "script", rest[0], rest[1:]
        if w == "bash" and i + 1 < len(words) and words[i + 1].endswith(".sh"):
            return "shell", words[i + 1], words[i + 2 :]
    return None


COMMANDS = commands()


def test_the_docs_show_commands():
    kinds = {kind for _, _, kind, _, _ in COMMANDS}
    assert kinds == {"launch", "script", "shell"}, kinds
    assert sum(kind == "launch" for _, _, kind, _, _ in COMMANDS) >= 15


_CHECK = """
import importlib, json, sys
from absl import flags
module = importlib.import_module(sys.argv[1])
FLAGS = flags.FLAGS
own = set(FLAGS)
for args in json.loads(sys.stdin.read()):
    if hasattr(module, "check_args"):   # a launcher of another library's command line
        try:
            module.check_args(args)
            print(json.dumps([0, ""]))
        except (Exception, SystemExit) as e:
            print(json.dumps([1, f"{type(e).__name__}: {e}"[-1500:]]))
        continue
    for name in set(FLAGS) - own:       # a config's override flags, defined by the last parse
        delattr(FLAGS, name)
    FLAGS.unparse_flags()
    sys.argv = [sys.argv[1], *args]     # ml_collections reads the overrides from sys.argv
    try:
        FLAGS(sys.argv)
        print(json.dumps([0, ""]))
    except Exception as e:
        print(json.dumps([1, f"{type(e).__name__}: {e}"[-1500:]]))
"""


def _check_launch(module, arg_lists):
    """Each argument list parsed against ``module``'s flags and config, as absl's app.run
    parses them before main (what --only_check_args checks), in one process per module:
    [(returncode, error)] in order."""
    proc = subprocess.run(
        [sys.executable, "-c", _CHECK, module],
        input=json.dumps(arg_lists),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    if proc.returncode != 0:
        return [(proc.returncode, proc.stderr[-1500:])] * len(arg_lists)
    return [tuple(json.loads(line)) for line in proc.stdout.splitlines() if line.startswith("[")]


def test_launch_commands_parse():
    """Each launcher command with its flags and config overrides, as the docs write it."""
    todo = [
        (doc, line, target, args) for doc, line, kind, target, args in COMMANDS if kind == "launch"
    ]
    unique = list(dict.fromkeys((target, tuple(args)) for _, _, target, args in todo))
    by_module = {}
    for target, args in unique:
        by_module.setdefault(target, []).append(list(args))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # each distinct command once
        results = dict(
            zip(by_module, pool.map(lambda m: _check_launch(m, by_module[m]), by_module))
        )
    checked = {
        (m, tuple(a)): r for m, lists in by_module.items() for a, r in zip(lists, results[m])
    }
    assert len(checked) == len(unique), "a module's check printed fewer results than commands"
    bad = [
        f"{doc}: {line}\n  -> {checked[(target, tuple(args))][1]}"
        for doc, line, target, args in todo
        if checked[(target, tuple(args))][0] != 0
    ]
    assert not bad, "\n".join(bad)


def _options(script: str) -> set[str]:
    proc = subprocess.run(
        [sys.executable, script, "--help"], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert proc.returncode == 0, f"{script} --help: {proc.stderr[-1000:]}"
    return set(re.findall(r"(--[a-z][a-z0-9_]*)", proc.stdout))


@pytest.mark.parametrize("script", sorted({t for _, _, k, t, _ in COMMANDS if k == "script"}))
def test_script_commands_name_known_options(script):
    assert (ROOT / script).exists(), script
    if script.endswith("fla_gdn_anchor.py"):  # needs PyTorch with CUDA and fla: no --help here
        known = {"--profile"}
    else:
        known = _options(script)
    for doc, line, kind, target, args in COMMANDS:
        if kind == "script" and target == script:
            used = {a.split("=")[0] for a in args if a.startswith("--")}
            assert used <= known, f"{doc}: {line}: unknown {sorted(used - known)}"


def test_shell_commands_name_scripts_that_exist():
    for doc, line, kind, target, args in COMMANDS:
        if kind == "shell":
            assert (ROOT / target).exists(), f"{doc}: {line}"
            if target.endswith("tables.sh"):  # its parts are the labels of its case
                parts = set(re.findall(r"^ {4}(\w+)\)$", (ROOT / target).read_text(), re.M))
                assert {"gdn", "decode", "hgrn"} <= parts, parts
                assert set(args[1:]) <= parts, f"{doc}: {line}"


def test_the_documented_niah_counts_are_the_configs():
    """docs/evaluation.md's prompts a cell (the default, the experiment's, the main job's
    closing evaluation) and the main job's '0 of 9' a length, from the configs themselves."""
    from configs import base, experiment
    from hwh_jax.eval import niah
    from hwh_jax.eval.suite import EvalSpec

    text = (ROOT / "docs" / "evaluation.md").read_text()
    d = EvalSpec()
    assert (
        f"(default {d.niah_depths} x {d.niah_samples} = {d.niah_depths * d.niah_samples};" in text
    )
    e = experiment.get_config().eval
    assert (
        f"`configs/experiment.py` {e.niah_depths} x {e.niah_samples} = "
        f"{e.niah_depths * e.niah_samples} a seed" in text
    )
    t = base.get_config("hwh_tiny").eval
    cell = t.niah_depths * t.niah_samples
    per_length = cell * len(tuple(t.niah_tasks) or niah.SINGLE)
    assert (
        f"evaluation {t.niah_depths} x {t.niah_samples} = {cell} a cell, {per_length} a "
        f"length over its three tasks" in text
    )
    assert f"**0 of {per_length}** NIAH prompts" in text and f"cell 0 of {cell}" in text


def test_the_readmes_python_block_runs_as_written():
    """README.md's Python block, run as a newcomer would paste it (its own process)."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert len(blocks) == 1
    done = subprocess.run(
        [sys.executable, "-c", blocks[0]],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    from hwh_jax.models import model_config

    assert done.stdout.strip() == f"(2, 64, {model_config('hwh', 'tiny').vocab_size})"


def test_the_readmes_niah_headline_is_the_committed_rows():
    """README's NIAH figures recomputed from the committed runs' results (each seed its own
    prompts): the share right over the three seeds and each seed's own range, at 4x the
    training length and, for the longer-trained Transformer, at 1x too."""
    runs = ROOT / "measurements" / "experiment_L512_per_seed_prompts"
    readme = " ".join((ROOT / "README.md").read_text().split())

    def at_4l(arch, length=2048, runs=runs):
        per_seed, prompts = [], set()
        for s in range(3):
            rows = json.loads((runs / arch / f"seed{s}" / "eval" / "results.json").read_text())
            cell = [r for r in rows["niah"] if r["length"] == length]
            per_seed.append((sum(r["score"] >= 100 for r in cell), len(cell)))
            prompts.update((r["task"], str(r["expected"]), r["depth"]) for r in cell)
        assert len(prompts) > 2 * per_seed[0][1]  # the seeds were asked different prompts
        right, n = sum(r for r, _ in per_seed), sum(n for _, n in per_seed)
        shares = [100 * r / k for r, k in per_seed]
        return f"{100 * right / n:.0f}%", f"{min(shares):.0f}-{max(shares):.0f}%"

    share, spread = at_4l("hwh")
    assert f"HwH answered {share} (seeds {spread}) of the NIAH prompts" in readme
    share, spread = at_4l("layerwise")
    assert f"against {share} ({spread}) for the layer-wise hybrid" in readme
    share, spread = at_4l("layerwise_nope")
    assert f"NoPE attention answered {share} ({spread})" in readme
    share, spread = at_4l("hwh_uniform")
    assert f"a uniform allocation {share} ({spread})" in readme
    longer = ROOT / "measurements" / "experiment_L512_longer_training"
    share, spread = at_4l("transformer_1800", 512, longer)
    assert f"the Transformer answered {share} (seeds {spread}) at the training length" in readme
    share, spread = at_4l("transformer_1800", 2048, longer)
    assert f"and {share} ({spread}) at 4x, the layer-wise" in readme
    share, spread = at_4l("layerwise_1800", 2048, longer)
    assert f"the layer-wise hybrid {share} ({spread}) and" in readme
    share, spread = at_4l("hwh_1800", 2048, longer)
    assert f"HwH {share} ({spread}) at 4x, all three apart" in readme
    group = ROOT / "measurements" / "experiment_L512_rope_commonsense"
    share, spread = at_4l("hwh_rope", 2048, group)
    assert f"RoPE in its FA heads answered {share} ({spread}) at 4x" in readme
    share, spread = at_4l("hwh", 2048, group)
    assert f"against HwH's {share} ({spread}), every seed apart" in readme
    untaught = ROOT / "measurements" / "experiment_L512_untaught_format"
    for arch in ("hwh", "layerwise", "transformer"):
        for length in (512, 1024, 2048):
            cell = [
                r
                for s in range(3)
                for r in json.loads(
                    (
                        untaught / f"untaught_{arch}" / f"seed{s}" / "eval" / "results.json"
                    ).read_text()
                )["niah"]
                if r["length"] == length
            ]
            assert len(cell) == 315 and not any(r["score"] >= 100 for r in cell), (arch, length)
    assert "answered none of 315 prompts a length at 1x, 2x or 4x (3 seeds each)" in readme
