"""The answers a reader comes for, on the first screen of the findings page: which path to run for
each step and each model, on which library release, and what the wrong path costs; every number
with its run folder, the detail in the sections below."""

from __future__ import annotations

import pandas as pd

from swabench.analysis import price, replay, versus
from swabench.core.cases import MODES
from swabench.impls import registry
from swabench.publish.markdown import library_versions, markdown_table, trace_name
from swabench.publish.sections import machine, modes, neighbours, releases, speed, trees
from swabench.publish.sections.base import FINDINGS, Run, Section, micros, ratio, run_for_step
from swabench.publish.sections.serving import fastest_per_model, price_table, replay_table

COVERAGE = 0.5  # a path competes for a step when it timed at least this share of the cases the reference timed


def _paths_of_step(run: Run, mode: str) -> pd.DataFrame:
    """Per correct path: its median time / the reference path's over the step's cases, the cases, and
    the median of the naive mask's time / its own (speedup_vs_mask)."""
    v = versus.against_reference(run.table, baselines=True)
    v = v[v["mode"] == mode]
    refs = {registry.reference_path(s) for s in set(v["storage"])} - {None}
    t = run.table
    own = t[(t["mode"] == mode) & t["median_us"].notna() & (t["kind"] == "correct") & (t["status"] == "pass")]
    mine = own[[(i, b) in refs for i, b in zip(own["impl"], own["backend"])]]
    rows = [dict(impl=i, backend=b, ratio=1.0, cases=len(g), mask=g["speedup_vs_mask"].median(),
                 us=g["median_us"].median()) for (i, b), g in mine.groupby(["impl", "backend"])]
    rows += [dict(impl=i, backend=b, ratio=g["ratio"].median(), cases=len(g), mask=g["speedup_vs_mask"].median(),
                  us=g["median_us"].median()) for (i, b), g in v.groupby(["impl", "backend"])]
    paths = pd.DataFrame(rows)
    if paths.empty or not len(mine):
        return paths
    return paths[paths["cases"] >= COVERAGE * mine["case_id"].nunique()].sort_values("ratio")


def _bugs_of_step(run: Run, mode: str) -> str:
    t = run.table[(run.table["mode"] == mode) & (run.table["kind"] == "known-bug") & (run.table["status"] != "skip")]
    return ", ".join(f"`{impl}` wrong on {int((g['status'] == 'xfail').sum())} of {len(g)}"
                     for impl, g in t.groupby("impl", sort=False) if (g["status"] == "xfail").any())


def per_step(runs: list[Run]) -> pd.DataFrame:
    rows = []
    for mode in MODES:
        run = run_for_step(runs, mode)
        if run is None:
            continue
        paths = _paths_of_step(run, mode)
        if paths.empty:
            continue
        best, worst = paths.iloc[0], paths.iloc[-1]
        rows.append({"step": mode, "release": library_versions(run.meta),
                     "fastest correct path": f"`{best['impl']}` [{best['backend']}], {ratio(best['ratio'])}x the "
                                             f"reference ({micros(best['us'])} us median, {int(best['cases'])} cases)",
                     "the machine's limit": machine.step_limits(run, mode, best["impl"], best["backend"]),
                     "the custom mask instead": f"{ratio(best['mask'])}x its time" if best["mask"] == best["mask"]
                     else "", "slowest correct path": f"`{worst['impl']}` [{worst['backend']}] "
                                                      f"{ratio(worst['ratio'] / best['ratio'])}x its time"
                     if len(paths) > 1 else "",
                     "known bugs caught": _bugs_of_step(run, mode), "run": run.name})
    return pd.DataFrame(rows)


def per_model(runs: list[Run]) -> tuple[pd.DataFrame, Run | None]:
    found = [(r, fastest_per_model(r)) for r in runs if r.timed]
    found = [(r, f) for r, f in found if len(f)]
    if not found:
        return pd.DataFrame(), None
    run, table = max(found, key=lambda rf: rf[1]["model"].nunique())
    table = table.assign(mode=table["step"].str.split().str[0])
    best = table.sort_values("us").drop_duplicates(["model", "mode"])
    best = best.assign(cell=[f"`{f}` {micros(u)} us" for f, u in zip(best["fastest"], best["us"])])
    wide = best.pivot(index="model", columns="mode", values="cell").reindex(columns=[m for m in MODES if m in
                                                                                      set(best["mode"])])
    wide = wide.reindex(list(dict.fromkeys(table["model"]))).reset_index().fillna("")
    return wide, run


def served_mixes(runs: list[Run]) -> list[str]:
    said = []
    for r in runs:
        table = replay_table(r)
        if not len(table) or replay.SERVED not in set(table["impl"]):
            continue
        best = table[table["impl"] == replay.SERVED].iloc[0]
        single = table[table["impl"].str.startswith("best single ") | table["impl"].str.endswith(" per layer type")]
        trace = r.meta["trace"]
        name = trace_name(trace)[0].upper() + trace_name(trace)[1:]
        if best["all steps ms"] != best["all steps ms"]:
            said.append(f"- {name} ({trace['steps']} steps) cannot be served whole by correct "
                        f"paths: {best['backend']} ({r.name}).")
            continue
        ref = registry.reference_path("paged")
        alone = table[(table["impl"] == ref[0]) & (table["backend"] == ref[1])] if ref else table.iloc[0:0]
        said.append(f"- {name} ({trace['steps']} steps), served at its best (each step by the "
                    f"fastest correct path that passed it): {best['all steps ms']:.3g} ms of attention per 1000 steps "
                    f"({best['backend']})" + "".join(
                        f"; with the {row['impl']} per mode: "
                        + (f"{row['all steps ms']:.3g} ms ({row['backend']})" if row["all steps ms"] ==
                           row["all steps ms"] else f"not every mode ({row['backend']})")
                        for _, row in single.iterrows())
                    + (f"; with `{ref[0]}` [{ref[1]}] alone: {alone['all steps ms'].iloc[0]:.3g} ms"
                       if len(alone) and alone["all steps ms"].notna().iloc[0] else "") + f" ({r.name}).")
    return said


def whole_models(runs: list[Run]) -> list[str]:
    """Per price run: the windowed layers' share of the model's attention over its steps, and the KV a request
    keeps when out-of-window pages are evicted."""
    said = []
    for r in runs:
        table, model = price_table(r), r.meta.get("price")
        if not len(table) or not model:
            continue
        every = table[table["mode"] == "all modes"].iloc[0]
        kv = pd.DataFrame(model["kv"])
        kept = (kv["kv_mib_evicted"] / kv["kv_mib_all_pages"]).agg(["min", "max"])
        picked = every.get(price.PICKS, float("nan"))
        share = (f"its windowed layers take {every['windowed share']:.0%} of its attention over its steps "
                 f"({micros(every['whole model (ms)'])} ms per 1000 model steps, {library_versions(r.meta)}"
                 + (f"; {micros(picked)} ms with one path per layer type and step" if picked == picked else "") + ")"
                 if every["whole model (ms)"] == every["whole model (ms)"] else "not every step had a correct path")
        said.append(f"- `{model['model']}` ({model['windowed_layers']} windowed of {model['num_layers']} layers): "
                    f"{share}; evicting out-of-window pages keeps {kept['min']:.0%}-{kept['max']:.0%} of its KV "
                    f"({r.name}).")
    return said


def peers_at_serving_sizes(runs: list[Run]) -> list[str]:
    """Per peer: how many of its decode and verify cases at serving sizes come within 10x of the reference
    path, and its median time / the reference's there; a case several runs hold counts once, from the first
    run given that has it."""
    found = [speed.at_serving_sizes(speed.peer_points(r.table)).assign(run=r.name) for r in runs if r.timed]
    found = [f for f in found if len(f)]
    if not found:
        return []
    cases = pd.concat(found).drop_duplicates(["impl", "backend", "case_id"])
    return [f"- `{impl}`: within {speed.PEER_BOUND}x on {int((g['ratio'] <= speed.PEER_BOUND).sum())} of {len(g)} "
            f"cases, median {ratio(g['ratio'].median())}x the reference ({', '.join(dict.fromkeys(g['run']))})."
            for impl, g in sorted(cases.groupby("impl"), key=lambda kv: registry.order(kv[0]))]


def reads_said(runs: list[Run]) -> list[str]:
    """Per step, the paths that read more DRAM than their window needs (Nsight Compute's trusted runs), and the
    worst one's mechanism with its numbers."""
    said = [f"- {mode}: {words}." for mode in MODES if (words := machine.amplified(runs, mode))]
    worst = machine.worst_cliff(runs)
    return said + ([f"- The worst: {worst[0].lower()}{worst[1:]}"] if worst else [])


def answers(runs: list[Run]) -> list[str]:
    parts = []
    drafts = trees.answer(runs)
    runs = [r.without_trees() for r in runs]
    reads = reads_said(runs)
    runs = [r for r in runs if not r.profiled]
    by_release = releases.in_short(runs)
    beside = [s for r in runs for s in neighbours.noncausal_said(r)]  # every release
    older = {id(r) for r in releases.older_releases(runs)}
    runs = [r for r in runs if id(r) not in older]
    beside += [s for r in runs for s in neighbours.chunked_findings(r)]
    steps = per_step(runs)
    if len(steps):
        parts += ["**Which path for each step.** The fastest correct path (median over the run's cases of its time / "
                  "the reference path's on the same case), what the naive custom mask costs on the same cases, the "
                  "slowest correct path, and the known bugs that give wrong answers there; the machine's limit is the "
                  "fastest path's median floor / time (100%: at the node's measured copy bandwidth or matmul rate; "
                  "detail under The machine's limit):", markdown_table(steps)]
    if reads:
        parts += [f"**What each path reads.** DRAM bytes read / the bytes a step's window needs, as Nsight Compute "
                  f"counted them: median (least-most) per path that read more than {machine.AMPLIFIED}x (the others "
                  f"read what the window needs; detail under Bytes each path reads):\n" + "\n".join(reads)]
    models, run = per_model(runs)
    if len(models):
        parts += [f"**Which path for each model** as served (its own sinks and soft-cap), the fastest correct path "
                  f"of each step and its kernel time, from {run.name} ({library_versions(run.meta)}):",
                  markdown_table(models)]
    graph = [s for r in runs if r.timed for s in modes.in_short(r)]
    if graph:
        parts += ["**What CUDA-graph mode costs.** Each FlashInfer path's kernel time with its wrappers built for "
                  "CUDA-graph capture (as engines serve decode and verify) minus the same path built plain (as they "
                  "run prefill), per step (detail under CUDA-graph mode against plain wrappers):\n" + "\n".join(graph)]
    mixes = served_mixes(runs)
    if mixes:
        parts += ["**A server's mix.**\n" + "\n".join(mixes)]
    models = whole_models(runs)
    if models:
        parts += ["**A whole model's step.** Its windowed and global layers, each step at its fastest correct path "
                  "(detail under Whole-model price):\n" + "\n".join(models)]
    peers = peers_at_serving_sizes(runs)
    if peers:
        parts += [f"**The other libraries at serving sizes.** Their decode and verify points at batch >= "
                  f"{speed.PEER_BATCH} and context >= {speed.PEER_CONTEXT // 1024}k against the reference path on the "
                  f"same case, over the runs named (their releases under Runs; detail under Peers):\n" + "\n".join(peers)]
    if beside:
        parts += ["**Beside the causal window** (non-causal windows, chunked attention):\n"
                  + "\n".join(f"- {s}" for s in beside)]
    parts += [p for p in drafts if p]
    if by_release:
        parts += ["**Which release.** One scenario on several releases (detail under Across releases):\n"
                  + "\n".join(by_release)]
    return parts


SECTIONS = [
    Section("answers", "Answers", "What the runs below say, in short; each number names its run folder, and the "
            "sections below hold the detail.", pages=frozenset({FINDINGS}), across=answers, every_release=True,
            profiled=True, trees=True),
]
