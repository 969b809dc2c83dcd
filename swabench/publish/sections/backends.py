"""Beyond FlashInfer's wrappers (docs/backends.md): per model and step, each backend's fastest correct path (cuDNN,
FlashAttention-4, FlashAttention-3 and FlexAttention beside FlashInfer's own, TRT-LLM's kernels among them) against
FlashInfer's best on the same cases, what it reaches of its floor and what it reads, and the window conventions the
gate caught."""

from __future__ import annotations

import pandas as pd

from swabench.publish.sections.base import FLOOR, Run, Section, figure_link, path_of, ranged, ratio
from swabench.publish.sections.shelf import STATUSES, _step_order, _steps, fastest, mistakes_said, skipped, timed_table

BEYOND = {"cudnn": "cuDNN", "fa4": "FlashAttention-4", "vllm-fa3": "FlashAttention-3 (vLLM)",
          "sgl-fa3": "FlashAttention-3 (SGLang)", "flex": "FlexAttention"}  # by the backend column
OTHER_LIBRARIES = tuple(b for b in BEYOND if b != "flex")  # the backends timed beside FlashInfer's by name
FLASHINFER = "FlashInfer"
VS_FLASHINFER = "its time / FlashInfer's best"  # a column


def backend_of(t: pd.DataFrame) -> pd.Series:
    """Each row's backend as an engine names it: cuDNN, FlashAttention-4, FlashAttention-3 (vLLM's or SGLang's),
    FlexAttention, or FlashInfer (its wrappers and the TRT-LLM kernels it ships); None for the suite's own PyTorch
    paths."""
    named = t["backend"].map(BEYOND)
    return named.where(named.notna(), t["library"].map({"flashinfer": FLASHINFER}))


def engine_rows(table: pd.DataFrame, meta: dict) -> pd.DataFrame:
    """A run's rows of some backend, with their step, model (a priced model's global layers named so, else '-'
    where a row names none) and path; empty unless cuDNN, FlashAttention-4 or -3 timed a point."""
    t = table.assign(engine=backend_of(table)).dropna(subset=["engine"])
    beyond = t[t["backend"].isin(OTHER_LIBRARIES)]
    if beyond["median_us"].isna().all():
        return t.iloc[:0]
    priced = meta.get("price") or {}
    unnamed = t["case_id"].map(lambda case: f"{priced['model']} (global layers)"
                               if priced.get("layers", {}).get(case) == "global" else "-")
    model = t["model"].fillna(unnamed) if "model" in t else unnamed
    return t.assign(step=_steps(t), model=model, path=path_of(t))


def against_flashinfer(t: pd.DataFrame) -> pd.DataFrame:
    """The correct paths' timed points of ``engine_rows``, each with ``versus``: its time / FlashInfer's best correct
    time on its case."""
    timed = t[(t["kind"] == "correct") & (t["status"] == "pass") & t["median_us"].notna()]
    best = timed[timed["engine"] == FLASHINFER].groupby("case_id")["median_us"].min()
    return timed.assign(versus=timed["median_us"] / timed["case_id"].map(best).astype(float))


def fastest_versus(t: pd.DataFrame) -> pd.Series:
    """Per model, step and backend of ``engine_rows``: its fastest correct path's median ``versus``."""
    v = against_flashinfer(t).dropna(subset=["versus"])
    return v.groupby(["model", "step", "engine", "path"])["versus"].median().groupby(["model", "step", "engine"]).min()


def backends_table(run: Run) -> pd.DataFrame:
    """Per model and step, per backend: its fastest correct path (the lowest median of its time / FlashInfer's best
    correct time on each case), the cases that covers, its median share of the floor, DRAM read / needed where the
    run counted bytes, and the backend's statuses there."""
    t = engine_rows(run.table, run.meta)
    if t.empty:
        return t
    timed = against_flashinfer(t)
    rows = []
    for (model, step), here in sorted(t.groupby(["model", "step"]), key=lambda kv: (kv[0][0], _step_order(kv[0][1]))):
        ran = timed[(timed["model"] == model) & (timed["step"] == step)]
        for engine in [FLASHINFER, *[b for b in BEYOND.values() if b in set(here["engine"])]]:
            mine, g = here[here["engine"] == engine], ran[ran["engine"] == engine]
            row = {"model": model, "step": step, "backend": engine, "fastest correct path": "", "cases": "",
                   VS_FLASHINFER: "", FLOOR: "", "DRAM read / needed": "",
                   "statuses": ", ".join(f"{s} {n}" for s in STATUSES if (n := int((mine["status"] == s).sum())))}
            if len(g):
                row.update(fastest(g, VS_FLASHINFER))
            elif len(mine) and (mine["status"] == "skip").all():
                row["fastest correct path"] = skipped(mine)
            rows.append(row)
    return pd.DataFrame(rows)


def caught_said(run: Run) -> list[str]:
    """The conventions that trap callers, as the gate saw them: each new backend's known mistake, per step."""
    t = engine_rows(run.table, run.meta)
    if t.empty:
        return []
    beyond = t[t["backend"].isin(OTHER_LIBRARIES)]
    correct = beyond[(beyond["kind"] == "correct") & (beyond["status"] != "skip")]
    failed = correct[correct["status"] == "fail"].groupby("path").size()
    ran = [BEYOND[b] for b in OTHER_LIBRARIES if b in set(correct["backend"])]
    names = " and ".join(filter(None, [", ".join(ran[:-1]), ran[-1]])) if ran else "other library's"
    bugs = ([f"- Every correct {names} path passed the gate wherever it ran ({len(correct)} points): no library bug "
             f"on these shapes ({run.name})."] if failed.empty else
            [f"- `{path}` failed the gate on {n} of {int((correct['path'] == path).sum())} points: a library bug until "
             f"shown otherwise ({run.name})." for path, n in failed.items()])
    return mistakes_said(beyond[(beyond["kind"] == "known-bug") & (beyond["status"] != "skip")], run) + bugs


def across(runs: list[Run]) -> list[str]:
    """Per timed run that holds cuDNN, FlashAttention-4 or FlashAttention-3 points: the conventions caught and its
    table."""
    return [s for r in runs
            for s in timed_table(r, runs, backends_table, caught_said) + [figure_link(r, "which_backend")] if s]


def answer(runs: list[Run]) -> list[str]:
    """The findings page's answer to 'which backend', from the timed run with the most model-steps of cuDNN or
    FlashAttention-4: on how many of them each backend's fastest correct path is the fastest of all (per step), and
    the span of each other backend's time / FlashInfer's best."""
    timed = [(fastest_versus(t), r) for r in runs if r.timed and not r.profiled
             and len(t := engine_rows(r.table, r.meta))]
    timed = [(v, r) for v, r in timed if len(v)]
    if not timed:
        return []
    versus, run = max(timed, key=lambda vr: vr[0].droplevel("engine").index.nunique())
    wins = versus.groupby(["model", "step"]).idxmin().map(lambda at: at[2])
    said = []
    for engine in [FLASHINFER, *BEYOND.values()]:
        mine = versus[versus.index.get_level_values("engine") == engine]
        if not len(mine):
            continue
        won = wins[wins == engine].index.get_level_values("step").value_counts()
        where = [", ".join(f"{step} {won[step]}" for step in sorted(won.index, key=_step_order))] if len(won) else []
        span = [] if engine == FLASHINFER else \
            [f"{ranged(mine)}x FlashInfer's best on the {len(mine)} it ran"]
        said.append(f"{engine}'s on {int(won.sum())}" + (f" ({'; '.join(where + span)})" if where + span else ""))
    steps, models = versus.droplevel("engine").index.nunique(), versus.index.get_level_values("model").nunique()
    return [f"- Of {steps} step{'s' * (steps != 1)} of {models} model{'s' * (models != 1)}, the fastest correct path "
            f"is " + ", ".join(said) + f" ({run.name})."]


TOPIC = "Beyond FlashInfer's wrappers"

SECTIONS = [
    Section("backends", "Beyond FlashInfer's wrappers: cuDNN, FlashAttention-4 and FlashAttention-3",
            "Per model and step, each backend an engine can pick (FlashInfer with the TRT-LLM kernels it ships, cuDNN "
            "through FlashInfer and through its own graph, FlashAttention-4, FlashAttention-3 as vLLM and SGLang build "
            "it, FlexAttention; docs/backends.md): its fastest correct path, the cases it timed, the median of its "
            "time / FlashInfer's best correct time on each case, its median share of the floor, DRAM read / needed "
            "where the run counted bytes, and its statuses on the step. Above: the window conventions the gate caught.",
            backends_table, caught_said, across=across, profiled=True),
]
