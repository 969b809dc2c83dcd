"""What a path pays before its first timed call: the compile a JIT peer (FlexAttention under Inductor)
runs on the first call of each compile class, recorded per point as ``compile_s`` and never timed."""

from __future__ import annotations

import pandas as pd

from swabench.impls import registry
from swabench.publish.sections.base import Run, Section, path_of

COMPILED_S = 1.0  # a first call this long compiled something; under it the compile class was already built


def compiles(run: Run) -> pd.DataFrame:
    """Per path with a recorded first call: the points, those whose first call compiled, the seconds they
    took in all, and the longest with its case."""
    t = run.table.dropna(subset=["compile_s"])
    if t.empty:
        return pd.DataFrame()
    rows = []
    for path, g in t.assign(path=path_of(t)).groupby("path", sort=False):
        longest = g.loc[g["compile_s"].idxmax()]
        compiled = g[g["compile_s"] >= COMPILED_S]
        rows.append({"path": path, "points": len(g), f"first calls of {COMPILED_S:g} s or more": len(compiled),
                     "their seconds": f"{compiled['compile_s'].sum():.1f}", "longest s": f"{longest['compile_s']:.1f}",
                     "longest at": longest["case"], "order": registry.order(longest["impl"])})
    return pd.DataFrame(rows).sort_values(["order", "path"]).drop(columns="order").reset_index(drop=True)


def compiles_said(run: Run) -> list[str]:
    t = compiles(run)
    if t.empty:
        return []
    longest = t.loc[t["longest s"].astype(float).idxmax()]
    impl, backend = longest["path"].split(" [")
    return [f"- The longest first call: `{impl}` [{backend}, {longest['longest s']} s at {longest['longest at']} "
            f"({run.name})."]


SECTIONS = [
    Section("compiles", "Compile cost: what a path pays before its first timed call",
            f"Per path that records its first call (`compile_s`: Inductor's compile of FlexAttention, once per "
            f"compile class, and the first block mask of a process): the points, those whose first call took "
            f"{COMPILED_S:g} s or more (it compiled), their seconds in all, and the longest with its case. The "
            f"timed numbers start after it: no compile reaches them.", compiles, compiles_said, timed=True),
]
