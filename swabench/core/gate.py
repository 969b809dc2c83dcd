"""The correctness gate: no number is recorded for an output that has not been checked.

Two kinds of input go through the *same* runner (same plan, same buffers that are then timed):
random N(0, 1) data, which catches gross errors and measures accuracy, and probe data
(``probes``), which makes a single leaked or missing key at any window or causal edge move its row
by O(1).  The output buffer is poisoned with NaN before every checked call, so an unwritten row
fails too.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from swabench.core import probes, reference
from swabench.measure import timing


@dataclass(frozen=True)
class Tolerance:
    rel_l2: float  # whole output on random inputs: ||o - ref|| / ||ref||
    row_rel_l2: float  # worst (query, head) row, random and probe inputs


# Chosen from measured error distributions (H200, bf16, every correct FlashInfer path over the edges
# and default scenarios): worst rel-L2 3.2e-3, worst row 4.3e-3 on random data and 3.7e-3 on probe
# data; the smallest probe-row error of a caught mask bug was 1.13.  fp16 has three more mantissa
# bits than bf16; float32 here is the CPU SDPA against a float64 reference.
TOLERANCES = {
    "bfloat16": Tolerance(rel_l2=1e-2, row_rel_l2=5e-2),
    "float16": Tolerance(rel_l2=2.5e-3, row_rel_l2=1.5e-2),
    "float32": Tolerance(rel_l2=1e-4, row_rel_l2=1e-3),
}


@dataclass
class GateResult:
    passed: bool
    rel_l2: float  # random inputs, whole output
    max_abs: float  # random inputs
    row_rel_l2: float  # random inputs, worst row
    probe_rel_l2: float  # probe inputs, worst row over every pass
    unwritten_rows: int  # rows still NaN after the call (any pass)
    reason: str  # why it failed ("" when it passed)
    wrong_rows: int = 0  # query rows out of tolerance in some head, on random or probe inputs
    rows_as_predicted: bool | None = None  # those rows are exactly the ones the semantics predicted (where given)

    def columns(self) -> dict:
        return asdict(self)


@dataclass
class _Errors:
    rel_l2: float
    max_abs: float
    row_rel_l2: torch.Tensor  # [total_q, heads]
    unwritten: int


def _reference(w) -> torch.Tensor:
    """The exact output for the data now in the buffers; every implementation of a case shares it."""
    if not w.data:  # buffers written by hand: nothing to share
        return reference.attention(w)
    if w.data not in w.references:
        if len(w.references) >= 4:
            w.references.clear()
        w.references[w.data] = reference.attention(w)
    return w.references[w.data]


def _fresh_inputs(runner) -> None:
    """A runner that reads its own copy of the inputs (flex-contiguous) takes the new data here, outside
    anything timed."""
    refresh = getattr(runner, "refresh_inputs", None)
    if refresh is not None:
        refresh()


def run_checked(runner, w) -> _Errors:
    """One checked call on the data now in the buffers: the output poisoned first, held to the reference."""
    runner.out.fill_(float("nan"))
    _fresh_inputs(runner)
    runner.run()
    timing.device_sync(w.device)()
    ref = _reference(w)
    out = runner.out.to(ref.dtype)
    nan_rows = torch.isnan(out).any(dim=-1)
    diff = torch.where(torch.isnan(out), torch.full_like(out, float("inf")), out - ref)
    ref_norm = ref.norm()
    row_norm = ref.norm(dim=-1).clamp_min(1e-6 * float(ref_norm) / max(1, ref[..., 0].numel()) ** 0.5)
    return _Errors(rel_l2=float(diff.norm() / ref_norm), max_abs=float(diff.abs().max()),
                   row_rel_l2=diff.norm(dim=-1) / row_norm, unwritten=int(nan_rows.sum()))


def _where(w, token: int, head: int) -> str:
    b = int(w.query_request[token])
    i = token - w.qo_indptr_host[b]
    where = f"position {int(w.query_position[token])}" if w.trees is None else \
        f"slot {i}, depth {w.trees[b].depths[i]}, position {w.prefix_lens[b] + w.trees[b].depths[i]}"
    return f"request {b}, query {i} ({where}), head {head}"


def reads_evicted(runner, w) -> bool | None:
    """The NaN diagnostic (docs/gate.md): with the shared page that evicted entries point at filled with
    NaN, does the output turn NaN?  True: the kernel touches memory before the window (a masked read
    is harmless with finite data, and shows here).  None where the layout has no such page.  Leaves
    fresh random data in the buffers."""
    if w.evicted_pages is None or not len(w.evicted_pages):
        return None
    w.fill_random(w.case.seed)
    w.fill_evicted(float("nan"))
    try:
        runner.out.zero_()
        _fresh_inputs(runner)
        runner.run()
        timing.device_sync(w.device)()
        return bool(torch.isnan(runner.out).any())
    finally:
        w.fill_random(w.case.seed)


def _unwritten(runner, w, rows: int) -> str:
    """What ``rows`` NaN output rows on random data are: never written, or, where the cache holds a fill no query
    may read (core.stale), the rows that come out written once zeros stand there instead: the path lets the fill
    into its output.  Leaves the fill in place."""
    if w.unheld is None:
        return f"{rows} output rows never written"
    w.fill_unheld(0.0)
    try:
        runner.out.fill_(float("nan"))
        _fresh_inputs(runner)
        runner.run()
        timing.device_sync(w.device)()
        left = int(torch.isnan(runner.out).any(dim=-1).sum())
    finally:
        w.fill_unheld()
    fill = w.case.cache_fill
    if left >= rows:
        return f"{rows} output rows never written (as many with zeros where the cache holds {fill})"
    return (f"{rows} output rows NaN, {rows - left} of them written with zeros in place of the cache's {fill} where "
            f"no query may read: the path lets those slots into its output")


def check(runner, w, seed: int | None = None, tolerance: Tolerance | None = None, predicted=None) -> GateResult:
    """Gate one planned runner on its workload; leaves fresh random data in the buffers.  ``predicted``: a bool
    per query row, the rows the semantics say this path gets wrong (a known mistake's)."""
    tol = tolerance or TOLERANCES[w.case.dtype]
    seed = w.case.seed if seed is None else seed
    w.fill_random(seed)
    rnd = run_checked(runner, w)
    wrong = (rnd.row_rel_l2 > tol.row_rel_l2).any(dim=1)
    reasons = [_unwritten(runner, w, rnd.unwritten)] if rnd.unwritten else []
    if not rnd.rel_l2 <= tol.rel_l2:
        reasons.append(f"random: rel-L2 {rnd.rel_l2:.3g} > {tol.rel_l2:g}")
    worst_random = float(rnd.row_rel_l2.max())
    if not worst_random <= tol.row_rel_l2:
        t, h = divmod(int(rnd.row_rel_l2.argmax()), w.case.num_qo_heads)
        reasons.append(f"random: row rel-L2 {worst_random:.3g} > {tol.row_rel_l2:g} at {_where(w, t, h)}")
    worst_probe, unwritten = 0.0, rnd.unwritten
    tree = w.trees is not None
    c = w.case
    for s in range(probes.passes(c.num_qo_heads, c.window_left, c.attention_chunk, tree, c.block)):
        edge = probes.fill(w, s, seed)
        pr = run_checked(runner, w)
        wrong |= (pr.row_rel_l2 > tol.row_rel_l2).any(dim=1)
        unwritten = max(unwritten, pr.unwritten)
        row_max = float(pr.row_rel_l2.max())
        if not row_max <= worst_probe:
            worst_probe = row_max
        if not row_max <= tol.row_rel_l2 and len(reasons) < 3:
            t, h = divmod(int(pr.row_rel_l2.argmax()), w.case.num_qo_heads)
            name = probes.edge_name(c.window_left, int(edge[t, h]), c.causal, c.attention_chunk, tree, c.block)
            reasons.append(f"probe ({name}): row rel-L2 {row_max:.3g} > {tol.row_rel_l2:g} at {_where(w, t, h)}")
    w.fill_random(seed)
    as_predicted = None if predicted is None else bool((wrong.cpu() == predicted.cpu()).all())
    return GateResult(passed=not reasons, rel_l2=rnd.rel_l2, max_abs=rnd.max_abs, row_rel_l2=worst_random,
                      probe_rel_l2=worst_probe, unwritten_rows=unwritten, reason="; ".join(reasons),
                      wrong_rows=int(wrong.sum()), rows_as_predicted=as_predicted)
