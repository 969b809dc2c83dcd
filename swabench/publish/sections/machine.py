"""How far each path is from what the machine can do: the DRAM bytes Nsight Compute counted each path
reading against the bytes its window needs (read amplification), and each timed point's time against
its roofline floor (the larger of its bytes at the measured copy bandwidth and its useful flops at the
measured matmul rate)."""

from __future__ import annotations

import re

import pandas as pd

from swabench.core.footprint import ELEMENT_BYTES
from swabench.impls import registry
from swabench.publish.markdown import library_versions
from swabench.publish.sections.base import FINDINGS, Run, Section, micros, mode_order, path_order, points, ratio
from swabench.store import run_folder, schema

MB = 1e6
AMPLIFIED = 1.25  # a path reading more than this times its floor reads bytes its window does not need
CLIFF = 10  # a read amplification this large is a finding of its own: the page table's keys read whole


def counted(table: pd.DataFrame) -> pd.DataFrame:
    """The points Nsight Compute counted that gave the right answer, with ``path`` ('impl [backend]')."""
    if "dram_read_bytes" not in table:
        return table.iloc[0:0]
    t = table[table["dram_read_bytes"].notna() & (table["status"] == "pass")]
    return t.assign(path=t["impl"].astype(str) + " [" + t["backend"].astype(str) + "]")


def short_kernel(name: str) -> str:
    """A kernel's function name without namespaces, template arguments or parameters."""
    head = re.sub(r"^void\s+", "", str(name)).split("(")[0]
    depth, out = 0, []
    for ch in head:  # drop everything inside <...>
        depth += ch == "<"
        if not depth:
            out.append(ch)
        depth -= ch == ">" and depth > 0
    return "".join(out).split("::")[-1].strip() or str(name)


def kernel_names(run: Run) -> dict[tuple, str]:
    """Per counted point: the kernels of its call, short names in launch order ('A + B')."""
    path = run_folder.stored(run.folder, schema.COUNTERS)
    try:
        k = pd.read_csv(path, dtype={c: str for c in schema.KEY})
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return {}
    k = k.sort_values("ncu_id")
    return {key: " + ".join(short_kernel(n) for n in g["kernel"]) for key, g in k.groupby(list(schema.KEY))}


def full_table_bytes(t: pd.DataFrame) -> pd.Series:
    """The K/V every page of a point's table holds (every key of every request), at the cache's width."""
    width = t["kv_dtype"].fillna(t["dtype"]).map(ELEMENT_BYTES).astype(float)
    return 2 * t["total_kv"].astype(float) * t["num_kv_heads"] * t["head_dim"] * width


def bytes_read(run: Run) -> pd.DataFrame:
    """Per step and path: the points counted, DRAM bytes read / the bytes its window needs (median (least-most)),
    the median of each, DRAM bytes written / the output's, and the kernels of one call."""
    t = counted(run.table)
    if t.empty:
        return pd.DataFrame()
    names = kernel_names(run)
    rows = []
    for (mode, path), g in t.groupby(["mode", "path"]):
        amp = g["read_amplification"]
        output = g["min_bytes"] - g["min_read_bytes"]
        kernels = pd.Series([names.get(k, "") for k in zip(g["case_id"], g["impl"], g["backend"])]).value_counts()
        rows.append({"step": mode, "path": path, "points": len(g),
                     "DRAM read / floor": f"{ratio(amp.median())}x" + (f" ({ratio(amp.min())}-{ratio(amp.max())})"
                                                                       if len(g) > 1 else ""),
                     "DRAM read MB (median)": f"{g['dram_read_bytes'].median() / MB:.3g}",
                     "floor MB (median)": f"{g['min_read_bytes'].median() / MB:.3g}",
                     "DRAM written / output": f"{ratio((g['dram_write_bytes'] / output).median())}x",
                     "kernels of a call": kernels.index[0] if len(kernels) else ""})
    out = pd.DataFrame(rows)
    out = out.assign(order=out["path"].map(path_order)).sort_values(["step", "order"], key=mode_order)
    return out.drop(columns="order").reset_index(drop=True)


def timed_twin(runs: list[Run], counted_run: Run) -> pd.Series:
    """Graph medians of the counted run's points, from timed runs of the same scenario on the same release."""
    same = [r for r in runs if r.timed and not r.profiled and r.meta.get("scenario") == counted_run.meta.get("scenario")
            and library_versions(r.meta) == library_versions(counted_run.meta)]
    if not same:
        return pd.Series(dtype=float)
    t = pd.concat([r.table.dropna(subset=["median_us"]) for r in same]).drop_duplicates(list(schema.KEY))
    return t.set_index(list(schema.KEY))["median_us"]


def cliff(run: Run, times: pd.Series | None = None) -> str:
    """The worst read amplification of a correct path, in one sentence with its numbers: what it read, what its
    window needs, the whole table where it read that, and the other paths on the same step."""
    t = counted(run.table)
    t = t[t["kind"] == "correct"]
    if t.empty or t["read_amplification"].max() < CLIFF:
        return ""
    worst = t.loc[t["read_amplification"].idxmax()]
    same = t[t["case_id"] == worst["case_id"]].sort_values("read_amplification")
    table_mb = full_table_bytes(same.loc[[worst.name]]).iloc[0] / MB

    def timed(r) -> str:
        us = (times if times is not None else pd.Series(dtype=float)).get((r["case_id"], r["impl"], r["backend"]))
        return f" in {micros(us)} us" if us is not None and us == us else ""

    whole = f": the whole K/V its page table holds ({table_mb:.4g} MB), of which the window masks all but the " \
            f"last keys" if worst["dram_read_bytes"] >= 0.9 * table_mb * MB else ""
    others = [f"`{r['path']}` {r['dram_read_bytes'] / MB:.3g} MB ({ratio(r['read_amplification'])}x){timed(r)}"
              for _, r in same.iterrows() if r.name != worst.name]
    return (f"On `{worst['case']}` ({worst['mode']}), `{worst['path']}` read {worst['dram_read_bytes'] / MB:.4g} MB "
            f"from DRAM{timed(worst)} for a window that needs {worst['min_read_bytes'] / MB:.3g} MB "
            f"({ratio(worst['read_amplification'])}x){whole}" + (f"; on the same step " + ", ".join(others)
                                                                 if others else "") + f" ({run.name}).")


def bytes_said(run: Run, times: pd.Series | None = None) -> list[str]:
    t = counted(run.table)
    if t.empty:
        return []
    c = run.meta.get("counters") or {}
    cal = c.get("calibration") or {}
    said = [f"{points(len(t))} counted under {c.get('tool', 'ncu')} ({c.get('l2', 'cold')} L2, "
            f"{c.get('per_point_s')} s a point); the calibration copy of {cal.get('bytes', 0) / MB:.4g} MB read "
            f"{cal['read_ratio']:.4f}x its bytes ({run.name})." if cal.get("read_ratio") else ""]
    return said + [cliff(run, times)]


def bytes_across(runs: list[Run]) -> list[str]:
    """The findings page's section: each counted run's sentences (with times from its timed twin) and table."""
    from swabench.publish.markdown import markdown_table

    body = []
    for r in runs:
        table = bytes_read(r)
        if len(table):
            body += [s for s in bytes_said(r, timed_twin(runs, r)) if s] + [f"From {r.name}:", markdown_table(table)]
    return body


def roofline(run: Run) -> pd.DataFrame:
    """Per step and correct path: its timed points, how many are memory-bound, and its time against the floor
    (``pct_of_floor``: 100 is the machine's limit), median and best."""
    t = run.table[(run.table["kind"] == "correct") & (run.table["status"] == "pass")]
    if "pct_of_floor" not in t or t["pct_of_floor"].isna().all():
        return pd.DataFrame()
    t = t.dropna(subset=["pct_of_floor"])
    memory = t["min_bytes"] / (run.meta["peaks"]["copy_tbps"] * 1e12) >= \
        t["flops"] / (run.meta["peaks"]["bf16_matmul_tflops"] * 1e12)
    t = t.assign(path=t["impl"] + " [" + t["backend"] + "]", memory=memory)
    rows = [{"step": mode, "path": path, "points": len(g), "memory-bound": f"{int(g['memory'].sum())}/{len(g)}",
             "% of floor (median)": f"{g['pct_of_floor'].median():.0f}%", "best": f"{g['pct_of_floor'].max():.0f}%"}
            for (mode, path), g in t.groupby(["mode", "path"])]
    out = pd.DataFrame(rows)
    out = out.assign(order=out["path"].map(path_order)).sort_values(["step", "order"], key=mode_order)
    return out.drop(columns="order").reset_index(drop=True)


def roofline_said(run: Run) -> list[str]:
    peaks = run.meta.get("peaks")
    if not peaks or "pct_of_floor" not in run.table or run.table["pct_of_floor"].isna().all():
        return []
    return [f"Floors at {peaks['copy_tbps']:.2f} TB/s and {peaks['bf16_matmul_tflops']:.0f} TFLOP/s, "
            f"as measured on the node ({run.name})."]


def step_limits(run: Run, mode: str, impl: str, backend: str) -> str:
    """'42% of its floor' for a path on a step: its median ``pct_of_floor`` over the step's timed cases."""
    t = run.table
    g = t[(t["mode"] == mode) & (t["impl"] == impl) & (t["backend"] == backend)]
    if "pct_of_floor" not in g or g["pct_of_floor"].isna().all():
        return ""
    return f"{g['pct_of_floor'].median():.0f}% of its floor"


def amplified(runs: list[Run], mode: str) -> str:
    """The paths that read more than AMPLIFIED times their floor on a step (median over their counted points),
    worst first, with how many read within it, over every counted run; '' where none was counted."""
    found = [counted(r.table).assign(run=r.name) for r in runs]
    t = pd.concat([f for f in found if len(f)] or [pd.DataFrame(columns=["mode"])])
    t = t[t["mode"] == mode]
    if t.empty:
        return ""
    per_path = t.groupby("path")["read_amplification"].median().sort_values(ascending=False)
    high = per_path[per_path > AMPLIFIED]
    words = [f"`{p}` {ratio(a)}x" for p, a in high.items()]
    within = len(per_path) - len(high)
    return ", ".join(words + ([f"the other {within} within {AMPLIFIED}x"] if within and len(high) else
                              [f"all {within} within {AMPLIFIED}x"] if within else [])) \
        + f" ({', '.join(dict.fromkeys(t['run']))})"


SECTIONS = [
    Section("roofline", "The machine's limit: each path against its roofline floor",
            "A point's floor is the larger of two times: the bytes a perfect kernel moves (`min_bytes`: Q and the "
            "window's K/V read once from the start of its first page, O written once) at the node's measured copy "
            "bandwidth, and its useful flops at the measured bf16 matmul rate. `% of floor` = floor / kernel time: "
            "100% is the machine's limit. Memory-bound: the bytes' time is the larger.", roofline, roofline_said,
            timed=True),
    Section("bytes", "Bytes each path reads",
            "From a run under Nsight Compute (`swabench profile --tool ncu`): each counted call's DRAM bytes read, "
            "summed over its kernels, over the bytes a perfect kernel reads (Q and the window's K/V from the start "
            "of its first page: `min_read_bytes`); DRAM bytes written over the output's (below 1 where the output "
            "is still in L2 when the kernel ends); the kernels of one call. ncu replays each kernel with the clocks "
            "as found and the caches flushed before it, so its durations are never timings; the times quoted are "
            "the same points' CUDA-graph medians from the timed run of the same scenario.", bytes_read, bytes_said,
            profiled=True, across=bytes_across),
]
