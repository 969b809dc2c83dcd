"""How far the numbers can be trusted and what they needed: noise per run, kernel times per path,
the workspace each shape took, a launch over several GPUs against one, and which declared paths have run on a GPU
at all."""

from __future__ import annotations

import pandas as pd

from swabench.analysis import coverage
from swabench.impls import registry
from swabench.publish.markdown import markdown_table
from swabench.publish.sections.base import FINDINGS, LONG_US, NOISE, REPORT, SUMMARY, Run, Section
from swabench.publish.sections.machine import attainable, ceiling_parts
from swabench.store import run_folder

# the smallest workspace a runner gets, as its library declares it (None: no library takes one)
WORKSPACE_MIB = next((lib.workspace_bytes >> 20 for lib in registry.libraries() if lib.workspace_bytes), None)


def timing_matrix(run: Run) -> pd.DataFrame:
    """Per mode, implementation and backend: timed points, median kernel time, median speedup over
    the naive custom-mask path of the same cases, and how many points met the noise bar."""
    timed = run.table.dropna(subset=["median_us"])
    rows = []
    for (mode, impl, backend), g in timed.groupby(["mode", "impl", "backend"], sort=True):
        rows.append({"mode": mode, "impl": impl, "backend": backend, "points": len(g),
                     "median us": g["median_us"].median(),
                     "median speedup vs mask": g["speedup_vs_mask"].median() if "speedup_vs_mask" in g else None,
                     f"noise <= {NOISE:.0%}": f"{int((g['noise'] <= NOISE).sum())}/{len(g)}"})
    return pd.DataFrame(rows)


def timing_said(run: Run) -> list[str]:
    timed = run.table.dropna(subset=["median_us"])
    long = timed[timed["median_us"] >= LONG_US]
    warm_up = run.meta.get("jit_warmup_total_s")
    lines = [f"**{run.meta.get('scenario')}** timings: {len(timed)} timed points, sweep wall time "
             f"{run.meta.get('wall_s')} s, JIT warm-up {'not measured' if warm_up is None else f'{warm_up} s'}; "
             f"{int((long['noise'] <= NOISE).sum())}/{len(long)} points of {LONG_US} us or more have noise <= "
             f"{NOISE:.0%}. Method: {run.meta.get('method', {}).get('kernel_time', '')}"]
    peaks = run.meta.get("peaks")
    if peaks:
        used = peaks.get("ceiling") or " and ".join(ceiling_parts(peaks))
        lines.append(f"Floors divide by the GPU's ceiling: {used}. "
                     f"Attainable, measured on the node: {attainable(peaks)} ({peaks['method']}).")
    return lines


def measurement(run: Run) -> pd.DataFrame:
    """How many timed points met the noise bar: a ratio of two medians means little when either
    point's spread is wide.  Points under LONG_US are left out of the share: there a fraction of a
    microsecond of jitter is already a few percent."""
    timed = run.table.dropna(subset=["median_us"])
    long = timed[timed["median_us"] >= LONG_US]
    quiet = int((long["noise"] <= NOISE).sum())
    row = {"timed points": len(timed), f"of {LONG_US} us or more": len(long), f"noise <= {NOISE:.0%}": quiet,
           "share": f"{quiet / len(long):.1%}" if len(long) else "",
           f"worst noise (of {LONG_US} us or more)": long["noise"].max()}
    clocked = timed.dropna(subset=["sm_clock_mhz_before"]) if "sm_clock_mhz_before" in timed else timed.iloc[0:0]
    if len(clocked):
        row["throttled (power or heat)"] = f"{int(clocked['throttled'].astype(bool).sum())}/{len(clocked)}"
        row["SM MHz before-after (median)"] = (f"{clocked['sm_clock_mhz_before'].median():.0f}-"
                                               f"{clocked['sm_clock_mhz_after'].median():.0f}")
    return pd.DataFrame([row])


def _workspace_grid(run: Run) -> pd.DataFrame:
    t = run.table.dropna(subset=["workspace_mib"]) if WORKSPACE_MIB is not None else run.table.iloc[0:0]
    shape = ["mode", "num_qo_heads", "num_kv_heads", "head_dim", "sliding_window", "storage", "backend"]
    return t.groupby(shape, sort=False).agg(points=("impl", "size"), workspace_mib=("workspace_mib", "max"),
                                            passed=("status", lambda s: int((s == "pass").sum()))).reset_index()


def workspace(run: Run) -> pd.DataFrame:
    """The shapes whose plan needed more float workspace than the smallest a runner gets: an engine
    that allocates that much once would fail those steps."""
    grid = _workspace_grid(run)
    return grid if (grid["workspace_mib"] > WORKSPACE_MIB).any() else grid.iloc[0:0]


def workspace_said(run: Run) -> list[str]:
    grid = _workspace_grid(run)
    if not len(grid):
        return []
    big = grid[grid["workspace_mib"] > WORKSPACE_MIB]
    said = (f"{len(big)} of {len(grid)} shapes needed more than {WORKSPACE_MIB} MiB, at most "
            f"{int(grid['workspace_mib'].max())} MiB; their points passed the gate {int(big['passed'].sum())} of "
            f"{int(big['points'].sum())} times" if len(big) else f"every shape fitted in {WORKSPACE_MIB} MiB")
    return [f"- {said} ({run.name})."]


def several_gpus(runs: list[Run]) -> list[str]:
    """A run launched over several GPUs against the same scenario file run on one GPU, given on the
    same command line: what the launch saves end to end, and whether the gate agreed point by point."""
    parts = []
    for multi in runs:
        if not (multi.meta.get("shards") or multi.meta.get("launch_wall_s") is not None):
            continue
        for one in runs:
            if one is multi or one.meta.get("what") != "run" \
                    or one.meta.get("scenario_sha256") != multi.meta.get("scenario_sha256") \
                    or not multi.meta.get("total_s") or not one.meta.get("total_s"):
                continue
            parts.append(_launch_against_one(multi, one))
    return parts


def _launch_against_one(multi: Run, one: Run) -> str:
    shards = multi.meta.get("shards") or []
    gpus = {s.get("gpu_uuid") for s in shards} - {None}
    how = f"{len(shards)} shards" + (f" on {len(gpus)} GPUs" if gpus else "") if shards else "a launch"
    a, b = one.meta["total_s"], multi.meta["total_s"]
    text = (f"- {how} ({multi.name}) against one GPU ({one.name}), same scenario file: end to end {a / b:.2f}x "
            f"faster, `total_s` {a} s / {b} s")
    if one.meta.get("wall_s") and multi.meta.get("wall_s"):
        c, d = one.meta["wall_s"], multi.meta["wall_s"]
        text += f"; the sweep alone {c / d:.2f}x, `wall_s` {c} s / {d} s"
    key = list(run_folder.KEY)
    both = one.table[key + ["status"]].merge(multi.table[key + ["status"]], on=key, suffixes=("_one", "_multi"))
    same = int((both["status_one"] == both["status_multi"]).sum())
    sizes = "" if len(one.table) == len(multi.table) == len(both) else \
        f" ({len(one.table)} and {len(multi.table)} points in all)"
    return text + f". The gate gave the same status on {same} of the {len(both)} points both runs hold{sizes}."


def _listed(axis: str) -> str:
    return ", ".join(map(str, coverage.TRIED[axis]))


def declared_paths(runs: list[Run]) -> list[str]:
    """Every implementation x storage x step the registry declares, and the newest of the runs where it came through
    the gate on a GPU: the paths never run there are named first."""
    rows = coverage.coverage(registry.all_implementations(), runs)
    gaps = coverage.gaps_by_impl(rows)
    named = "; ".join(f"`{impl}` ({', '.join(paths)})" for impl, paths in gaps.items())
    return [f"{coverage.headline(rows)}, over these {len(runs)} runs" + (f": {named}." if gaps else "."),
            markdown_table(coverage.frame(rows))]


TOPIC = "Method: noise, workspace, several GPUs and what has run on one"

SECTIONS = [
    Section("workspace", "Workspace", f"The float workspace the planner needed per shape (CUDA-graph wrappers plan "
            f"for the worst case): the largest `workspace_mib` over the shape's points, sized from the library's own "
            f"count and doubled from {WORKSPACE_MIB} MiB until the plan fitted.", workspace, workspace_said),
    Section("several-gpus", "Several GPUs", "`total_s` is a run from importing swabench to its written table (for a "
            "launch over several GPUs, the launcher's, merge included); `wall_s` is the sweep alone (for a merge, as "
            "its `meta.json` records it).", pages=frozenset({FINDINGS}), across=several_gpus),
    Section("measurement", "Measurement quality", f"Noise = IQR / median of a point's kernel-time samples. Share of "
            f"the timed points of {LONG_US} us or more with noise <= {NOISE:.0%}, per run; where NVML was read, the "
            f"points timed while the card held its clock back for power or heat (a reason NVML gives before or "
            f"after the point, or its violation time growing), and the SM clock around the points:", measurement,
            pages=frozenset({FINDINGS}), one_table=True, timed=True, every_release=True),
    Section("coverage", "Declared paths run on a GPU", "Each implementation on each storage and step its registry "
            "entry declares (every step where it names none), and the newest run where it came through the gate on a "
            f"GPU: a correct path where it passed, a known bug or planted mistake where it was gated as predicted "
            f"({' or '.join(coverage.COUNTS['known-bug'])}: exact where its mistake cannot show, caught where it "
            f"does). A fail, an xpass, a skip or a CPU run is no run. 'cannot run': the path's own check refuses a "
            f"small shape on every backend it has at every head_dim ({_listed('head_dim')}), page size "
            f"({_listed('page_size')}) and dtype ({_listed('dtype')}), and gives this reason. `swabench coverage "
            f"RUN...` prints the same table.",
            pages=frozenset({FINDINGS}), across=declared_paths, every_release=True, profiled=True, trees=True),
    Section("timings", "Timings", "", timing_matrix, timing_said, pages=frozenset({REPORT, SUMMARY}), timed=True),
]
