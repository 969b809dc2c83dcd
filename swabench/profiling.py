"""Profiling: NVTX ranges, and reading Nsight Systems back into a table.

Ranges live in one ``swabench`` domain, nested run > case > implementation > phase (plan, check,
capture, replay, eager), so an Nsight Systems timeline reads like the results table.  The
implementation range is named ``<impl> [<backend>] #<case_id>``, which is how kernels seen inside a
replay range are tied back to a row.  Without the nvtx package the ranges are no-ops."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path

import pandas as pd
import torch

try:
    import nvtx as _nvtx
except ImportError:  # pragma: no cover - nvtx is a dependency, but keep the suite importable without it
    _nvtx = None

DOMAIN = "swabench"


@contextmanager
def nvtx_range(message: str, payload: int | float | None = None):
    """An NVTX range (and a torch.profiler range while a torch profiler is recording)."""
    torch_range = torch.profiler.record_function(message) if torch.autograd.profiler._is_profiler_enabled \
        else nullcontext()
    with torch_range:
        if _nvtx is None:
            yield
            return
        _nvtx.push_range(message=message, domain=DOMAIN, payload=payload)
        try:
            yield
        finally:
            _nvtx.pop_range(domain=DOMAIN)


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


def parse_point(range_name: str) -> tuple[str, str, str]:
    """'<impl> [<backend>] #<case_id>' -> (case_id, impl, backend), the sweep's NVTX naming."""
    head, _, case_id = range_name.rpartition(" #")
    impl, _, backend = head.partition(" [")
    return case_id, impl, backend.rstrip("]")


def nsys_kernel_table(sqlite_path: Path, table: pd.DataFrame) -> pd.DataFrame:
    """Per timed point: the kernels Nsight saw inside its replay range, their time per call, and
    how far the CUDA-graph median is from it (agreement = graph / nsys - 1; gap_us = graph - nsys,
    which a graph pays per kernel boundary and a sum of kernel durations does not)."""
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
