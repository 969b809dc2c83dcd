"""What Nsight Systems saw on a profiled run (``swabench profile``): the kernels each path ran per
case, their busy time per call, and that time against the reference path's kernels on the same case,
so that a slow path shows which of its kernels the time goes to."""

from __future__ import annotations

import pandas as pd

from swabench.impls import registry
from swabench.publish.sections.base import Run, Section, micros, path_of, path_order, points, ratio, span
from swabench.store import schema, tables


def kernel_times(run: Run) -> pd.DataFrame:
    """Per profiled point, in the run's order: its case, path, kernels and busy time a call, whether it is
    the reference path, and ``ratio`` = its busy time / the reference path's on the same case (NaN where
    the reference was not profiled there); empty unless the run was made under Nsight Systems."""
    stats = tables.optional_table(run.folder, schema.KERNELS)
    if stats is None or stats.empty:  # no nsys run, or one that tied no kernel to a point
        return pd.DataFrame()
    stats["impl"] = stats["impl"].replace(tables.impl_renames(run.folder))
    t = run.table[[*schema.KEY, "kind", "status", "storage"]].merge(stats, on=list(schema.KEY))
    if t.empty:
        return t
    reference = pd.Series([(i, b) == registry.reference_path(s) for i, b, s in
                           zip(t["impl"], t["backend"], t["storage"])], index=t.index)
    ref_us = t[reference].set_index("case_id")["nsys_kernel_us"]
    return t.assign(path=path_of(t), reference=reference, ratio=t["nsys_kernel_us"] / t["case_id"].map(ref_us).astype(float))


def kernels_table(run: Run) -> pd.DataFrame:
    t = kernel_times(run)
    if t.empty:
        return t
    case_rank = {c: i for i, c in enumerate(dict.fromkeys(t["case_id"]))}
    t = t.assign(rank=t["case_id"].map(case_rank), order=t["path"].map(path_order)).sort_values(["rank", "order"])
    return pd.DataFrame({"case": t["case"], "path": t["path"], "kernels (launches, busy us a call)": t["kernels"],
                         "kernels' busy us a call": t["nsys_kernel_us"].map(micros),
                         "its time / the reference path's": t["ratio"].map(lambda x: ratio(x) if x == x else "")}
                        ).reset_index(drop=True)


def kernels_said(run: Run) -> list[str]:
    t = kernel_times(run)
    if t.empty:
        return []
    others = t[~t["reference"] & t["ratio"].notna() & (t["kind"] == "correct") & (t["status"] == "pass")]
    said = [f"- `{impl}` [{backend}]: its kernels take {span(g['ratio'])} times the reference's busy time over "
            f"{points(len(g))} ({run.name})."
            for (impl, backend), g in sorted(others.groupby(["impl", "backend"]),
                                             key=lambda kv: (registry.order(kv[0][0]), kv[0][1]))]
    return ["\n".join(said)] if said else []


TOPIC = "Under Nsight Systems: the kernels each path ran"

SECTIONS = [
    Section("kernels", "Under Nsight Systems: the kernels each path ran",
            lambda: f"From a run made under Nsight Systems (`swabench profile`): per case and path, each kernel "
            f"launched in a call with its launches and busy time a call, the kernels' busy time a call, and that "
            f"time / the reference path's ({registry.describe_reference()}) on the same case. Tracing lengthens "
            f"every call, so the findings page keeps a profiled run's graph times out of its other tables.",
            kernels_table, kernels_said, profiled=True),
]
