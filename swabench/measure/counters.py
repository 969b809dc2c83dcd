"""Hardware counters from Nsight Compute: the DRAM and L2 bytes each kernel of a point's call really moves.

A run under ncu (``run.profiling.run_under_ncu``) makes one counted call per gated point: the call captured
in a CUDA graph and replayed once inside an NVTX start/end range named ``count <impl> [<backend>] #<case_id>``
in the swabench domain.  ncu profiles only the kernels inside such a range (``--nvtx-include``), each kernel
node of the graph on its own (``--graph-profiling node``), with the clocks as it finds them
(``--clock-control none``) and, for a cold L2, every cache flushed before each kernel (``--cache-control
all``).  ncu replays a kernel to read its counters, so the durations it reports are never timings.

Before the points, the run counts a copy of a known size (``calibrate``): the DRAM read counter must see
those bytes, within 1%, or no number of the run is trusted (``calibration``)."""

from __future__ import annotations

import csv
import glob
import io
import re
import shutil
import subprocess
from typing import TYPE_CHECKING, Callable

from swabench.measure.markers import DOMAIN, end_range, parse_point, point_range_name, start_range

if TYPE_CHECKING:
    import pandas as pd
    import torch

METRICS = {"dram__bytes_read.sum": "dram_read_bytes", "dram__bytes_write.sum": "dram_write_bytes",
           "lts__t_bytes.sum": "l2_bytes", "gpu__time_duration.sum": "ncu_duration_us"}
UNITS = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "ns": 1e-3, "nsecond": 1e-3, "us": 1, "usecond": 1,
         "ms": 1e3, "msecond": 1e3}  # to bytes and to microseconds
RANGE = "count "
CALIBRATION = ("copy", "torch", "calibration")  # (impl, backend, case_id) of the copy counted first
CALIBRATION_BYTES = 256 << 20  # four times the H200's L2: a cold read must come from DRAM
CALIBRATION_TOLERANCE = 0.01
SEARCHED = ("/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda/bin/ncu")
IMPORT_S = 600  # reading back a report of thousands of kernels takes seconds; more means ncu hangs
STARTED_RANGES = "Id:Domain:Start/Stop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"  # ncu's raw-page column
# What ncu counts as one workload: each kernel node of a point's graph on its own (a cold L2 before each, so
# what one kernel leaves for the next is read again), or the whole graph at once (a cold L2 before the call
# only): the honest count for a call of hundreds of small kernels passing intermediates through L2, such as
# the per-request PyTorch loops, and far fewer replays.
COUNT_UNITS = {"kernel": "node", "call": "graph"}
UNREADABLE = ("ERR_NVGPUCTRPERM", "LibraryNotLoaded", "Failed to initialize the profiler", "not supported on this device",
              "Profiling is not supported")


def find() -> str | None:
    """ncu on PATH, else the newest under /opt/nvidia/nsight-compute/*/ (where the CUDA images keep it, off
    PATH), else the CUDA toolkit's; None when there is none."""
    on_path = shutil.which("ncu")
    if on_path:
        return on_path
    for pattern in SEARCHED:
        found = sorted(glob.glob(pattern), key=_version_key)
        if found:
            return found[-1]
    return None


def _version_key(path: str) -> tuple:
    return tuple(int(n) for n in re.findall(r"\d+", path))


def version(ncu: str) -> str | None:
    try:
        done = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"Version (\S+)", done.stdout)
    return found.group(1) if found else (done.stdout.strip().splitlines() or [None])[-1]


def options(l2: str, unit: str = "kernel") -> list[str]:
    """ncu's options for a run: clocks as found, caches flushed before each workload for a cold L2 (left
    alone for a warm one), the workload (``COUNT_UNITS``), only the count ranges, four metrics."""
    return ["--clock-control", "none", "--cache-control", "all" if l2 == "cold" else "none",
            "--graph-profiling", COUNT_UNITS[unit], "--nvtx", "--nvtx-include", f"regex:{DOMAIN}@{RANGE}.*",
            "--metrics", ",".join(METRICS)]


def command(ncu: str, report: str, log: str, child: list[str], l2: str, unit: str = "kernel") -> list[str]:
    """The whole profiled command: ncu's options, its report and its log (ncu's own messages, apart from
    the child's), then the child."""
    return [ncu, *options(l2, unit), "--force-overwrite", "--export", report, "--log-file", log, *child]


def range_name(impl: str, backend: str, case_id: str) -> str:
    return RANGE + point_range_name(impl, backend, case_id)


def count_call(fn: Callable[[], None], name: str) -> None:
    """One call of ``fn`` as the timer runs it (a CUDA graph of the call) inside the count range ``name``.
    The graph is replayed once before, to upload it: for a warm L2 that also leaves the call's data in L2,
    for a cold one ncu flushes it before each kernel."""
    import torch

    from swabench.measure.timing import capture

    graph = capture(fn, 1)
    graph.replay()
    torch.cuda.synchronize()
    counted = start_range(name)
    try:
        graph.replay()
        torch.cuda.synchronize()
    finally:  # an open range would count every later kernel as this point's
        end_range(counted)


def calibrate(device: torch.device, nbytes: int = CALIBRATION_BYTES) -> None:
    """The copy every count run starts with: a kernel that reads ``nbytes`` and writes as many (an elementwise
    kernel: a plain ``copy_`` is a copy-engine transfer, which ncu does not profile)."""
    import torch

    g = torch.Generator(device=device).manual_seed(0)
    src = torch.randn(nbytes // 2, generator=g, device=device).to(torch.bfloat16)
    dst = torch.empty_like(src)
    count_call(lambda: torch.neg(src, out=dst), range_name(*CALIBRATION))


def read_report(ncu: str, report: str) -> str:
    """The report's raw page as CSV, every value in base units (bytes, nanoseconds)."""
    done = subprocess.run([ncu, "--import", report, "--csv", "--page", "raw", "--print-units", "base"],
                          capture_output=True, text=True, timeout=IMPORT_S)
    if done.returncode != 0:
        raise RuntimeError(f"ncu --import {report} failed: {(done.stderr or done.stdout).strip()[:500]}")
    return done.stdout


def _counted_point(cell: str) -> tuple[str, str, str] | None:
    """(case_id, impl, backend) of the count range in a raw-page cell of started ranges: entries in quotes,
    each ``id:domain:name:five fields:name`` (the name written twice, so one with colons still splits)."""
    for entry in re.findall(r'"([^"]*)"', cell):
        parts = entry.split(":")
        if len(parts) < 9 or (len(parts) - 9) % 2:
            continue
        half = (len(parts) - 7) // 2
        domain, name = parts[1], ":".join(parts[2:2 + half])
        if domain == DOMAIN and name.startswith(RANGE):
            return parse_point(name[len(RANGE):])
    return None


def _number(text: str) -> float:
    """A raw-page value ('33,563,648'); NaN for an empty cell or ncu's 'n/a'."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return float("nan")


def kernels(raw_csv: str) -> pd.DataFrame:
    """One row per counted kernel from ncu's raw page (``read_report``): the point it belongs to, its name,
    its DRAM and L2 bytes and ncu's duration of it (a replayed kernel: never a timing).  ValueError when the
    text is not such a page."""
    import pandas as pd

    lines = raw_csv.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError("not ncu's raw page: no header row starting with \"ID\"")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header, body = rows[0], rows[1:]
    missing = [c for c in ("ID", "Kernel Name", STARTED_RANGES, *METRICS) if c not in header]
    if missing:
        raise ValueError(f"ncu's raw page has no column {', '.join(missing)}")
    at = {name: header.index(name) for name in ("ID", "Kernel Name", STARTED_RANGES, *METRICS)}
    units = body.pop(0) if body and body[0][at["ID"]] == "" else [""] * len(header)
    scale = {}
    for metric in METRICS:
        unit = units[at[metric]]
        if unit and unit not in UNITS:
            raise ValueError(f"ncu's raw page gives {metric} in {unit!r}; expected one of {', '.join(UNITS)}")
        scale[metric] = UNITS.get(unit, 1)
    out = []
    for r in body:
        if len(r) != len(header):  # a message ncu printed after the table, or a line cut short
            continue
        point = _counted_point(r[at[STARTED_RANGES]])
        if point is None:
            continue
        out.append({"ncu_id": int(r[at["ID"]]), "case_id": point[0], "impl": point[1], "backend": point[2],
                    "kernel": r[at["Kernel Name"]],
                    **{column: _number(r[at[metric]]) * scale[metric] for metric, column in METRICS.items()}})
    columns = ["ncu_id", "case_id", "impl", "backend", "kernel", *METRICS.values()]
    return pd.DataFrame(out, columns=columns)


def per_point(counted: pd.DataFrame) -> pd.DataFrame:
    """Each point's counted call: its kernels' bytes summed, and how many kernels it ran."""
    points = counted[counted["case_id"] != CALIBRATION[2]]
    groups = points.groupby(["case_id", "impl", "backend"], sort=False)
    sums = groups[["dram_read_bytes", "dram_write_bytes", "l2_bytes"]].agg(lambda x: x.sum(skipna=False))  # n/a stays
    return sums.assign(kernels_counted=groups.size()).reset_index()


def calibration(counted: pd.DataFrame, l2: str = "cold", nbytes: int = CALIBRATION_BYTES) -> dict:
    """What the calibration copy read against what it had to: within CALIBRATION_TOLERANCE, or not; on a warm
    L2, which may serve part of the copy, not held to it (``trusted`` None)."""
    copy = counted[counted["case_id"] == CALIBRATION[2]]
    if copy.empty:
        return {"bytes": nbytes, "dram_read_bytes": None, "read_ratio": None, "trusted": False}
    read = float(copy["dram_read_bytes"].sum())
    within = abs(read / nbytes - 1) <= CALIBRATION_TOLERANCE
    return {"bytes": nbytes, "dram_read_bytes": read, "read_ratio": read / nbytes,
            "trusted": within if l2 == "cold" else None}


def unreadable(log: str) -> str | None:
    """ncu's own words for why it could not read the counters (no permission, no profiler library on this
    runtime, an unsupported device), from its log; None when it says no such thing."""
    for line in log.splitlines():
        if any(sign in line for sign in UNREADABLE):
            return line.strip().removeprefix("==ERROR==").strip()
    return None
