"""What CUDA-graph mode costs: each FlashInfer path on a step built both ways (``wrapper_mode``), the
difference per step and batch, and the steps whose fastest path it changes."""

from __future__ import annotations

import pandas as pd

from swabench.analysis import wrapper_modes
from swabench.analysis.replay import layer_label
from swabench.core.cases import MODES
from swabench.publish.sections.base import Run, Section, micros, path_of, path_order, ratio


def modes_table(run: Run) -> pd.DataFrame:
    m = wrapper_modes.pairs(run.table)
    if m.empty:
        return m
    m = m.assign(path=path_of(m), layer=m.apply(layer_label, axis=1), step=m["mode"].map(MODES.index))
    m = m.sort_values(["step", "layer", "batch_size", "path"], key=lambda c: c.map(path_order) if c.name == "path"
                      else c)
    plans = [f"{micros(g)}, {micros(p)}" if g == g and p == p else "" for g, p in zip(m["plan_us"], m["plain_plan_us"])]
    return pd.DataFrame({"step": m["mode"], "layer": m["layer"], "batch": m["batch_size"].astype(int), "path": m["path"],
                         "cuda-graph us": m["median_us"].map(micros), "plain us": m["plain_us"].map(micros),
                         "graph - plain (us)": m["cost_us"].map(lambda x: f"{x:+.3g}"),
                         "graph / plain": m["cost"].map(ratio), "plan us (graph, plain)": plans}).reset_index(drop=True)


def cost_said(run: Run) -> list[str]:
    """Per step, backend and batch: the median cost of graph mode over the paths timed both ways."""
    m = wrapper_modes.pairs(run.table)
    if m.empty:
        return []
    said = []
    for mode in [x for x in MODES if x in set(m["mode"])]:
        for backend, g in m[m["mode"] == mode].groupby("backend"):
            per_batch = [f"batch {int(b)}: {h['cost_us'].median():+.3g} us ({h['cost'].median() - 1:+.0%})"
                         for b, h in g.groupby("batch_size")]
            said.append(f"- {mode} [{backend}]: graph mode against plain, median over the paths: {'; '.join(per_batch)} "
                        f"({run.name}).")
    return ["\n".join(said)]


def changes(run: Run) -> list[str]:
    """The steps whose fastest correct path differs between the two modes, with both paths' times."""
    f = wrapper_modes.fastest(run.table)
    if f.empty:
        return []
    moved = f[f["changes"]]
    head = f"The fastest correct path differs between the two modes on {len(moved)} of {len(f)} steps ({run.name})"
    return [head + (":" if len(moved) else ".")] + [
        "\n".join(f"- {row['case']}: in CUDA-graph mode `{row['graph_path']}` {micros(row['graph_us'])} us, plain "
                  f"`{row['plain_path']}` {micros(row['plain_us'])} us." for _, row in moved.iterrows())]


def in_short(run: Run) -> list[str]:
    """For the answers, in one line: per step and backend, the median of what graph mode costs over the paths and
    batches timed both ways (us, and x the plain time), and the steps whose fastest path it changes (by how much at
    most)."""
    m, f = wrapper_modes.pairs(run.table), wrapper_modes.fastest(run.table)
    if m.empty:
        return []
    steps = [f"{mode} " + ", ".join(f"{backend} {g['cost_us'].median():+.3g} us ({g['cost'].median():.2f}x)"
                                    for backend, g in m[m["mode"] == mode].groupby("backend"))
             for mode in [x for x in MODES if x in set(m["mode"])]]
    moved = f[f["changes"]]
    most = f", by up to {(moved['graph_us'] / moved['plain_us']).max():.2f}x" if len(moved) else ""
    return [f"- {'; '.join(steps)}; it changes the fastest correct path on {len(moved)} of {len(f)} steps{most} "
            f"({run.name})."]


def widest(runs: list[Run]) -> Run | None:
    """The timed run with the most steps built both ways: the one the answers speak from (the detail has every
    run)."""
    both = [(len(wrapper_modes.fastest(r.table)), i) for i, r in enumerate(runs) if r.timed]
    both = [(n, i) for n, i in both if n]
    return runs[max(both, key=lambda ni: (ni[0], -ni[1]))[1]] if both else None


TOPIC = "CUDA-graph mode against plain wrappers"

SECTIONS = [
    Section("wrapper-modes", "CUDA-graph mode against plain wrappers",
            "Each FlashInfer path on the same step with its wrappers built in CUDA-graph mode (fixed buffers, a "
            "schedule padded for any batch of the size: how engines capture decode and verify) and plain (how they "
            "run prefill), both captured for timing (a plain wrapper's run() may be, while nothing plans it again): "
            "kernel time each way, the difference, and the plan() time each way.",
            modes_table, lambda run: cost_said(run) + changes(run), timed=True),
]
