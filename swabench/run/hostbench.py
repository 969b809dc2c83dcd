"""``swabench bench-host``: pytest-benchmark of the host work a serving step pays (mask build and
packing, trimmed page tables, indptr arrays), kept in a run folder and plotted beside it."""

from __future__ import annotations

import datetime
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

from swabench.run import environment
from swabench.store import run_folder, schema
from swabench.errors import RunFailed, UserError

BENCHMARKS = environment.REPO / "benchmarks"  # a checkout's; an installed wheel has none


class HostBenchError(UserError):
    pass


def default_out() -> Path:
    return Path("results") / f"host-bench-{datetime.datetime.now():%Y%m%d-%H%M%S}"


def run(out: Path, quick: bool = False) -> list[Path]:
    """Run the benchmarks into ``out``: meta.json, every round (compressed JSON) and the figure."""
    from swabench.publish import plots

    if not BENCHMARKS.is_dir():
        raise HostBenchError(f"{BENCHMARKS} is not there: run from a checkout (pip install -e .)")
    run_folder.refuse_a_run(out)
    run_folder.make_folder(out)
    meta = {**environment.collect("cpu"), "what": "host benchmarks", "scenario": "host work"}
    run_folder.write_meta(out, schema.check_meta(meta))
    env = {**os.environ, "SWABENCH_BENCH_QUICK": "1" if quick else "0"}
    raw = out / "host_benchmarks.json"
    code = subprocess.run([sys.executable, "-m", "pytest", str(BENCHMARKS), "-q", "-p", "no:cacheprovider",
                           f"--benchmark-json={raw}"], env=env).returncode
    if code != 0:
        raise RunFailed(f"the benchmarks failed (pytest exit {code})")
    data = json.loads(raw.read_text())
    with gzip.open(out / "host_benchmarks.json.gz", "wt") as f:  # every round is kept: compress it
        json.dump(data, f)
    raw.unlink()
    return plots.save(plots.host_work(data, meta), out, "host_work")
