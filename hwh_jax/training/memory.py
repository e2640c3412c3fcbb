"""Memory planning: the largest micro-batch whose compiled train step fits the devices.

The global batch (``train.batch_size``) is always the optimisation's batch; a step runs it as
``grad_accum`` micro-batches of ``micro_batch`` sequences whose gradients are summed
(``steps.make_train_step``), so the update is the same whatever the split. ``plan`` chooses
the split from XLA's own account of the compiled step (``step_bytes``: arguments + outputs -
donated + temporaries + code, per device) against the device's memory limit:

1. compile at the smallest micro-batch (the data-parallel size): if even that does not fit,
   stop with the memory needed, the memory there is, and what would make it fit;
2. compile at up to four times that: the two points give bytes per sequence (activations grow
   linearly in the micro-batch; parameters, optimizer state and gradients do not);
3. of the micro-batches the line predicts under ``HEADROOM`` of the limit, compile the
   cheapest (``cost``); if the compiled step is over, the line is cut there and the next
   cheapest is tried.

A micro-batch need not divide the batch: ``grad_accum`` = ceil(batch / micro_batch), and the
last micro-batch holds the rows left (fewer; the step compiles it as a program of its own), so
every split computes the batch's rows and no more, and the cheapest split is the one with the
fewest micro-batches: 256 sequences run as 6 x 43 (the last of 41) rather than 8 x 32 when 43
is the largest that fits.

The chosen step is the one the trainer runs (no compile is wasted on it). Without a known
limit (the CPU backend reports none and ``train.device_memory_gb`` is 0) the whole batch is
one micro-batch, compiled once. A plan is remembered in the workdir (``memory_plan.json``)
under a key of everything it depends on, so a resumed run compiles once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
from typing import Callable

import jax

from hwh_jax import storage

log = logging.getLogger(__name__)

GiB = 2**30
HEADROOM = 0.9  # share of the limit a plan fills: allocator fragmentation, library workspaces
PLAN_FILE = "memory_plan.json"


class MemoryPlanError(ValueError):
    """The train step cannot fit the devices even at one sequence per device."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a step runs its global batch: ``grad_accum`` micro-batches of ``micro_batch``
    sequences, the compiled step's memory per device, the limit, and how it was chosen."""

    micro_batch: int  # sequences per micro-batch (global, over all devices)
    grad_accum: int  # micro-batches per step: ceil(batch / micro_batch)
    step_bytes: int  # per device, of the compiled step
    limit_bytes: int | None  # per device; None: not known (CPU)
    how: str  # "planned" | "set by train.grad_accum" | "no limit known" | "remembered"
    probes: tuple = ()  # ((micro_batch, step_bytes), ...) compiled on the way

    last: int = 0  # rows of the last micro-batch when fewer than micro_batch
    remat: str = ""  # the remat policy the step runs (``plan_remat``; "" = not planned)
    remat_tried: tuple = ()  # the policies that did not fit one sequence a device before it

    def describe(self) -> str:
        lim = f" of {size(self.limit_bytes)}" if self.limit_bytes else ""
        last = f" (the last of {self.last})" if self.last else ""
        remat = ""
        if self.remat_tried:
            remat = (
                f"; model.remat={self.remat} ({', '.join(self.remat_tried)} did not fit one "
                f"sequence a device)"
            )
        return (
            f"micro-batch {self.micro_batch} x {self.grad_accum} accumulated{last}; step "
            f"memory {size(self.step_bytes)}{lim} per device ({self.how}){remat}"
        )

    def to_json(self) -> dict:
        return {
            "micro_batch": self.micro_batch,
            "grad_accum": self.grad_accum,
            "last": self.last,
            "step_bytes": self.step_bytes,
            "step_gib": round(self.step_bytes / GiB, 3),
            "limit_gib": None if self.limit_bytes is None else round(self.limit_bytes / GiB, 3),
            "how": self.how,
            "probes": [list(p) for p in self.probes],
            "remat": self.remat,
            "remat_tried": list(self.remat_tried),
        }


def size(nbytes: float) -> str:
    """Bytes as GiB, or MiB below a tenth of a GiB."""
    return f"{nbytes / GiB:.2f} GiB" if nbytes >= GiB / 10 else f"{nbytes / 2**20:.1f} MiB"


def step_bytes(compiled) -> int:
    """Per-device bytes of a compiled program by XLA's buffer assignment: arguments + outputs
    - outputs aliased to donated arguments + temporaries + generated code."""
    m = compiled.memory_analysis()
    return int(
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        - m.alias_size_in_bytes
        + m.temp_size_in_bytes
        + m.generated_code_size_in_bytes
    )


def device_limit(memory_gb: float = 0.0) -> int | None:
    """Bytes one device may use: ``memory_gb`` (``train.device_memory_gb``) when set, else the
    allocator's limit the device reports (GPU, TPU), else None (CPU)."""
    if memory_gb:
        return int(memory_gb * GiB)
    stats = jax.local_devices()[0].memory_stats()
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    return None


def accumulation(batch: int, micro: int) -> tuple[int, int]:
    """(micro-batches, rows of the last when fewer than ``micro``, else 0) that run ``batch``
    sequences ``micro`` at a time."""
    n = -(-batch // micro)
    return n, batch - (n - 1) * micro if batch % micro else 0


def candidates(batch: int, dp: int) -> list[int]:
    """Micro-batches worth compiling, largest first: for each number of micro-batches, the
    smallest multiple of the data-parallel size ``dp`` that holds ``batch`` in that many."""
    if batch < dp or batch % dp:
        return []
    per = [-(-batch // n) for n in range(1, batch // dp + 1)]  # ceil(batch / n)
    return sorted({-(-m // dp) * dp for m in per}, reverse=True)


def cost(batch: int, micro: int) -> int:
    """What a split costs beyond the batch's rows, which every split computes once: its
    micro-batches, each of which launches its kernels, reads every weight and adds its
    gradients to the sum."""
    return accumulation(batch, micro)[0]


def plan(
    compile_at: Callable[[int], object],
    *,
    batch: int,
    dp: int,
    limit: int | None,
    grad_accum: int = 0,
    advice: Callable[[], str] = lambda: "",
) -> tuple[Plan, object]:
    """(plan, compiled step) for a global ``batch`` over ``dp`` data-parallel devices.
    ``compile_at(micro_batch)`` compiles the train step at that micro-batch. ``grad_accum`` > 0
    is the user's choice, only checked; ``advice()`` words what would make a config fit."""
    cands = candidates(batch, dp)
    if not cands:
        raise ValueError(
            f"train.batch_size={batch} cannot be split over the data-parallel size "
            f"{dp}: make it a multiple of {dp}, or change train.mesh"
        )
    if grad_accum:
        micro = -(-batch // grad_accum)  # the last micro-batch may be smaller
        micro = -(-micro // dp) * dp
        if accumulation(batch, micro)[0] != grad_accum:
            counts = sorted({accumulation(batch, m)[0] for m in cands})
            raise ValueError(
                f"train.batch_size={batch} cannot run as train.grad_accum="
                f"{grad_accum} micro-batches over the data-parallel size {dp} (each a "
                f"multiple of {dp}); possible: {counts}, or train.grad_accum=0 to let "
                f"the trainer choose"
            )
        compiled, nbytes = _compile_or_need(compile_at, micro)
        if compiled is None:
            raise MemoryPlanError(
                f"the train step at train.grad_accum={grad_accum} (micro-batch {micro}) needs "
                f"{size(nbytes)} per device, more than the device has (the compiler refused "
                f"it); set train.grad_accum=0 to let the trainer choose the micro-batch"
            )
        got = Plan(
            micro,
            grad_accum,
            nbytes,
            limit,
            "set by train.grad_accum",
            last=accumulation(batch, micro)[1],
        )
        if limit is not None and got.step_bytes > limit:
            raise MemoryPlanError(
                f"the train step at train.grad_accum={grad_accum} (micro-batch {micro}) needs "
                f"{size(got.step_bytes)} per device, more than its {size(limit)}; "
                f"set train.grad_accum=0 to let the trainer choose the micro-batch"
            )
        return got, compiled
    if limit is None:
        compiled = compile_at(batch)
        return Plan(batch, 1, step_bytes(compiled), None, "no limit known"), compiled

    budget = HEADROOM * limit
    compiled, probes = {}, {}

    def measure(m):
        if m not in probes:
            program, probes[m] = _compile_or_need(compile_at, m)
            if program is not None:
                compiled[m] = program
            log.info("memory plan: micro-batch %d -> %.2f GiB per device", m, probes[m] / GiB)
        return probes[m]

    smallest = cands[-1]
    if measure(smallest) > budget:
        raise MemoryPlanError(
            f"the train step does not fit even at {smallest // dp} sequence(s) per device: it "
            f"needs {size(probes[smallest])} per device, and {size(budget)} ({HEADROOM:.0%} of "
            f"the device's {size(limit)}) is there. " + advice()
        )
    chosen = smallest
    if len(cands) > 1:
        # the second point a few times the first: the line's slope is then that of the
        # activations, not of the small programs' fixed workspaces
        measure(max((m for m in cands if smallest < m <= 4 * smallest), default=cands[-2]))
        while True:
            known = sorted(probes)
            fits = [m for m in known if probes[m] <= budget]
            lo = fits[-1]  # largest that fits
            hi = min((m for m in known if m > lo), default=None)  # smallest that does not
            a, b = (fits[-2], lo) if len(fits) >= 2 else (lo, hi)
            per_seq = max((probes[b] - probes[a]) / (b - a), 1.0)

            def fits_(m):  # compiled: its own figure; else below lo, or on the line below hi
                if m in probes:
                    return probes[m] <= budget
                return m < lo or (
                    (hi is None or m < hi) and probes[lo] + (m - lo) * per_seq <= budget
                )

            best = min((m for m in cands if fits_(m)), key=lambda m: (cost(batch, m), -m))
            if best in probes:
                chosen = best
                break
            measure(best)
    n, last = accumulation(batch, chosen)
    got = Plan(chosen, n, probes[chosen], limit, "planned", tuple(sorted(probes.items())), last)
    return got, compiled[chosen]


def plan_remat(
    compile_for: Callable[[str], Callable[[int], object]],
    policies: tuple[str, ...],
    **kw,
) -> tuple[Plan, object]:
    """``plan`` under the first remat policy of ``policies`` (``layers.remat.fallbacks``: the
    config's own, then those that keep less, the last keeping the least) that fits one
    sequence a device; ``compile_for(policy)`` is that policy's ``compile_at``. After the
    config's own, the last is tried first: if the policy that keeps the least does not fit,
    none does, and the config is refused after two compilations, not one per policy. The plan
    names the policy it chose and those that did not fit."""
    tried = []

    def attempt(policy):
        try:
            return plan(compile_for(policy), **kw)
        except MemoryPlanError:
            log.info("memory plan: model.remat=%s does not fit one sequence a device", policy)
            tried.append(policy)
            if policy == policies[-1]:
                raise
            return None

    got = attempt(policies[0])
    if got is None:
        last = attempt(policies[-1])  # raises if even the least-keeping policy does not fit
        for policy in policies[1:-1]:
            got = attempt(policy)
            if got is not None:
                break
        got = got or last
    plan_, compiled = got
    chosen = policies[0] if not tried else next(p for p in policies if p not in tried)
    return dataclasses.replace(plan_, remat=chosen, remat_tried=tuple(tried)), compiled


def remembered_remat(workdir, key: str) -> str:
    """The remat policy a previous start of this run planned under ``key`` ("" if none)."""
    try:
        saved = json.loads((storage.path(workdir) / PLAN_FILE).read_text())
    except (OSError, ValueError):
        return ""
    return saved.get("remat", "") if saved.get("key") == key else ""


def _compile_or_need(compile_at, micro: int) -> tuple[object | None, int]:
    """(the step compiled at ``micro``, its bytes per device), or (None, the bytes the compiler
    said it needs) where the TPU compiler refused it for the HBM; any other error is raised."""
    try:
        compiled = compile_at(micro)
    except Exception as e:  # only the compiler's out-of-memory is ours
        need = compile_oom_bytes(e)
        if need is None:
            raise
        return None, need
    return compiled, step_bytes(compiled)


_OOM_NEED = re.compile(r"required for [^(]*\(([\d.]+)([KMGTP]?)\)")


def compile_oom_bytes(e: BaseException) -> int | None:
    """The bytes a program needs, from a compiler's out-of-memory error (the TPU compiler
    refuses a program over the HBM: "RESOURCE_EXHAUSTED: ... required for HLO temporaries
    (37.14T) exceeds available HBM (15.75G)"); None for any other error, other memories'
    refusals among them (a core's sync flags, "memory space sflag", are not the HBM)."""
    text = str(e)
    if "RESOURCE_EXHAUSTED" not in text or ("memory space" in text and "HBM" not in text):
        return None
    m = _OOM_NEED.search(text)
    if not m:
        return 2**62  # over any limit, amount not said
    scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}
    return int(float(m.group(1)) * scale[m.group(2)])


def plan_key(*parts) -> str:
    """A digest of everything a plan depends on."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def remembered(workdir, key: str) -> int | None:
    """The micro-batch a previous start of this run planned under ``key``, or None."""
    path = storage.path(workdir) / PLAN_FILE
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return saved.get("micro_batch") if saved.get("key") == key else None


def remember(workdir, key: str, got: Plan) -> None:
    storage.write_text(
        storage.path(workdir) / PLAN_FILE, json.dumps({"key": key, **got.to_json()}, indent=1)
    )
