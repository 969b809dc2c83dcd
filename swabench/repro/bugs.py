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
from swabench.impls import fa2_split, registry, upstream
from swabench.inputs import scenarios
from swabench.repro import cliff, holistic, script
from swabench.repro.filings import FILINGS, PLANTED, Filing
from swabench.repro.script import Part

# The shipped scenarios searched, in this order: the first that shows a bug gives its smallest case there.
# ``release`` holds every FlashInfer path and known bug where it shows at serving-like windows; ``edges``
# (windows of 0 keys, two-key requests) comes late, since a mistake there may hide inside one key tile.
SEARCHED = ("release", "serving", "chunked", "noncausal", "tree", "evicted", "default", "edges", "shelf")
CLIFF_AMPLIFICATION = 32  # the cliff case reads at least this many times the keys its window needs
SIMULATED = 10**9  # query-key products times head dimension of the biggest case simulated with all its heads


@dataclass(frozen=True)
class Bug:
    ref: str
    impl: str  # the path it shows on
    summary: str
    url: str = ""
    twin: str = ""  # a performance bug: the correct path its script's calls are timed beside (cliff.CALLS)
    fixed_in: str | None = None
    filing: Filing | None = None  # how it is filed: title, fault, what matters, control



def catalogue() -> list[Bug]:
    """Every bug with a script, upstream ones first."""
    def bug(ref, impl, summary, **more) -> Bug:
        filing = FILINGS.get(ref) or dataclasses.replace(PLANTED, title=f"a planted mistake: {summary}")
        return Bug(ref, impl, summary, filing=filing, **more)

    bugs = [bug(b.ref, sorted(b.impls)[0], b.summary, url=b.url, fixed_in=b.fixed_in) for b in upstream.declared()
            if not b.documented]  # a documented precondition is the caller's to meet: nothing to file
    bugs += [bug(i.name, i.name, i.summary) for i in registry.all_implementations()
             if i.expected_to_fail and not script.no_script(i)]
    bugs.append(bug("decode-cliff", "decode-window", "the CUDA-core decode kernel reads every page of the table "
                    "plan() gets, whatever window_left says: with the full table a decode step reads the whole "
                    "context where its window needs the last W + 1 keys", twin="decode-trim"))
    return bugs


def get(ref: str) -> Bug | None:
    return next((b for b in catalogue() if b.ref == ref), None)


def _size(case) -> int:
    qo, kv = workloads.request_lengths(case)
    return sum(q * k for q, k in zip(qo, kv)) * case.num_qo_heads * case.head_dim


def _shows(impl, case, backend: str) -> bool:
    """Whether the path's mistake shows on the case: the suite predicts it wrong there, and wrong past the
    tolerance on the random inputs a script checks with."""
    qo, kv = workloads.request_lengths(case)
    return bool(impl.must_fail(case, qo, kv, backend)) and _shows_on_random(impl, case, backend)


def _shows_on_random(impl, case, backend: str) -> bool:
    """Whether the mistake moves the output past the gate's tolerance on random inputs, which is all a
    script checks with: simulated on the CPU by gathering the keys the path sees."""
    from swabench.impls.embedded import as_predicted

    if impl.ignores & case.features:
        return True
    w = workloads.build(simulated(case), "cpu")
    errors, tol = gate.run_checked(as_predicted(impl, w, backend), w), gate.TOLERANCES[case.dtype]
    return bool(errors.unwritten) or not errors.rel_l2 <= tol.rel_l2 or not float(errors.row_rel_l2.max()) <= tol.row_rel_l2


def simulated(case):
    """The case ``_shows_on_random`` builds on the CPU: ``case`` itself up to SIMULATED in size (``_size``), above it
    the same requests on one KV head and its group of query heads.  Heads are independent draws of the same random
    inputs, so the mistake moves each row as far; a serving-sized case (32 requests of 8193 keys, 40 heads) would
    otherwise take gigabytes and most of a minute."""
    if _size(case) <= SIMULATED:
        return case
    return dataclasses.replace(case, num_qo_heads=case.gqa_group, num_kv_heads=1)


def shipped_files() -> list:
    """The shipped scenario files the search reads (never a file of the same name in the working folder)."""
    return [scenarios.shipped_dir() / f"{name}.toml" for name in SEARCHED]


@lru_cache(maxsize=None)
def _shipped(name: str):
    return scenarios.load(scenarios.shipped_dir() / f"{name}.toml").points


def _points(impl: str):
    """The implementation's points that it can run, scenario by scenario in SEARCHED's order, smallest first within
    each."""
    runs = registry.get(impl)
    return [p for name in SEARCHED
            for p in sorted((p for p in _shipped(name) if p.impl == impl and runs.skip_reason(p.case, p.backend, None)
                             is None), key=lambda p: (_size(p.case), p.backend != "fa2"))]


def parts(bug: Bug, num_sms: int = fa2_split.H200_SMS) -> tuple[list[Part], str]:
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
        return cliff.parts(p.case), f"{p.case.label}: {sum(workloads.request_lengths(p.case)[1])} keys in the table"
    if bug.ref == "flashinfer#1679":
        p = next(p for p in points if p.backend == "fa2")
        other = 128 if p.case.head_dim == 64 else 64
        first = dataclasses.replace(p.case, head_dim=other)
        return ([Part(first, bug.impl, p.backend, "first", "_first"), Part(p.case, bug.impl, p.backend)],
                f"{p.case.label}, run after the same wrapper at head_dim {other} in one process")
    if bug.ref == holistic.REF:
        for p in points:
            own = impl.must_fail(p.case, *workloads.request_lengths(p.case), p.backend)
            speaks = upstream.speaks(bug.impl, p.case, p.backend, own)
            if speaks and speaks.ref == bug.ref:
                return holistic.parts(p.case), holistic.where(p.case)
        raise LookupError(f"no shipped case shows {bug.ref}")
    if bug.ref == "flashinfer#4972":
        for p in points:
            noncausal = p.backend == "fa2" and not p.case.causal and p.case.window_left >= 0 and p.case.mode != "decode"
            rows = upstream.fa2_noncausal_wrong_rows(bug.impl, p.case, num_sms) if noncausal else []
            if any(len(r) for r in rows):
                wrong = ", ".join(f"request {b}: rows {r.start}-{r.stop - 1}" for b, r in enumerate(rows) if len(r))
                return ([Part(p.case, bug.impl, p.backend), *control(bug, p)],
                        f"{p.case.label} on {num_sms} SMs ({wrong})")
        raise LookupError(f"no shipped case shows {bug.ref} on {num_sms} SMs")
    for point in points:
        if bug.filing.chain and point.case.tree != "chain":
            continue
        for p in dict.fromkeys((_unwindowed(point), point)):  # without a window that plays no part, if it shows so
            if _shows(impl, p.case, p.backend):
                return [Part(p.case, bug.impl, p.backend), *control(bug, p)], p.case.label
    raise LookupError(f"no shipped case shows {bug.ref} on random inputs")


def _unwindowed(point):
    """The point without its window where the window holds every key of every request (it plays no part, and a
    report naming it sends the reader after it), if the path still runs the case; else the point as it is."""
    qo, kv = workloads.request_lengths(point.case)
    if point.case.window_left < max(k - q for q, k in zip(qo, kv)) or point.case.attention_chunk:  # the first query
        return point  # of some request has keys before its window
    bare = dataclasses.replace(point, case=dataclasses.replace(point.case, window_left=-1))
    return bare if registry.get(point.impl).skip_reason(bare.case, point.backend, None) is None else point


def control(bug: Bug, point) -> list[Part]:
    """The control beside the bug's call on the same inputs: its own path planned with the control's keywords, or
    the correct path on the first backend it runs the case on; none where the bug names no control or its path
    cannot run the case."""
    filing = bug.filing
    if filing.keywords:
        said = ", ".join(f"{k}={v!r}" for k, v in filing.keywords)
        return [Part(point.case, bug.impl, point.backend, "control", "_control", f"the same plan with {said}",
                     filing.keywords)]
    if not filing.control:
        return []
    impl = registry.get(filing.control)
    runs = [b for b in impl.runs_on(list(dict.fromkeys([point.backend, *impl.backends])))
            if impl.skip_reason(point.case, b, None) is None]
    return [Part(point.case, filing.control, runs[0], "control", "_control",
                 filing.control_said or f"{filing.control} ({impl.summary})")] if runs else []


def shows(bug: Bug, parts: list[Part]) -> bool:
    """Whether the bug shows on the parts' checked case: a known mistake as the suite models it, on random inputs;
    an upstream bug on a correct path (#1679) shows in the library, not in a model, so it is taken as it is."""
    p = next(p for p in parts if p.role == "checked")
    impl = registry.get(p.impl)
    return not impl.expected_to_fail or _shows(impl, p.case, p.backend)


def rows_off(part: Part) -> str:
    """How the part's first request sees the wrong keys as the suite models the path: per run of queries, how many
    keys outside the exact mask it sees (or of it misses), as 'queries 0-126 see 13 + i keys outside its mask,
    queries 127-399 see 140 ...'; '' for a correct path or one that ignores a feature of the case."""
    from swabench.core import semantics, trees

    impl, case = registry.get(part.impl), part.case
    if impl.kind == "correct" or impl.ignores & case.features:
        return ""
    qo_lens, kv_lens = workloads.request_lengths(case)  # the whole batch: it sizes the kernel's tiles and chunks
    qo, kv = qo_lens[0], kv_lens[0]
    tree = (trees.of_case(case) or [None])[0]
    garbled = impl.garbled_rows(case, qo_lens, kv_lens, part.backend)[0]
    if garbled.any():
        rows = garbled.nonzero().flatten().tolist()
        return (f"request 0: queries {rows[0]}-{rows[-1]} take other rows' partial outputs (plan() split the request "
                f"into more KV chunks than the window needs, and the merge reads them out of step)")
    exact = semantics.of_case(case).mask(qo, kv, tree=tree)
    got = impl.seen_masks(case, qo_lens, kv_lens, part.backend)[0] if impl.seen else \
        impl.computes(case, kv - qo).mask(qo, kv, tree=tree)
    said = [_runs((got & ~exact).sum(dim=1).tolist(), ("sees", "see"), "outside its mask"),
            _runs((exact & ~got).sum(dim=1).tolist(), ("misses", "miss"), "of its mask")]
    return "request 0: " + "; ".join(s for s in said if s) if any(said) else ""


def _runs(counts: list[int], verbs: tuple[str, str], where: str, most: int = 4) -> str:
    """'queries 0-126 see 13 + i keys outside its mask, queries 127-399 see 140': ``counts`` per query as runs of a
    constant or a step of one, at most ``most`` of them (then the largest count); ``verbs``: (one, several)."""
    runs, i = [], 0
    while i < len(counts):
        step = counts[i + 1] - counts[i] if i + 1 < len(counts) and abs(counts[i + 1] - counts[i]) <= 1 else 0
        j = i
        while j + 1 < len(counts) and counts[j + 1] - counts[j] == step:
            j += 1
        runs.append((i, j, counts[i], step))
        i = j + 1
    runs = [r for r in runs if r[2] or r[3]]
    if not runs:
        return ""
    if len(runs) > most:
        return f"{len([c for c in counts if c])} queries {verbs[1]} up to {max(counts)} keys {where}"

    def amount(first, start, step):
        base = first - start * step
        return str(first) if not step else ("i" if not base else f"{base} {'+' if step > 0 else '-'} i")

    return ", ".join((f"queries {a}-{b} {verbs[1]}" if b > a else f"query {a} {verbs[0]}") +
                     f" {amount(first, a, step)} keys {where}" for a, b, first, step in runs)
