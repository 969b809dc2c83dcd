"""A run over several GPUs of one node: one worker per GPU, each on its own shard, merged into one folder (the
single-GPU run's life is ``lifecycle``).  Nothing here prints or exits."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from swabench.inputs import scenarios
from swabench.run import launch
from swabench.run.lifecycle import Outcome, Progress, Silent, all_skipped, since_start
from swabench.run.signals import interrupt_on_signals
from swabench.store import places, schema


@dataclass(frozen=True)
class GpuLaunch:
    scenario_path: Path
    out: Path
    gpus: list[int]  # indices into visible
    visible: list[str]  # launch.visible_gpus()
    child_args: list[str]  # the workers' filters and options
    validate: Callable[[], scenarios.Scenario]  # the full check of the input, made while the workers start


def execute(launch_request: GpuLaunch, progress: Progress = Silent()) -> Outcome:
    """One worker per GPU, each on its own shard, merged into ``out``.  The workers start first; the
    launcher then checks the input in full (each worker checks it too, before any GPU work) and stops
    them, keeping nothing, if it is bad.  Interrupted: every worker keeps its rows, and the same
    launch resumes them."""
    from swabench.run import shards

    r = launch_request
    places.check_new_run(r.out, hint="choose another --out (the shards resume on their own)")
    workers = launch.Workers([str(r.scenario_path), "--device", "cuda", *r.child_args], r.gpus, r.out, r.visible)
    spawned_s = since_start()
    try:
        scenario = r.validate()
    except BaseException:
        workers.stop()
        if workers.created_work:
            shutil.rmtree(workers.work)
        raise
    progress.note(f"{scenario.name}: {len(scenario.points)} points over GPUs {r.gpus}; shards in {workers.work}")
    progress.start(len(scenario.points), f"run on {len(r.gpus)} GPUs")
    seen = 0

    def on_progress(rows: int) -> None:
        nonlocal seen
        progress.advance(rows - seen)
        seen = rows

    try:
        with interrupt_on_signals():
            folders = workers.wait(on_progress=on_progress)
    except KeyboardInterrupt as e:
        return Outcome(workers.work, "interrupted", _empty_table(), 0.0, since_start(),
                       signal=getattr(e, "signal", None))
    finally:
        progress.finish()
    merging = time.perf_counter()
    store, table = shards.merge(r.out, folders)
    meta = store.update_meta(launch_spawned_s=spawned_s,  # from swabench's start to the workers' start
                             launch_worker_end_s=workers.ended_s,  # workers' start to each one's exit
                             launch_merge_s=round(time.perf_counter() - merging, 1),
                             launch_wall_s=round(time.perf_counter() - workers.started, 1),
                             total_s=since_start(),  # the launcher's own start too
                             **({"state": "skipped"} if all_skipped(table) else {}))  # a merge of every shard
    return Outcome(r.out, meta["state"], table, meta["launch_wall_s"], meta["total_s"])


def _empty_table():
    import pandas as pd
    return pd.DataFrame(columns=schema.COLUMNS)
