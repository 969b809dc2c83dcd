"""How far each path is from what the machine can do: the DRAM bytes Nsight Compute counted each path
reading against the bytes its window needs (read amplification), and each timed point's time against
its roofline floor (the larger of its bytes at the GPU's DRAM ceiling and its useful flops at its bf16
tensor-core ceiling: the part's peak at its maximum clocks, with the node's measured copy, read and matmul beside
it as attainable)."""

from __future__ import annotations

import re

import pandas as pd

from swabench.analysis import derived
from swabench.core.cases import MODES
from swabench.core.footprint import ELEMENT_BYTES
from swabench.measure.ceiling import ceilings
from swabench.publish.markdown import library_versions, markdown_table
from swabench.publish.sections.base import (Run, Section, figure_link, micros, mode_order, path_of, path_order, points,
                                            ranged, ratio, run_for_step)
from swabench.store import schema, tables

MB = 1e6
AMPLIFIED = 1.25  # a path reading more than this times what its window needs reads bytes it does not need
WHOLE = "the whole call, as one workload"
CLIFF = 10  # a read amplification this large is a finding of its own: the page table's keys read whole


def trusted(run: Run) -> bool:
    """Whether a counted run's calibration copy read its bytes within 1% (or, on a warm L2, was not held to it)."""
    return ((run.meta.get("counters") or {}).get("calibration") or {}).get("trusted") is not False


def counted_points(table: pd.DataFrame) -> pd.DataFrame:
    """The points Nsight Compute counted that gave the right answer, with ``path`` ('impl [backend]')."""
    if "dram_read_bytes" not in table:
        return table.iloc[0:0]
    t = table[table["dram_read_bytes"].notna() & (table["status"] == "pass")]
    return t.assign(path=path_of(t))


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
    k = tables.optional_table(run.folder, schema.COUNTERS)
    if k is None or k.empty:
        return {}
    k = k.sort_values("ncu_id")
    return {key: " + ".join(short_kernel(n) for n in g["kernel"]) for key, g in k.groupby(list(schema.KEY))}


def full_table_bytes(t: pd.DataFrame) -> pd.Series:
    """The K/V every page of a point's table holds (every key of every request), at the cache's width."""
    width = t["kv_dtype"].fillna(t["dtype"]).map(ELEMENT_BYTES).astype(float)
    return 2 * t["total_kv"].astype(float) * t["num_kv_heads"] * t["head_dim"] * width


def _mb(n: float) -> str:
    """Bytes as MB, three significant digits without an exponent (8.72, 35.5, 2150)."""
    return micros(n / MB)


def bytes_table(run: Run) -> pd.DataFrame:
    """Per step and path: the points counted, DRAM bytes read / the bytes the window needs (median (least-most)),
    the median of each, DRAM bytes written / the output's, and the kernels of one call."""
    t = counted_points(run.table)
    if t.empty:
        return pd.DataFrame()
    names = kernel_names(run)
    whole = counted_whole(run)
    rows = []
    for (mode, path), g in t.groupby(["mode", "path"]):
        amp = g["read_amplification"]
        output = g["min_bytes"] - g["min_read_bytes"]
        kernels = pd.Series([names.get(k, "") for k in zip(g["case_id"], g["impl"], g["backend"])]).value_counts()
        rows.append({"step": mode, "path": path, "points": len(g),
                     "DRAM read / needed": f"{ratio(amp.median())}x" + (f" ({ranged(amp)})"
                                                                        if ranged(amp) != ratio(amp.median()) else ""),
                     "DRAM read MB (median)": _mb(g["dram_read_bytes"].median()),
                     "needed MB (median)": _mb(g["min_read_bytes"].median()),
                     "DRAM written / output": f"{ratio((g['dram_write_bytes'] / output).median())}x",
                     "kernels of a call": WHOLE if whole else kernels.index[0] if len(kernels) else ""})
    out = pd.DataFrame(rows)
    out = out.assign(order=out["path"].map(path_order)).sort_values(["step", "order"], key=mode_order)
    return out.drop(columns="order").reset_index(drop=True)


def counted_whole(run: Run) -> bool:
    """Whether ncu counted each call as one workload (``--ncu-unit call``), not kernel by kernel."""
    return (run.meta.get("counters") or {}).get("unit") == "call"


def timed_twin(runs: list[Run], counted_run: Run) -> pd.Series:
    """Graph medians of the counted run's points, from timed runs of the same scenario on the same GPU, release
    and L2 state."""
    l2 = (counted_run.meta.get("counters") or {}).get("l2", "cold")
    same = [r for r in runs if r.timed and not r.profiled and r.meta.get("scenario") == counted_run.meta.get("scenario")
            and r.meta.get("gpu") == counted_run.meta.get("gpu")
            and library_versions(r.meta) == library_versions(counted_run.meta)
            and (r.meta.get("selection") or {}).get("l2", "cold") == l2]
    if not same:
        return pd.Series(dtype=float)
    t = pd.concat([r.table.dropna(subset=["median_us"]) for r in same]).drop_duplicates(list(schema.KEY))
    return t.set_index(list(schema.KEY))["median_us"]


def _correct_counted(run: Run) -> pd.DataFrame:
    t = counted_points(run.table)
    return t[t["kind"] == "correct"]


def cliff(run: Run, times: pd.Series | None = None, beside: int | None = None) -> str:
    """The worst read amplification of a correct path, in one sentence with its numbers: what it read, what its
    window needs, the whole table where it read that, and the other paths on the same step (the ``beside`` that
    read least, or all); none for a run
    counted a call at a time, whose sums name no kernel and hold the call's own intermediates."""
    t = _correct_counted(run)
    if t.empty or t["read_amplification"].max() < CLIFF or counted_whole(run):  # no kernel to name
        return ""
    worst = t.loc[t["read_amplification"].idxmax()]
    same = t[t["case_id"] == worst["case_id"]].sort_values("read_amplification")
    table_bytes = full_table_bytes(same.loc[[worst.name]]).iloc[0]
    times = times if times is not None else pd.Series(dtype=float)

    def timed(r) -> str:
        us = times.get((r["case_id"], r["impl"], r["backend"]))
        return f" in {micros(us)} us" if us is not None and us == us else ""

    whole = (f": the whole K/V its page table holds ({_mb(table_bytes)} MB)"
             if worst["dram_read_bytes"] >= 0.9 * table_bytes else "")
    others = [f"`{r['path']}` {_mb(r['dram_read_bytes'])} MB ({ratio(r['read_amplification'])}x){timed(r)}"
              for _, r in same.iterrows() if r.name != worst.name][:beside]
    return (f"On `{worst['case']}` ({worst['mode']}), `{worst['path']}` read {_mb(worst['dram_read_bytes'])} MB "
            f"from DRAM{timed(worst)} for a window that needs {_mb(worst['min_read_bytes'])} MB "
            f"({ratio(worst['read_amplification'])}x){whole}" + ("; on the same step " + ", ".join(others)
                                                                 if others else "") + f" ({run.name}).")


def worst_cliff(runs: list[Run]) -> str:
    """``cliff`` of the trusted run counted kernel by kernel with the largest read amplification, with times from
    its timed twin."""
    found = [(r, _correct_counted(r)["read_amplification"].max()) for r in runs if trusted(r) and not counted_whole(r)]
    found = [(r, amp) for r, amp in found if amp == amp]  # NaN: the run counted no correct path
    if not found:
        return ""
    worst = max(found, key=lambda f: f[1])[0]
    return cliff(worst, timed_twin(runs, worst), beside=1)


def bytes_said(run: Run, times: pd.Series | None = None) -> list[str]:
    t = counted_points(run.table)
    if t.empty:
        return []
    c = run.meta.get("counters") or {}
    cal = c.get("calibration") or {}
    sweep = run.meta.get("wall_s")
    cost = (f"{sweep / len(run.table):.2f} s a point in the sweep, {c.get('per_point_s')} s with ncu's start and the "
            f"JIT warm-up" if sweep else f"{c.get('per_point_s')} s a point")
    copy = (f"the calibration copy of {_mb(cal['bytes'])} MB read {cal['read_ratio']:.4f}x its bytes"
            if cal.get("read_ratio") is not None else "the calibration copy was not counted")
    whole = counted_whole(run)
    unit = "each call as one workload" if whole else "kernel by kernel"
    said = [f"{points(len(t))} counted under {c.get('tool', 'ncu')} ({c.get('l2', 'cold')} L2, {unit}, {cost}); {copy}"
            + ("" if trusted(run) else ": outside 1%, so none of this run's counts is to be trusted") + f" ({run.name})."]
    if whole:
        written = (t["dram_write_bytes"] / (t["min_bytes"] - t["min_read_bytes"])).max()
        said.append(f"Each call was counted as one workload, so its bytes include the intermediates it writes and "
                    f"reads back (DRAM written up to {ratio(written)}x the output), and no kernel is named.")
    return said + ([cliff(run, times)] if trusted(run) else [])


def bytes_across(runs: list[Run]) -> list[str]:
    """The findings page's section: each counted run's sentences (with times from its timed twin), table and figure."""
    body = []
    for r in runs:
        table = bytes_table(r)
        if len(table):
            body += bytes_said(r, timed_twin(runs, r)) + [f"From {r.name}:", markdown_table(table),
                                                          figure_link(r, "bytes_read")]
    return [part for part in body if part]


def amplified(runs: list[Run], mode: str, most: int = 3, named: bool = True) -> str:
    """How many paths read past AMPLIFIED times what their window needs on a step, of how many counted, and the
    ``most`` that read the most (median (least-most) over their counted points of every trusted run), worst first;
    '' where none was counted; a path counted only a call at a time is marked so (its intermediates are in its
    bytes: "(calls)"); the runs named at the end unless not ``named``."""
    found = [counted_points(r.table).assign(run=r.name, whole=counted_whole(r)) for r in runs if trusted(r)]
    found = [f[f["mode"] == mode] for f in found]
    found = [f for f in found if len(f)]
    if not found:
        return ""
    rows = pd.concat(found)
    amp, whole = rows.groupby("path")["read_amplification"], rows.groupby("path")["whole"].all()
    per_path, low, high_end = amp.median().sort_values(ascending=False), amp.min(), amp.max()
    high = per_path[per_path > AMPLIFIED]
    words = [f"`{p}` {ratio(a)}x" + (f" ({ratio(low[p])}-{ratio(high_end[p])})" if low[p] != high_end[p] else "")
             + (" (calls)" if whole[p] else "") for p, a in high.items()][:most]
    said = (f"{len(high)} of {len(per_path)} past {AMPLIFIED}x, worst " + ", ".join(words) if len(high)
            else f"all {len(per_path)} within {AMPLIFIED}x")
    return said + (f" ({', '.join(dict.fromkeys(f['run'].iloc[0] for f in found))})" if named else "")


def counted_runs(runs: list[Run]) -> list[Run]:
    """The runs whose counts the pages trust and that counted a point."""
    return [r for r in runs if trusted(r) and len(counted_points(r.table))]


def _floored(run: Run) -> pd.DataFrame:
    """The run's correct, passed, timed points with a floor, and their ``path``."""
    t = run.table[(run.table["kind"] == "correct") & (run.table["status"] == "pass")]
    if "pct_of_floor" not in t:
        return t.iloc[0:0]
    t = t.dropna(subset=["pct_of_floor"])
    return t.assign(path=path_of(t))


def ceiling_parts(peaks: dict, how: bool = True) -> tuple[str, str]:
    """The ceiling the floors divide by, each side with what it is ('4.81 TB/s (peak: ...)'), or the
    measured copy or matmul where the run has no peak; ``how``: with how the peak is had."""
    tbps, tflops = ceilings(peaks)
    memory = "peak: NVML's maximum memory clock x bus width" if how else "peak at maximum clocks"
    compute = "peak: SMs x maximum SM clock x tensor-core flops per clock" if how else "peak at maximum clocks"
    return (f"{tbps:.2f} TB/s ({memory if peaks.get('datasheet_tbps') else 'measured copy'})",
            f"{tflops:.0f} TFLOP/s ({compute if peaks.get('datasheet_tflops') else 'measured matmul'})")


def attainable(peaks: dict) -> str:
    """What the node attained, measured: 'copy 4.20 TB/s, read 4.32 TB/s, bf16 matmul 793 TFLOP/s'."""
    read = f", read {peaks['read_tbps']:.2f} TB/s" if peaks.get("read_tbps") else ""
    return f"copy {peaks['copy_tbps']:.2f} TB/s{read}, bf16 matmul {peaks['bf16_matmul_tflops']:.0f} TFLOP/s"


def ceiling_said(peaks: dict) -> str:
    """Which ceiling a run's floors divide by, and the attainable rates beside it."""
    memory, compute = ceiling_parts(peaks)
    return f"the ceiling {memory} and {compute}; attainable, measured on the node: {attainable(peaks)}"


def roofline(run: Run) -> pd.DataFrame:
    """One row per correct path, one column per step: its timed points' time against their floor
    (``pct_of_floor``: 100% runs at the GPU's ceiling, which no kernel reaches), median (best, points)."""
    t = _floored(run)
    if t.empty:
        return pd.DataFrame()
    cells = t.groupby(["path", "mode"])["pct_of_floor"].agg(["median", "max", "size"]).reset_index()
    cells["cell"] = [f"{m:.0f}% ({b:.0f}%, {n})" for m, b, n in zip(cells["median"], cells["max"], cells["size"])]
    wide = cells.pivot(index="path", columns="mode", values="cell").fillna("")
    wide = wide[[m for m in MODES if m in wide.columns]].reset_index()
    return wide.assign(order=wide["path"].map(path_order)).sort_values("order").drop(columns="order") \
        .reset_index(drop=True)


def roofline_said(run: Run) -> list[str]:
    t = _floored(run)
    if t.empty:
        return []
    peaks = run.meta["peaks"]
    bound = derived.memory_bound(t, peaks).groupby(t["mode"]).agg(["sum", "size"])
    steps = ", ".join(f"{m} {int(bound.loc[m, 'sum'])} of {int(bound.loc[m, 'size'])}" for m in MODES if m in bound.index)
    return [f"Floors at {ceiling_said(peaks)}; memory-bound points per step: {steps} ({run.name})."]


def roofline_across(runs: list[Run]) -> list[str]:
    """The findings page's section: the runs the answers draw each step from, one table and figure each."""
    chosen = {id(r): r for r in (run_for_step(runs, m) for m in MODES) if r is not None}.values()
    body = []
    for r in chosen:
        table = roofline(r)
        if len(table):
            body += roofline_said(r) + [f"From {r.name}:", markdown_table(table), figure_link(r, "roofline")]
    return [part for part in body if part]


def step_limits(run: Run, mode: str, impl: str, backend: str) -> str:
    """'42%' (of its floor) for a path on a step: its median ``pct_of_floor`` over the step's timed cases."""
    t = run.table
    g = t[(t["mode"] == mode) & (t["impl"] == impl) & (t["backend"] == backend)]
    if "pct_of_floor" not in g or g["pct_of_floor"].isna().all():
        return ""
    return f"{g['pct_of_floor'].median():.0f}%"


TOPIC = "The machine's limit: roofline floors and the bytes each path reads"

SECTIONS = [
    Section("roofline", "The machine's limit: each path against its roofline floor",
            "A point's floor is the larger of two times: the bytes a kernel reading whole pages of its table moves "
            "(`min_bytes`: Q and the window's K/V read once from the start of its first page, O written once) at "
            "the GPU's DRAM ceiling, and its useful flops at its bf16 tensor-core ceiling: the part's peak at its "
            "maximum clocks (DRAM from NVML's maximum memory clock and bus width; bf16 from the SMs, their maximum "
            "clock and the tensor cores' flops per clock), or the measured copy or matmul where a run has no peak, "
            "as each run says. A cell is the path's floor / its time on the step (`pct_of_floor`; 100% runs at the "
            "ceiling, which no kernel reaches; the line above each table gives the node's measured copy, read and "
            "matmul rates, what a kernel can attain): median (best, points). "
            "Memory-bound: the bytes' time is the larger. The findings page shows the runs its answers draw on.",
            roofline, roofline_said, timed=True, across=roofline_across),
    Section("bytes", "Bytes each path reads",
            "From a run under Nsight Compute (`swabench profile --tool ncu`): each counted call's DRAM bytes read, "
            "summed over its kernels, over the bytes its window needs (Q and the window's K/V from the start of "
            "its first page: `min_read_bytes`); DRAM bytes written over the output's (below 1 where the output "
            "is still in L2 when the kernel ends); the kernels of one call. ncu replays each kernel with the clocks "
            "as found and the caches flushed before it, so its durations are never timings; the times quoted are "
            "the same points' CUDA-graph medians from the timed run of the same scenario, GPU, release and L2 state.",
            bytes_table, bytes_said, profiled=True, across=bytes_across),
]
