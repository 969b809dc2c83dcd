"""``swabench bench-host``: pytest-benchmark of the host work a serving step pays (mask build and
packing, trimmed page tables, indptr arrays), kept in a run folder and plotted beside it."""

from __future__ import annotations

import datetime
import gzip
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from swabench.run import environment
from swabench.store import places, run_folder, schema
from swabench.errors import RunFailed, UserError

BENCHMARKS = environment.REPO / "benchmarks"  # a checkout's; an installed wheel has none


class HostBenchError(UserError):
    pass


def default_out() -> Path:
    """``runs/host-bench-TIME``, beside a user's other runs."""
    from swabench.run.lifecycle import RUNS_ROOT

    return places.new_folder(RUNS_ROOT, f"host-bench-{datetime.datetime.now():%Y%m%d-%H%M%S}")


def bench(out: Path, quick: bool = False) -> list[Path]:
    """Run the benchmarks into ``out``: meta.json, every round (compressed JSON) and the figure."""
    from swabench.publish import style

    if not BENCHMARKS.is_dir():
        raise HostBenchError(f"{BENCHMARKS} is not there: run from a checkout (pip install -e .)")
    missing = [name for name, module in (("pytest", "pytest"), ("pytest-benchmark", "pytest_benchmark"))
               if importlib.util.find_spec(module) is None]
    if missing:  # before the run folder is made: nothing is left behind
        raise HostBenchError(f"bench-host runs the benchmarks under {' and '.join(missing)}, which this Python lacks: "
                             f"pip install -e '.[test]'")
    out = places.make_folder(places.check_new_run(out))
    meta = {**environment.collect("cpu"), "what": "host benchmarks", "scenario": "host work"}
    run_folder.write_meta(out, schema.check_meta(meta))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")},  # its own session:
           "SWABENCH_BENCH_QUICK": "1" if quick else "0"}  # a worker's variables would turn the benchmarks off
    raw = out / "host_benchmarks.json"
    brief = ["--benchmark-max-time=0.1", "--benchmark-min-rounds=3"] if quick else []  # a smoke test's rounds
    code = subprocess.run([sys.executable, "-m", "pytest", str(BENCHMARKS), "-q", "-p", "no:cacheprovider",
                           f"--benchmark-json={raw}", *brief], env=env).returncode
    if code != 0 or not raw.is_file():
        raise RunFailed(f"the benchmarks failed (pytest exit {code})" if code else
                        "pytest-benchmark timed nothing (benchmarks disabled in this environment)")
    data = json.loads(raw.read_text())
    with gzip.open(out / "host_benchmarks.json.gz", "wt") as f:  # every round is kept: compress it
        json.dump(data, f)
    raw.unlink()
    return style.save(figure(data, meta), out, "host_work")


def figure(benchmarks: dict, meta: dict):
    """pytest-benchmark results of the host work per step: median time against batch, per context."""
    import pandas as pd

    from swabench.publish import style

    rows = [{"test": b["name"].split("[")[0].removeprefix("test_"), **b["params"], "median_us": b["stats"]["median"] * 1e6}
            for b in benchmarks["benchmarks"]]
    t = pd.DataFrame(rows)
    tests = list(dict.fromkeys(t["test"]))
    fig, axes = style.figure(meta, "Host work per serving step (pytest-benchmark medians)", 1, len(tests), size=(4.5, 3.8))
    for ax, test in zip(axes[0], tests):
        for k, (context, g) in enumerate(t[t["test"] == test].groupby("context")):
            g = g.sort_values("batch")
            ax.plot(g["batch"], g["median_us"], marker="o", ms=3, color=style.OKABE_ITO[k % len(style.OKABE_ITO)],
                    label=f"context {context}")
        ax.set(yscale="log", title=test.replace("_", " "), xlabel="batch (requests)", ylabel="host time (us)")
        style.log_x_ticks(ax, t["batch"])
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    return fig
