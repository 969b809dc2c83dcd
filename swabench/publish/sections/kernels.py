"""What Nsight Systems saw on a profiled run (``swabench profile``): the kernels each path ran per
case, their busy time per call, and that time against the reference path's kernels on the same case,
so that a slow path shows which of its kernels the time goes to."""

from __future__ import annotations

import pandas as pd

from swabench.impls import registry
from swabench.publish.sections.base import Run, Section, path_of, path_order, points, ratio, span
from swabench.store import run_folder, schema

BUSY = "kernels' busy us a call"


def kernel_times(run: Run) -> pd.DataFrame:
    """Per profiled point: its case, path, kernels and busy time a call, with ``ratio`` = that time / the
    reference path's on the same case (NaN where the reference was not profiled there); empty unless the
    run was made under Nsight Systems."""
    if not run.profiled:
        return pd.DataFrame()
    stats = pd.read_csv(run_folder.stored(run.folder, schema.KERNELS), dtype={k: str for k in schema.KEY})
    t = stats.merge(run.table[[*schema.KEY, "storage", "mode"]], on=list(schema.KEY))
    is_ref = [(i, b) == registry.reference_path(s) for i, b, s in zip(t["impl"], t["backend"], t["storage"])]
    ref = t[is_ref].set_index("case_id")["nsys_kernel_us"]
    return t.assign(path=path_of(t), ratio=t["nsys_kernel_us"] / t["case_id"].map(ref))


def kernels_table(run: Run) -> pd.DataFrame:
    t = kernel_times(run)
    if t.empty:
        return t
    t = t.assign(order=t["path"].map(path_order)).sort_values(["case", "order"])
    return pd.DataFrame({"case": t["case"], "path": t["path"], "kernels (launches, busy us a call)": t["kernels"],
                         BUSY: t["nsys_kernel_us"].map(lambda x: f"{x:.3g}"),
                         "/ reference": t["ratio"].map(lambda x: ratio(x) if x == x else "")}).reset_index(drop=True)


def kernels_said(run: Run) -> list[str]:
    t = kernel_times(run)
    if t.empty:
        return []
    others = t[t["ratio"].notna() & (t["ratio"] != 1)]
    said = [f"- `{impl}` [{backend}]: its kernels take {span(g['ratio'])} times the reference's busy time over "
            f"{points(len(g))} ({run.name})."
            for (impl, backend), g in sorted(others.groupby(["impl", "backend"]),
                                             key=lambda kv: (registry.order(kv[0][0]), kv[0][1]))]
    return ["\n".join(said)] if said else []


SECTIONS = [
    Section("kernels", "Under Nsight Systems: the kernels each path ran",
            lambda: f"From a run made under Nsight Systems (`swabench profile`): per case and path, each kernel "
            f"launched in a call with its launches and busy time a call, the kernels' busy time a call, and that "
            f"time / the reference path's ({registry.describe_reference()}) on the same case. Tracing lengthens "
            f"every call, so a profiled run's graph times stay out of the other tables.", kernels_table,
            kernels_said),
]
