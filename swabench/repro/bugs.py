"""Every bug ``swabench repro --bug`` writes a script for, and the smallest shipped case where each shows.

- each declared upstream bug (``impls.upstream``): the library's own mistake on a correct call;
- each known-bug and planted implementation: a wrong call, named by the implementation;
- the decode cliff, a performance bug: the CUDA-core decode kernel reads every page of its table
  whatever ``window_left`` says, so with the full table it is timed against the same kernel on the
  trimmed table.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from swabench.core import gate, workloads
from swabench.impls import registry, upstream
from swabench.inputs import scenarios
from swabench.repro.script import Part

# The shipped scenarios searched, in this order: the first that shows a bug gives its smallest case there.
# ``release`` holds every FlashInfer path and known bug where it shows at serving-like windows; ``edges``
# (windows of 0 keys, two-key requests) comes late, since a mistake there may hide inside one key tile.
SEARCHED = ("release", "serving", "chunked", "noncausal", "tree", "evicted", "default", "edges")
H200_SMS = 132  # flashinfer#4972's rows hang on the SM count: the H200's where no GPU is here
CLIFF_AMPLIFICATION = 32  # the cliff case reads at least this many times the keys its window needs
CLIFF_THRESHOLD = 3.0


@dataclass(frozen=True)
class Bug:
    ref: str
    impl: str  # the path it shows on
    summary: str
    url: str = ""
    twin: str = ""  # a performance bug: the correct path it is timed against
    fixed_in: str | None = None


def catalogue() -> list[Bug]:
    """Every bug with a script, upstream ones first."""
    bugs = [Bug(b.ref, sorted(b.impls)[0], b.summary, b.url, fixed_in=b.fixed_in) for b in upstream.declared()]
    bugs += [Bug(i.name, i.name, i.summary) for i in registry.all_implementations() if i.expected_to_fail]
    bugs.append(Bug("decode-cliff", "decode-window", "the CUDA-core decode kernel reads every page of the table "
                    "plan() gets, whatever window_left says: with the full table a decode step reads the whole "
                    "context where its window needs the last W + 1 keys", twin="decode-trim"))
    return bugs


def get(ref: str) -> Bug | None:
    return next((b for b in catalogue() if b.ref == ref), None)


def _size(case) -> int:
    qo, kv = workloads.request_lengths(case)
    return sum(q * k for q, k in zip(qo, kv)) * case.num_qo_heads * case.head_dim


def _shows_on_random(impl, case) -> bool:
    """Whether the mistake moves the output past the gate's tolerance on random inputs, which is all a
    script checks with: simulated on the CPU by gathering the keys the path sees."""
    from swabench.impls.embedded import GatherRunner

    if impl.ignores & case.features:
        return True
    w = workloads.build(case, "cpu")
    seen = impl.seen(case, w.qo_lens, w.kv_lens) if impl.seen else None
    runner = GatherRunner(w, impl.computes, trim=False, seen=seen)
    runner.plan()
    errors, tol = gate.run_checked(runner, w), gate.TOLERANCES[case.dtype]
    return bool(errors.unwritten) or not errors.rel_l2 <= tol.rel_l2 or not float(errors.row_rel_l2.max()) <= tol.row_rel_l2


def shipped_files() -> list:
    """The shipped scenario files the search reads (never a file of the same name in the working folder)."""
    return [scenarios.shipped_dir() / f"{name}.toml" for name in SEARCHED]


@lru_cache(maxsize=None)
def _shipped(name: str):
    return scenarios.load(scenarios.shipped_dir() / f"{name}.toml").points


def _points(impl: str):
    """The implementation's points, scenario by scenario in SEARCHED's order, smallest first within each."""
    return [p for name in SEARCHED
            for p in sorted((p for p in _shipped(name) if p.impl == impl), key=lambda p: (_size(p.case), p.backend != "fa2"))]


def parts(bug: Bug, num_sms: int = H200_SMS) -> tuple[list[Part], str]:
    """The script's parts on the first shipped case where ``bug`` shows (SEARCHED's order, smallest first), and
    where that is in words."""
    impl = registry.get(bug.impl)
    points = _points(bug.impl)
    if bug.twin:
        def wide(p):
            qo, kv = workloads.request_lengths(p.case)
            need = sum(min(k, p.case.window_left + q) for q, k in zip(qo, kv))
            return p.backend == "fa2" and sum(kv) >= CLIFF_AMPLIFICATION * need
        # the smallest such case of any scenario: the cliff shows wherever the table outgrows the window, and a
        # script builds its case on the CPU too
        p = min((p for p in points if wide(p)), key=lambda p: _size(p.case))
        return ([Part(p.case, bug.impl, p.backend, "timed"), Part(p.case, bug.twin, p.backend, "timed", "_twin")],
                f"{p.case.label}: {sum(workloads.request_lengths(p.case)[1])} keys in the table")
    if bug.ref == "flashinfer#1679":
        p = next(p for p in points if p.backend == "fa2")
        other = 128 if p.case.head_dim == 64 else 64
        first = dataclasses.replace(p.case, head_dim=other)
        return ([Part(first, bug.impl, p.backend, "first", "_first"), Part(p.case, bug.impl, p.backend)],
                f"{p.case.label}, run after the same wrapper at head_dim {other} in one process")
    if bug.ref == "flashinfer#4972":
        for p in points:
            noncausal = p.backend == "fa2" and not p.case.causal and p.case.window_left >= 0 and p.case.mode != "decode"
            rows = upstream.fa2_noncausal_wrong_rows(bug.impl, p.case, num_sms) if noncausal else []
            if any(len(r) for r in rows):
                wrong = ", ".join(f"request {b}: rows {r.start}-{r.stop - 1}" for b, r in enumerate(rows) if len(r))
                return [Part(p.case, bug.impl, p.backend)], f"{p.case.label} on {num_sms} SMs ({wrong})"
        raise LookupError(f"no shipped case shows {bug.ref} on {num_sms} SMs")
    for p in points:
        qo, kv = workloads.request_lengths(p.case)
        if impl.must_fail(p.case, qo, kv) and _shows_on_random(impl, p.case):
            return [Part(p.case, bug.impl, p.backend)], p.case.label
    raise LookupError(f"no shipped case shows {bug.ref} on random inputs")
