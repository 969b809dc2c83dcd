"""Profiling flows: a run under Nsight Systems (kernels read back from its SQLite export and tied to
each row through the NVTX ranges of ``markers``) or under torch.profiler (a Chrome/Perfetto trace)."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from . import results, runs
from .errors import UserError
from .markers import parse_point

if TYPE_CHECKING:
    import pandas as pd


class ProfileError(RuntimeError):
    """The profiled run itself failed (exit 1: not the user's input)."""


def run_under_nsys(scenario_path: str, out: Path, child_args: list[str]) -> pd.DataFrame:
    """``swabench run`` again under nsys into ``out``; its report, SQLite export and nsys_stats.csv
    (the kernels of every timed point) land in the run folder."""
    if shutil.which("nsys") is None:
        raise UserError("--tool nsys: nsys is not on PATH; install Nsight Systems or use --tool torch")
    results.refuse_a_run(out)
    report = out.with_name(out.name + ".nsys")  # beside the run folder until the run is written
    child = ["run", scenario_path, "--out", str(out), "--device", "cuda", *child_args]
    code = subprocess.run(nsys_command(str(report), child)).returncode
    if code == 130:
        raise KeyboardInterrupt
    written = report.with_name(report.name + ".nsys-rep")
    if code not in (0, 1) or not (out / results.META).exists() or not written.exists():
        raise ProfileError(f"the profiled run failed (exit {code}" + ("" if written.exists() else
                                                                     f", no {written.name}") + ")")
    written.rename(out / "profile.nsys-rep")
    sqlite = nsys_export_sqlite(out / "profile.nsys-rep")
    stats = nsys_kernel_table(sqlite, results.load(out)[0])
    results.atomic_write(out / "nsys_stats.csv", stats.to_csv(index=False))
    return stats


def run_under_torch_profiler(request: runs.Request, progress: runs.Progress) -> tuple[runs.Outcome, str]:
    """The run inside torch.profiler: its trace (torch_trace.json) and the kernel table (torch_stats.txt)
    land in the run folder; returns the outcome and the table."""
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        outcome = runs.execute(request, progress)
    prof.export_chrome_trace(str(request.out / "torch_trace.json"))
    text = prof.key_averages().table(sort_by="device_time_total", row_limit=40)
    results.atomic_write(request.out / "torch_stats.txt", text + "\n")
    return outcome, text


# ---------------------------------------------------------------- Nsight Systems

def nsys_command(report: str, child_args: list[str]) -> list[str]:
    """Re-run swabench under nsys: CUDA + NVTX, graph nodes traced one by one."""
    return ["nsys", "profile", "--trace=cuda,nvtx", "--cuda-graph-trace=node", "--sample=none",
            "--cpuctxsw=none", "--force-overwrite=true", "-o", report,
            sys.executable, "-m", "swabench", *child_args]


def nsys_export_sqlite(report: Path) -> Path:
    out = report.with_suffix(".sqlite")
    subprocess.run(["nsys", "export", "--type=sqlite", "--force-overwrite=true", "-o", str(out), str(report)],
                   check=True, capture_output=True, text=True)
    return out


_KERNELS_PER_REPLAY_RANGE = """
WITH ranges AS (
    SELECT n.start, n.end, n.globalTid,
           COALESCE(n.text, (SELECT value FROM StringIds WHERE id = n.textId)) AS name
    FROM NVTX_EVENTS AS n WHERE n.end IS NOT NULL
),
replays AS (
    SELECT r.start, r.end, r.globalTid, p.name AS point
    FROM ranges AS r JOIN ranges AS p
      ON p.globalTid = r.globalTid AND p.start <= r.start AND p.end >= r.end AND p.name LIKE '%#%'
    WHERE r.name = 'replay'
)
SELECT replays.point AS point, s.value AS kernel, COUNT(*) AS launches, SUM(k.end - k.start) AS total_ns
FROM CUPTI_ACTIVITY_KIND_KERNEL AS k
JOIN replays ON k.start >= replays.start AND k.end <= replays.end
JOIN StringIds AS s ON s.id = k.shortName
JOIN StringIds AS full ON full.id = k.demangledName
WHERE full.value NOT LIKE '%FillFunctor%'  -- the cold-L2 flush: a zero_ of twice the L2
GROUP BY replays.point, s.value
"""

_REPLAY_RANGES = """
SELECT p.name AS point, SUM(r.end - r.start) AS replay_ns
FROM (SELECT start, end, globalTid, COALESCE(text, (SELECT value FROM StringIds WHERE id = textId)) AS name
      FROM NVTX_EVENTS WHERE end IS NOT NULL) AS r
JOIN (SELECT start, end, globalTid, COALESCE(text, (SELECT value FROM StringIds WHERE id = textId)) AS name
      FROM NVTX_EVENTS WHERE end IS NOT NULL) AS p
  ON p.globalTid = r.globalTid AND p.start <= r.start AND p.end >= r.end AND p.name LIKE '%#%'
WHERE r.name = 'replay'
GROUP BY p.name
"""
# Kernels are tied to a replay range by time: every replay is waited for (an event sync) inside
# the range and nothing else runs on the GPU meanwhile, so GPU work inside the range is its own.


def nsys_kernel_table(sqlite_path: Path, table: pd.DataFrame) -> pd.DataFrame:
    """Per timed point: the kernels Nsight saw inside its replay range, their time per call, and
    how far the CUDA-graph median is from it (agreement = graph / nsys - 1; gap_us = graph - nsys,
    which a graph pays per kernel boundary and a sum of kernel durations does not)."""
    import pandas as pd

    with sqlite3.connect(sqlite_path) as con:
        kernels = pd.read_sql_query(_KERNELS_PER_REPLAY_RANGE, con)
        replay_ns = pd.read_sql_query(_REPLAY_RANGES, con).set_index("point")["replay_ns"]
    rows = []
    timed = table.dropna(subset=["median_us"]).set_index(["case_id", "impl", "backend"])
    for point, group in kernels.groupby("point"):
        key = parse_point(point)
        if key not in timed.index:
            continue
        r = timed.loc[key]
        calls = int(r["graph_calls"]) * int(r["repeats"])
        nsys_us = group["total_ns"].sum() / 1e3 / calls
        rows.append({"case_id": key[0], "case": r["case"], "impl": key[1], "backend": key[2],
                     "kernels": "; ".join(f"{k} x{n // calls}" for k, n in zip(group["kernel"], group["launches"])),
                     "kernels_per_call": group["launches"].sum() / calls,
                     "replay_range_ms": replay_ns.get(point, float("nan")) / 1e6,
                     "graph_median_us": r["median_us"], "nsys_kernel_us": nsys_us,
                     "gap_us": r["median_us"] - nsys_us, "agreement": r["median_us"] / nsys_us - 1})
    return pd.DataFrame(rows)
