"""What a path pays before its first timed call: the compile a JIT peer (FlexAttention under Inductor)
runs on the first call of each compile class, recorded per point as ``compile_s`` and never timed."""

from __future__ import annotations

import pandas as pd

from swabench.publish.sections.base import Run, Section, path_of, path_order

COMPILED_S = 1.0  # a first call this long compiled something; under it the compile class was already built


def _longest(t: pd.DataFrame) -> pd.DataFrame:
    """Per path with a recorded first call: its points, the first calls of COMPILED_S or more and their
    seconds, and its longest first call (the row), in registration order."""
    t = t.dropna(subset=["compile_s"])
    if t.empty:
        return t
    t = t.assign(path=path_of(t))
    longest = t.loc[t.groupby("path")["compile_s"].idxmax()].set_index("path")
    compiled = t[t["compile_s"] >= COMPILED_S].groupby("path")["compile_s"]
    out = longest.assign(points=t.groupby("path").size(), compiled=compiled.size(), compiled_s=compiled.sum())
    return out.fillna({"compiled": 0, "compiled_s": 0.0}).reset_index() \
        .sort_values("path", key=lambda c: c.map(path_order)).reset_index(drop=True)


def compiles(run: Run) -> pd.DataFrame:
    t = _longest(run.table)
    if t.empty:
        return pd.DataFrame()
    return pd.DataFrame({"path": t["path"], "points": t["points"],
                         f"first calls of {COMPILED_S:g} s or more": t["compiled"].astype(int),
                         "their seconds": t["compiled_s"].map(lambda s: f"{s:.1f}"),
                         "longest s": t["compile_s"].map(lambda s: f"{s:.1f}"), "longest at": t["case"]})


def compiles_said(run: Run) -> list[str]:
    t = _longest(run.table)
    if t.empty:
        return []
    top = t.loc[t["compile_s"].idxmax()]
    return [f"- The longest first call: `{top['impl']}` [{top['backend']}], {top['compile_s']:.1f} s at {top['case']} "
            f"({run.name})."]


TOPIC = "Compile cost before the first timed call"

SECTIONS = [
    Section("compiles", "Compile cost: what a path pays before its first timed call",
            f"Per path that records its first call (`compile_s`: its first plan and call, with Inductor's compile of "
            f"FlexAttention once per compile class and the first block mask of a process): the points, those whose "
            f"first call took {COMPILED_S:g} s or more (as a rule, a compile), their seconds in all, and the longest "
            f"with its case. The timed numbers start after it: no compile reaches them.", compiles, compiles_said,
            timed=True),
]
