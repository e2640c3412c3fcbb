"""Where a jitted step's device time goes: capture a JAX profiler trace, sum it by kernel.

    with capture(out_dir):                     # jax.profiler.trace with a Perfetto JSON trace
        for _ in range(n): run_one_step()
    summary = summarize(out_dir, steps=n)      # device time per step, by category and by kernel

The trace's device events (processes named ``/device:...``, one thread per stream) are summed
per kernel and, given the program's HLO text, per source operation (one cuBLAS kernel serves
products of different operations: each is its own row, with its launches per step), and grouped
into categories by kernel name (``CATEGORIES``: the GDN Pallas kernels by their ``gdn_`` names,
the other linear-attention kernels (``linear_``, ``gla_``, ``hgrn_``), the short-convolution
kernels, attention, matmuls, copies, the rest as fusions). ``busy_ms`` is the union of the kernels'
intervals per step: beside the step's wall time it tells how much of the step the device was
idle (launch gaps, host work); ``span_ms`` is the traced steps' first kernel start to last
kernel end per step (what the device took for them, idle included), and
``longest_gaps`` the longest idle gaps, each with when it began (ms into the trace) and the kernel
before it (a gap between steps shows there, where per-kernel sums hide it); ``gaps_after``
charges each idle gap between kernels to the kernel that ran just before it (a device idling
after one kind of kernel points at what makes the host fall behind). Given the compiled
program's HLO text (``hlo_text``), each listed kernel also names the JAX operation and source
line it came from, ``by_source_ms`` sums the device time by source line and ``by_op_group_ms``
by part of the model (``OP_GROUPS``: the model's named scopes); each fusion and
custom call also gets the bytes its operands and outputs name (``hlo_bytes``) and the rate that
is (``tb_per_s``: near the device's copy rate a kernel is bound by memory, far below it there is
room; for matmuls, which reuse their operands, the rate says little). On the CPU backend there
are no device events: the summary is empty.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import re
from pathlib import Path

import jax

from hwh_jax.profiling import hlo

# (category, pattern on the lower-cased kernel name), first match wins.
CATEGORIES = (
    ("gdn", r"gdn_"),
    ("linear_attention", r"^(linear_(scan|state|score|values)|gla_|hgrn_)"),
    ("short_conv", r"short_conv"),
    ("attention", r"cudnn|fmha|flash|attention|splash"),
    ("matmul", r"gemm|nvjet|cutlass|cublas|xmma|wgmma|dot|matmul"),
    ("copy", r"memcpy|memset|copy"),
)


# (group, the kernel categories it takes, or the named scope in its HLO op name), first match
# wins: the model names its parts (jax.named_scope in models/lm.py, layers/mixer.py and
# training/steps.py), so the rest of a linear head's work (gates, beta, its output norm, layout
# copies) and the FA heads' (q/k norms, RoPE) are told from the projections, the MLP and the
# norms. Needs the program's HLO (its op names); a kernel without a scope is "other".
OP_GROUPS = (
    ("linear heads: kernels", ("gdn", "linear_attention"), None),
    ("linear heads: short conv", ("short_conv",), None),
    ("FA heads: attention", ("attention",), None),
    ("LM head + loss", (), "lm_head"),
    ("embedding", (), "embed"),
    ("optimizer", (), "optimizer"),
    ("linear heads: gates, norm, layout", (), "la_heads"),
    ("FA heads: norms, RoPE, layout", (), "fa_heads"),
    ("mixer projections (in, out)", (), "projections|out_proj"),
    ("MLP", (), "mlp"),
    ("norms + residual adds", (), "norm"),
)


def op_group(name: str, source: str) -> str:
    """The ``OP_GROUPS`` group of a kernel from its name and its source ("op_name @ where")."""
    cat, op_name = category(name), source.split(" @ ", 1)[0]
    for group, cats, scope in OP_GROUPS:
        if cat in cats or (scope and re.search(rf"(^|[(/])({scope})([)/]|$)", op_name)):
            return group
    return "other"


def category(name: str) -> str:
    low = name.lower()
    for cat, pattern in CATEGORIES:
        if re.search(pattern, low):
            return cat
    return "fusion/other"


@contextlib.contextmanager
def capture(out_dir: str | Path):
    """jax.profiler.trace into ``out_dir`` (created), with the Perfetto JSON trace that
    ``summarize`` reads."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)  # local path: the profiler's own folder
    with jax.profiler.trace(str(out_dir), create_perfetto_trace=True):
        yield


def _trace_file(out_dir: Path) -> Path:
    found = sorted(Path(out_dir).glob("**/perfetto_trace.json.gz"))  # local path
    if not found:
        raise FileNotFoundError(f"no perfetto_trace.json.gz under {out_dir}: capture() first")
    return found[-1]


def _union_and_gaps(intervals: list[tuple[float, float, object]]):
    """Busy time (us) of the union of [start, end) intervals, and the idle gaps between them,
    each as (us, key of the interval that ended last before it, when the gap began)."""
    total, end, last, gaps = 0.0, float("-inf"), "", []
    for s, e, name in sorted(intervals):
        if s > end > float("-inf"):
            gaps.append((s - end, last, end))
        if e > end:
            total += e - max(s, end)
            end, last = e, name
    return total, gaps


_INSTR = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = ")
_CALLS = re.compile(r"calls=%([\w.\-]+)")
_META = re.compile(
    r'op_name="([^"]*)"(?:.*?source_file="([^"]*)")?(?:.*?source_line=(\d+))?'
    r"(?:.*?stack_frame_id=(\d+))?"
)


def _stack_frames(hlo_text: str) -> dict[str, str]:
    """stack_frame_id -> "function file:line" from the module's FileNames / FunctionNames /
    FileLocations / StackFrames tables (newer XLA writes locations there, not per op)."""
    tables: dict[str, dict[str, str]] = {}
    section = None
    for line in hlo_text.splitlines():
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            section = tables.setdefault(line, {})
        elif section is not None and re.match(r"^\d+ ", line):
            key, rest = line.split(" ", 1)
            section[key] = rest.strip().strip('"')
        elif line.strip():
            section = None
    files, funcs = tables.get("FileNames", {}), tables.get("FunctionNames", {})
    locs = {}
    for key, rest in tables.get("FileLocations", {}).items():
        f = dict(re.findall(r"(\w+)=(\d+)", rest))
        locs[key] = (
            f"{funcs.get(f.get('function_name_id'), '?')} "
            f"{files.get(f.get('file_name_id'), '?').rsplit('/', 1)[-1]}:"
            f"{f.get('line', '?')}"
        )
    return {
        key: locs.get(dict(re.findall(r"(\w+)=(\d+)", rest)).get("file_location_id"), "?")
        for key, rest in tables.get("StackFrames", {}).items()
    }


_TYPED = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\([^=]*?\)|\S+) ([\w\-]+)\((.*?)\)(?:, |$)")


def hlo_bytes(hlo_text: str) -> dict[str, int]:
    """Fusion and custom-call name (dots as underscores) -> the bytes of its operands and
    outputs: what one launch moves if it reads each operand and writes each output once (an
    operand read in part, a slice, counts whole)."""
    shapes, ops = {}, {}
    for line in hlo_text.splitlines():
        m = _TYPED.match(line)
        if not m:
            continue
        name, shape, opcode, operands = m.groups()
        shapes[name] = shape
        if opcode in ("fusion", "custom-call"):
            ops[name] = (shape, re.findall(r"%([\w.\-]+)", operands))
    return {
        name.replace(".", "_"): hlo.nbytes(shape)
        + sum(hlo.nbytes(shapes.get(o, "")) for o in operands)
        for name, (shape, operands) in ops.items()
    }


def hlo_sources(hlo_text: str) -> dict[str, str]:
    """Instruction name (dots as underscores, as kernels are named) -> "op_name @ where" from
    the HLO metadata; a fusion without metadata takes its fused computation's first."""
    frames = _stack_frames(hlo_text)
    meta, calls, first_in = {}, {}, {}
    comp = None
    for line in hlo_text.splitlines():
        head = re.match(r"^(?:ENTRY )?%([\w.\-]+) .*\{\s*$", line)
        if head:
            comp = head.group(1)
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        name = m.group(1).replace(".", "_")
        callee = _CALLS.search(line)
        if callee:
            calls[name] = callee.group(1)
        md = _META.search(line)
        if md:
            src = md.group(1)
            if md.group(2):
                src += f" @ {md.group(2).rsplit('/', 1)[-1]}:{md.group(3) or '?'}"
            elif md.group(4) in frames:
                src += f" @ {frames[md.group(4)]}"
            meta[name] = src
            if comp is not None:
                first_in.setdefault(comp, src)
    for name, callee in calls.items():
        if name not in meta and callee in first_in:
            meta[name] = first_in[callee]
    return meta


def summarize(out_dir: str | Path, steps: int, top: int = 20, hlo_text: str | None = None) -> dict:
    """Device time per step (ms): total kernel time, busy (union of intervals), by category, the
    ``top`` kernels and the kernels followed by the most idle time, from the latest trace under
    ``out_dir``; with ``hlo_text`` (``compiled.as_text()``) each kernel names its source."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    data = json.loads(gzip.open(_trace_file(Path(out_dir))).read())  # local path
    events = data["traceEvents"] if isinstance(data, dict) else data
    device_pids = {
        e["pid"]
        for e in events
        if e.get("ph") == "M"
        and e.get("name") == "process_name"
        and str(e.get("args", {}).get("name", "")).startswith("/device:")
    }
    sources = hlo_sources(hlo_text) if hlo_text else {}
    nbytes = hlo_bytes(hlo_text) if hlo_text else {}

    def source(name, op):  # the kernel is named after its fusion, else the trace's hlo_op
        return sources.get(name) or sources.get(op.replace(".", "_")) or ""

    # (kernel, its source) -> [ms, launches, bytes, launches the HLO sized]: one cuBLAS kernel
    # serves many products (the LM head and some layer's weight gradient); keyed by name alone,
    # one row would carry both under whichever source came first. A layer's 24 copies of one op
    # stay one row.
    kernels: dict[tuple[str, str], list] = {}
    intervals = []
    for e in events:
        if e.get("ph") != "X" or e.get("pid") not in device_pids or "dur" not in e:
            continue
        op = str((e.get("args") or {}).get("hlo_op") or "")
        key = (e["name"], source(e["name"], op))
        k = kernels.setdefault(key, [0.0, 0, 0, 0])
        k[0] += e["dur"] / 1e3
        k[1] += 1
        b = nbytes.get(e["name"]) or nbytes.get(op.replace(".", "_"))
        if b:
            k[2] += b
            k[3] += 1
        intervals.append((float(e["ts"]), float(e["ts"]) + float(e["dur"]), key))
    cats: dict[str, float] = {}
    for (name, _), (ms, *_) in kernels.items():
        c = category(name)
        cats[c] = cats.get(c, 0.0) + ms
    busy, gaps = _union_and_gaps(intervals)
    t0 = min((s for s, _, _ in intervals), default=0.0)
    after: dict[tuple[str, str], list[float]] = {}
    for us, key, _ in gaps:
        a = after.setdefault(key, [0.0, 0])
        a[0] += us
        a[1] += 1

    def row(key, **kw):
        r = {"name": key[0], "category": category(key[0]), **kw}
        return {**r, "source": key[1]} if key[1] else r

    where: dict[str, float] = {}  # device time by source location (file:line), if known
    groups: dict[str, float] = {}  # and by the model's part (OP_GROUPS)
    if sources:
        for (name, src), (ms, *_) in kernels.items():
            loc = src.split(" @ ", 1)[1] if " @ " in src else f"({category(name)})"
            where[loc] = where.get(loc, 0.0) + ms
            g = op_group(name, src)
            groups[g] = groups.get(g, 0.0) + ms

    def rates(ms, n, b, sized):  # where the HLO sized every launch: MB per launch, TB/s
        return (
            {"mb_per_launch": b / n / 1e6, "tb_per_s": b / ms / 1e9}
            if sized == n and b and ms > 0
            else {}
        )

    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][0])
    return {
        "steps": steps,
        "kernel_ms": sum(k[0] for k in kernels.values()) / steps,
        "busy_ms": busy / 1e3 / steps,
        "kernels_per_step": len(intervals) / steps,
        "idle_between_kernels_ms": sum(g[0] for g in gaps) / 1e3 / steps,
        "span_ms": (max(e for _, e, _ in intervals) - t0) / 1e3 / steps if intervals else 0.0,
        "longest_gaps": [
            row(key, ms=us / 1e3, at_ms=(at - t0) / 1e3)
            for us, key, at in sorted(gaps, key=lambda g: -g[0])[:5]
        ],
        "by_category_ms": {c: ms / steps for c, ms in sorted(cats.items(), key=lambda kv: -kv[1])},
        "top_kernels_ms": [
            row(k, ms=ms / steps, launches=n / steps, **rates(ms, n, b, sized))
            for k, (ms, n, b, sized) in ranked[:top]
        ],
        "gaps_after": [
            row(k, ms=us / 1e3 / steps, count=c / steps)
            for k, (us, c) in sorted(after.items(), key=lambda kv: -kv[1][0])[: top // 2]
        ],
        "by_source_ms": {
            k: ms / steps for k, ms in sorted(where.items(), key=lambda kv: -kv[1])[:top]
        },
        "by_op_group_ms": {
            k: ms / steps for k, ms in sorted(groups.items(), key=lambda kv: -kv[1])
        },
    }


def format_summary(s: dict, step_ms: float | None = None) -> str:
    """A few lines for a log: busy vs the step's wall time, categories, the top kernels."""
    if not s["top_kernels_ms"]:
        return "device per step: no device events in the trace (the CPU backend has none)"
    head = f"device per step: kernels {s['kernel_ms']:.2f} ms, busy {s['busy_ms']:.2f} ms"
    if step_ms:
        head += f" of a {step_ms:.2f} ms step ({s['busy_ms'] / step_ms:.0%} busy)"
    lines = [
        head,
        "  " + ", ".join(f"{c} {ms:.2f}" for c, ms in s["by_category_ms"].items()),
        f"  {s['kernels_per_step']:.0f} kernels per step; idle between them "
        f"{s['idle_between_kernels_ms']:.2f} ms; first kernel to last "
        f"{s['span_ms']:.2f} ms per step",
    ]
    src = lambda k: f"  <- {k['source'][:120]}" if "source" in k else ""
    rate = lambda k: f"{k['tb_per_s']:5.2f} TB/s" if "tb_per_s" in k else " " * 10
    lines += [
        f"  {k['ms']:8.3f} ms {k['launches']:4.0f}x {rate(k)} {k['category']:12s} "
        f"{k['name'][:60]}{src(k)}"
        for k in s["top_kernels_ms"]
    ]
    if s.get("by_op_group_ms"):
        lines += ["  by part of the model:"]
        lines += [f"  {ms:8.3f} ms  {k}" for k, ms in s["by_op_group_ms"].items()]
    if s.get("by_source_ms"):
        lines += ["  by source line (kernels without one: by category):"]
        lines += [f"  {ms:8.3f} ms  {k[:110]}" for k, ms in s["by_source_ms"].items()]
    lines += ["  longest idle gaps (ms, ms into the trace, after):"]
    lines += [
        f"  {g['ms']:8.3f} ms at {g['at_ms']:9.2f}  {g['name'][:70]}{src(g)}"
        for g in s.get("longest_gaps", [])
    ]
    lines += ["  idle after (ms, gaps per step):"]
    lines += [
        f"  {k['ms']:8.3f} ms {k['count']:6.0f}  {k['name'][:70]}{src(k)}" for k in s["gaps_after"]
    ]
    return "\n".join(lines)
