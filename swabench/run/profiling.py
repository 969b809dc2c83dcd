"""Profiling flows: a run under Nsight Systems (kernels read back from its SQLite export and tied to
each row through the NVTX ranges of ``markers``), under Nsight Compute (the bytes each kernel of a
point's counted call moves, ``measure.counters``), or under torch.profiler (a Chrome/Perfetto trace)."""

from __future__ import annotations

import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from swabench.store import places, reading, run_folder, schema
from swabench.run import lifecycle
from swabench.errors import UserError
from swabench.measure import counters
from swabench.measure.markers import parse_point

if TYPE_CHECKING:
    import pandas as pd


class ProfileError(RuntimeError):
    """The profiled run itself failed (exit 1: not the user's input)."""


def run_under_nsys(scenario_path: str, out: Path, child_args: list[str], against: Path | None = None) -> pd.DataFrame:
    """``swabench run`` again under nsys into ``out``; its report, SQLite export and nsys_stats.csv
    (the kernels of every timed point) land in the run folder.  ``against``: a run of the same points
    without the profiler, whose graph times the nsys times are also held against (``hold_against``)."""
    out = places.check_new_run(out)  # and its report beside it: not inside a run folder
    if shutil.which("nsys") is None:
        raise UserError("--tool nsys: nsys is not on PATH; install Nsight Systems or use --tool torch")
    report = out.with_name(out.name + ".nsys")  # beside the run folder until the run is written
    child = ["run", scenario_path, "--out", str(out), "--device", "cuda", "--in-process", *child_args]
    code = subprocess.run(nsys_command(str(report), child)).returncode
    if code == 130:
        raise KeyboardInterrupt
    written = report.with_name(report.name + ".nsys-rep")
    if code not in (0, 1) or not (out / run_folder.META).exists() or not written.exists():
        raise ProfileError(f"the profiled run failed (exit {code}" + ("" if written.exists() else
                                                                     f", no {written.name}") + ")")
    written.rename(out / "profile.nsys-rep")
    sqlite = nsys_export_sqlite(out / "profile.nsys-rep")
    stats = nsys_kernel_table(sqlite, run_folder.load(out)[0])
    if against is not None:
        stats = hold_against(stats, run_folder.load(against)[0])
    run_folder.atomic_write(out / schema.KERNELS, stats.to_csv(index=False))
    return stats


@dataclass(frozen=True)
class Counted:
    """What a run under Nsight Compute gave: its per-kernel table (None when skipped) and its meta entry."""

    kernels: pd.DataFrame | None
    meta: dict

    @property
    def skipped(self) -> str | None:
        return self.meta.get("skipped")


def run_under_ncu(scenario_path: str, out: Path, child_args: list[str], l2: str, unit: str = "kernel") -> Counted:
    """``swabench run --count`` again under ncu into ``out``: the gate on every point, one counted call per
    gated point.  Writes ncu.csv (every counted kernel), joins each point's sums to its row (``dram_read_bytes``
    and the rest) and records the method and the calibration in meta.json's ``counters``.  Where there is no
    ncu, nothing is written and the reason is returned; where ncu cannot read the counters, or its report
    cannot be read back, the gated run is kept with the reason (a skip, not a failure)."""
    out = places.check_new_run(out)  # and its report beside it: not inside a run folder
    ncu = counters.find()
    if ncu is None:
        return Counted(None, {"skipped": f"ncu not found: not on PATH, nor under {' or '.join(counters.SEARCHED)}"})
    stem, log = out.with_name(out.name + ".ncu"), out.with_name(out.name + ".ncu.log")  # beside it until it exists
    report = stem.with_name(stem.name + ".ncu-rep")  # ncu adds the extension
    child = [sys.executable, "-m", "swabench", "run", scenario_path, "--out", str(out), "--device", "cuda",
             "--count", "--l2", l2, *child_args]
    started = time.perf_counter()
    try:
        code = subprocess.run(counters.command(ncu, str(stem), str(log), child, l2, unit)).returncode
        said = log.read_text(errors="replace") if log.exists() else ""
        why = counters.unreadable(said)
        if code == 130:
            raise KeyboardInterrupt
        if not (out / run_folder.META).exists() or (code not in (0, 1) and not why):  # ncu's own failure is a skip
            raise ProfileError(f"the run under ncu failed (exit {code})" + (f": {why}" if why else "")
                               + (f"; ncu's log is {log}" if log.exists() else ""))
        meta = {"tool": f"ncu {counters.version(ncu)}", "options": shlex.join(counters.options(l2, unit)), "l2": l2,
                "unit": unit,
                "metrics": counters.METRICS, "wall_s": round(time.perf_counter() - started, 1)}
        if log.exists():
            log.rename(out / "ncu.log")
        kernels = None
        if not report.exists():
            meta["skipped"] = why or "ncu profiled no kernel (ncu.log says what it saw)"
        else:
            report.rename(out / "profile.ncu-rep")
            kernels = _read_back(ncu, out, l2, meta)
        _record(out, kernels, meta)
        return Counted(kernels, meta)
    finally:
        report.unlink(missing_ok=True)  # a report left beside the folder by a run that failed


def _read_back(ncu: str, out: Path, l2: str, meta: dict) -> pd.DataFrame | None:
    """The counted kernels from the report, with the calibration in ``meta``; None, and why in ``meta``,
    when the report cannot be read back."""
    try:
        raw = counters.read_report(ncu, str(out / "profile.ncu-rep"))
        run_folder.atomic_write(out / "ncu-raw.csv.gz", run_folder.gzipped(raw))
        kernels = counters.kernels(raw)
    except (RuntimeError, ValueError, subprocess.SubprocessError) as e:
        meta["skipped"] = f"the report could not be read back: {e}"
        return None
    meta.update(calibration=counters.calibration(kernels, l2),
                kernels=int((kernels["case_id"] != counters.CALIBRATION[2]).sum()))
    return kernels


def _record(out: Path, kernels: pd.DataFrame | None, meta: dict) -> None:
    """ncu.csv, and each counted point's sums in its row (a new line in rows.jsonl: the last one wins)."""
    from swabench.analysis import derived

    store = run_folder.RunStore.resume(out, reading.read_text(out / schema.SCENARIO, reading.SCENARIO))
    try:
        if kernels is not None:
            rows = {tuple(row[k] for k in run_folder.KEY): row for row in store.rows()}
            keys = list(zip(kernels["case_id"], kernels["impl"], kernels["backend"]))
            run_folder.atomic_write(out / schema.COUNTERS, kernels.assign(
                case=[rows[k].get("case", "") if k in rows else "" for k in keys]).to_csv(index=False))
            sums = {tuple(r[k] for k in run_folder.KEY): r for r in counters.per_point(kernels).to_dict("records")}
            counted = [{**rows[key], **{k: v for k, v in point.items() if k not in run_folder.KEY}}
                       for key, point in sums.items() if key in rows]
            store.extend(counted)
            meta["points"] = len(counted)
            meta["per_point_s"] = round(meta["wall_s"] / max(1, len(rows)), 2)
        store.finalize(derived.add_derived, counters=meta)
    finally:
        store.close()


def run_under_torch_profiler(request: lifecycle.Request, progress: lifecycle.Progress) -> tuple[lifecycle.Outcome, str]:
    """The run inside torch.profiler (in this process: ``request`` not isolated): its trace (torch_trace.json) and the kernel table (torch_stats.txt)
    land in the run folder; returns the outcome and the table."""
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        outcome = lifecycle.execute(request, progress)
    prof.export_chrome_trace(str(request.out / "torch_trace.json"))
    text = prof.key_averages().table(sort_by="device_time_total", row_limit=40)
    run_folder.atomic_write(request.out / schema.TORCH_STATS, text + "\n")
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


_KERNELS_IN_REPLAY_RANGES = """
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
SELECT replays.point AS point, replays.end - replays.start AS range_ns, k.start AS start, k.end AS end,
       s.value AS kernel, full.value LIKE '%FillFunctor%' AS flush  -- the cold-L2 flush: a zero_ of twice the L2
FROM CUPTI_ACTIVITY_KIND_KERNEL AS k
JOIN replays ON k.start >= replays.start AND k.end <= replays.end
JOIN StringIds AS s ON s.id = k.shortName
JOIN StringIds AS full ON full.id = k.demangledName
ORDER BY replays.point, k.start
"""
# Kernels are tied to a replay range by time: every replay is waited for (an event sync) inside
# the range and nothing else runs on the GPU meanwhile, so GPU work inside the range is its own.


def _median(values) -> float:
    import statistics
    values = list(values)
    return statistics.median(values) if values else float("nan")


def period_per_call_ns(kernels: pd.DataFrame, kernels_per_call: int, calls_per_replay: int) -> float:
    """GPU time per call the way the graph timer counts it, from nsys's own timestamps: the call's
    kernels and the bubbles before each of them.  Cold L2: from the end of the flush before a call to
    the end of the call's last kernel (the timer subtracts a graph of flushes alone, which pays the
    bubble after each flush that the call pays after its last kernel).  Warm L2: from one call's
    first kernel to the next call's, where a replay holds a few calls.  Medians over every call."""
    starts, ends, flushes = kernels["start"].tolist(), kernels["end"].tolist(), [bool(f) for f in kernels["flush"]]
    if any(flushes):
        spans, flush_end, call_end = [], None, None
        for end, flush in zip(ends, flushes):
            if flush:
                if call_end is not None and flush_end is not None:
                    spans.append(call_end - flush_end)
                flush_end, call_end = end, None
            else:
                call_end = end
        if call_end is not None and flush_end is not None:
            spans.append(call_end - flush_end)
        return _median(spans)
    firsts, lasts = starts[::kernels_per_call], ends[kernels_per_call - 1::kernels_per_call]
    if calls_per_replay >= 3:
        return _median(b - a for a, b in zip(firsts, firsts[1:]))
    return _median(last - first for first, last in zip(firsts, lasts))


def nsys_kernel_table(sqlite_path: Path, table: pd.DataFrame) -> pd.DataFrame:
    """Per timed point: the kernels Nsight saw inside its replay range (each with its launches and
    busy time per call) and two nsys times per call
    to hold the CUDA-graph median against.  ``nsys_kernel_us`` sums kernel durations (busy time);
    ``nsys_period_us`` also counts the bubbles at kernel boundaries, which the graph timer pays too
    (``period_per_call_ns``).  agreement = graph / period - 1; busy_agreement = graph / busy - 1;
    gap_us = graph - busy, what a call pays at its kernel boundaries."""
    import pandas as pd

    with sqlite3.connect(sqlite_path) as con:
        kernels = pd.read_sql_query(_KERNELS_IN_REPLAY_RANGES, con)
    rows = []
    timed = table.dropna(subset=["median_us"]).set_index(["case_id", "impl", "backend"])
    for point, group in kernels.groupby("point"):
        key = parse_point(point)
        if key not in timed.index:
            continue
        r = timed.loc[key]
        calls = int(r["graph_calls"]) * int(r["repeats"])
        own = group[group["flush"] == 0]
        per_kernel = own.assign(ns=own["end"] - own["start"]).groupby("kernel", sort=False)["ns"].agg(["size", "sum"])
        per_call = max(1, round(len(own) / calls))
        busy_us = (own["end"] - own["start"]).sum() / 1e3 / calls
        period_us = period_per_call_ns(group, per_call, int(r["graph_calls"])) / 1e3
        rows.append({"case_id": key[0], "case": r["case"], "impl": key[1], "backend": key[2],
                     "kernels": "; ".join(f"{k} x{n // calls} {ns / 1e3 / calls:.3g} us"
                                          for k, (n, ns) in per_kernel.iterrows()),
                     "kernels_per_call": len(own) / calls,
                     "replay_range_ms": group["range_ns"].drop_duplicates().sum() / 1e6,
                     "graph_median_us": r["median_us"], "nsys_period_us": period_us, "nsys_kernel_us": busy_us,
                     "gap_us": r["median_us"] - busy_us, "agreement": r["median_us"] / period_us - 1,
                     "busy_agreement": r["median_us"] / busy_us - 1})
    return pd.DataFrame(rows)


def hold_against(stats: pd.DataFrame, unprofiled: pd.DataFrame) -> pd.DataFrame:
    """``stats`` with the graph median of a run made without the profiler (``graph_unprofiled_us``)
    and its agreement with nsys's period per call (``agreement_unprofiled``).  Tracing graph nodes
    one by one (--cuda-graph-trace=node) lengthens every replay by about a microsecond a node (H200:
    2 to 3 us on a call of a kernel and a merge after an L2 flush), which the profiled run's own graph
    times carry and nsys's kernel timestamps do not: the unprofiled run is the number to check."""
    timed = unprofiled.dropna(subset=["median_us"]).set_index(list(run_folder.KEY))["median_us"]
    stats = stats.copy()
    stats["graph_unprofiled_us"] = [timed.get(key, float("nan"))
                                    for key in zip(stats["case_id"], stats["impl"], stats["backend"])]
    stats["agreement_unprofiled"] = stats["graph_unprofiled_us"] / stats["nsys_period_us"] - 1
    return stats
