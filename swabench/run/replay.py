"""Replaying a server's trace as a run: the trace read once, its steps swept as a scenario, and what
the folder must keep to weigh them (each case's count and mode, the trace's hash) recorded when the
folder is opened, so an interrupted replay can still be read."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from swabench.errors import UserError
from swabench.impls import registry
from swabench.run import lifecycle
from swabench.inputs import axes, traces
from swabench.store import schema

if TYPE_CHECKING:
    import pandas as pd


def request(trace, implementations, backends, out: Path | None, device, resume: bool = False,
            l2: str = "cold") -> lifecycle.Request:
    """The run request of a replay of ``trace`` (every implementation but the planted mistakes when
    none is named, through each library's serving backends when none is named); TraceError,
    ScenarioError or UserError, before anything is written, for bad input."""
    data = traces.read_bytes(trace)
    return steps_request(trace, hashlib.sha256(data).hexdigest(), traces.parse(data, trace), implementations,
                         backends, out, device, resume, l2)


def steps_request(source, sha256: str, steps, implementations, backends, out: Path | None, device, resume: bool = False,
                  l2: str = "cold", meta: dict | None = None) -> lifecycle.Request:
    """The run request of ``steps`` (a trace's, or steps made from one): each distinct step once, its weight
    and mode in the folder's meta.json (with ``meta`` beside them)."""
    backends = _checked_backends(backends)
    names = list(implementations) or [i.name for i in registry.all_implementations() if i.kind != "planted"]
    scenario = traces.scenario(source, steps, names, backends)
    weights = traces.weights(steps)
    meta = {"trace": {"file": str(source), "sha256": sha256, "steps": sum(steps.values()),
                      "distinct": len(weights), "weights": weights,
                      "modes": {c.case_id: c.mode for c in scenario.cases}}, **(meta or {})}
    lifecycle.check_runnable(scenario, device)
    out = Path(out) if out else lifecycle.default_out(scenario.name, device.type, "run")
    return lifecycle.Request(scenario, out, device, True, resume, l2, meta=meta)


def default_backends() -> list[str]:
    """What a replay or price runs when no --backend is named: every library's serving backends, each once
    (FlashInfer's fa2, fa3, cuDNN, XQA and fmha v2, FlashAttention-4); the CLI's --backend help names them."""
    return list(dict.fromkeys(b for lib in registry.libraries() for b in lib.serving_backends))


def _checked_backends(backends) -> list[str]:
    """The backends asked for (--backend), or ``default_backends``; UserError for one no library takes."""
    if not backends:
        return default_backends()
    for b in backends:
        try:
            axes.AXES["backend"](b)
        except ValueError as e:
            raise UserError(f"--backend: {e}") from None
    return list(dict.fromkeys(backends))


def weigh(outcome: lifecycle.Outcome, request: lifecycle.Request) -> pd.DataFrame:
    """Write the folder's ``replay.csv`` (analysis.replay.steps: every step x path, weighted) from the
    table as it stands, interrupted or not, and return the replay's table of milliseconds per 1000 steps."""
    from swabench.analysis import replay
    from swabench.store import run_folder

    trace = request.meta["trace"]
    per_step = replay.steps(outcome.table, trace["weights"], trace["modes"])
    run_folder.atomic_write(outcome.folder / schema.REPLAY, per_step.to_csv(index=False))
    return replay.per_thousand_steps(per_step, tuple(lib.name for lib in registry.libraries()))
