"""The answers a reader comes for, on the first screen of the findings page: which path to run for
each step and each model, on which library release, and what the wrong path costs; every number
with its run folder, the detail in the sections below."""

from __future__ import annotations

from collections import Counter

import pandas as pd

from swabench.analysis import price, replay, versus
from swabench.core.cases import MODES
from swabench.impls import registry
from swabench.publish.markdown import markdown_table, trace_name
from swabench.publish.sections import backends, machine, modes, neighbours, releases, serving, shelf, speed, trees
from swabench.publish.sections.base import (FINDINGS, FLOOR, Run, Section, merged, micros, own_mistake_caught,
                                            ratio, run_for_step, topic_link)
from swabench.publish.sections.serving import price_table, replay_table

SHELF_COLUMN = "best Hopper-shelf kernel: its time / the best wrapper path's"
VS_REFERENCE, VS_MASK = "its time / the reference path's", "the custom mask's time / its"
SLOWEST = "slowest correct path: its time / the fastest's"
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
    return ", ".join(f"`{impl}` {int(own_mistake_caught(g).sum())} of {len(g)}"
                     for impl, g in t.groupby("impl", sort=False) if own_mistake_caught(g).any())


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
        rows.append({"step": mode, "fastest correct path": f"`{best['impl']}` [{best['backend']}]",
                     VS_REFERENCE: ratio(best["ratio"]), "median time (us)": micros(best["us"]),
                     "cases": int(best["cases"]), FLOOR: machine.step_limits(run, mode, best["impl"], best["backend"]),
                     VS_MASK: ratio(best["mask"]) if best["mask"] == best["mask"] else "",
                     SLOWEST: f"`{worst['impl']}` [{worst['backend']}] {ratio(worst['ratio'] / best['ratio'])}x"
                     if len(paths) > 1 else "",
                     "known bugs caught": _bugs_of_step(run, mode),
                     SHELF_COLUMN: shelf.shelf_pick(runs, mode), "run": run.name})
    table = pd.DataFrame(rows)
    if table.empty or not table[SHELF_COLUMN].any():
        return table.drop(columns=SHELF_COLUMN, errors="ignore")
    picks = table[SHELF_COLUMN]
    # the run that speaks for most of the column is named once, above the table; a cell from another run names it
    most = Counter(pick[1] for pick in picks if pick).most_common(1)[0][0]
    table[SHELF_COLUMN] = [pick[0] if pick and pick[1] == most else shelf.in_words(pick) for pick in picks]
    table.attrs["shelf_run"] = most
    return table


def served_mixes(runs: list[Run]) -> list[str]:
    """Per replayed trace: its attention per 1000 steps served at its best, with the best single path per mode
    (or per layer type), and with the reference path alone."""
    said = []
    for r in runs:
        table = replay_table(r)
        if not len(table) or replay.SERVED not in set(table["impl"]):
            continue
        best = table[table["impl"] == replay.SERVED].iloc[0]
        trace = r.meta["trace"]
        name = trace_name(trace)[0].upper() + trace_name(trace)[1:]
        if best["all steps ms"] != best["all steps ms"]:
            said.append(f"- {name} ({trace['steps']} steps) cannot be served whole by correct paths ({r.name}).")
            continue
        ms = {row["impl"]: f"{row['all steps ms']:.3g} ms" for _, row in table.iterrows()
              if row["all steps ms"] == row["all steps ms"]}  # those that serve every step (the detail has the rest)
        whole = {impl: v for impl, v in ms.items() if impl.startswith("best single ") and ", " not in impl}
        named = [impl.removeprefix("best single ").removeprefix("path of ").removesuffix(" path") + f" {v}"
                 for impl, v in whole.items()]  # the whole trace's: not one layer type's part of it
        single = ([f"best single path of {', '.join(named)}"] if named else []) + \
            [f"{impl}: {v}" for impl, v in ms.items() if impl.endswith(" per layer type")]
        ref = registry.reference_path("paged")
        alone = table[(table["impl"] == ref[0]) & (table["backend"] == ref[1])] if ref else table.iloc[0:0]
        if len(alone) and alone["all steps ms"].notna().iloc[0]:
            single.append(f"`{ref[0]}` [{ref[1]}] alone: {alone['all steps ms'].iloc[0]:.3g} ms")
        said.append(f"- {name} ({trace['steps']} steps): {best['all steps ms']:.3g} ms of attention per 1000 steps "
                    f"served at its best" + "".join(f"; {x}" for x in single) + f" ({r.name}).")
    return said


def whole_models(runs: list[Run]) -> list[str]:
    """Per model, one line: the windowed layers' share of its attention over each set of steps it was priced on
    (the KV eviction keeps is in the detail), each naming its card where the line's runs ran on more than one."""
    lines: dict[str, list[tuple[str, str, str]]] = {}
    for r in runs:
        table, model = price_table(r), r.meta.get("price")
        if not len(table) or not model:
            continue
        every = table[table["mode"] == "all modes"].iloc[0]
        picked = every.get(price.PICKS, float("nan"))
        share = (f"{every['windowed share']:.0%} windowed, {micros(every['whole model (ms)'])}"
                 + (f" / {micros(picked)}" if picked == picked else "") + " ms"
                 if every["whole model (ms)"] == every["whole model (ms)"] else "not every step had a correct path")
        head = f"- `{model['model']}`, {model['windowed_layers']} of {model['num_layers']} layers windowed: "
        card = str(r.meta.get("gpu", "")).removeprefix("NVIDIA ")
        lines.setdefault(head, []).append((f"{priced_over(r.meta)}, {share}", card, r.name))
    said = []
    for head, parts in lines.items():
        several_cards = len({card for _, card, _ in parts}) > 1
        said.append(head + "; ".join(f"{text} ({card + ', ' if card and several_cards else ''}{name})"
                                     for text, card, name in parts) + ".")
    return said


def priced_over(meta: dict) -> str:
    """Which steps a price weighed: 'over models.toml steps', or 'over the trace `example` (200 steps)'
    (``swabench price TRACE`` names its source after the trace's file)."""
    model, source = meta["price"], f"price-{meta['price']['model']}"
    stem = meta.get("trace", {}).get("file", source).removeprefix(source).removeprefix("-")
    return f"over the trace `{stem}` ({model['model_steps']} steps)" if stem else "over models.toml steps"


def peers_at_serving_sizes(runs: list[Run]) -> list[str]:
    """In one sentence, per peer: how many of its decode and verify cases at serving sizes come within 10x of the
    reference path, and its median time / the reference's there; a case several runs hold counts once, from the
    first run given that has it."""
    found = [speed.at_serving_sizes(speed.peer_points(r.table)).assign(run=r.name) for r in runs if r.timed]
    found = [f for f in found if len(f)]
    if not found:
        return []
    cases = pd.concat(found).drop_duplicates(["impl", "backend", "case_id"])
    said = [f"`{impl}` {int((g['ratio'] <= speed.PEER_BOUND).sum())} of {len(g)}, {ratio(g['ratio'].median())}x"
            for impl, g in sorted(cases.groupby("impl"), key=lambda kv: registry.order(kv[0]))]
    named = list(dict.fromkeys(cases["run"]))
    named = ", ".join(named) if len(named) <= 2 else f"{len(named)} runs, each named in the detail"
    return [f"Per peer, its cases within {speed.PEER_BOUND}x and its median: " + "; ".join(said) + f" ({named})."]


def reads_said(runs: list[Run]) -> list[str]:
    """Per step, the paths that read the most past what their window needs (Nsight Compute's trusted runs), and the
    worst one's mechanism with its numbers."""
    said = [f"- {mode}: {words}." for mode in MODES if (words := machine.amplified(runs, mode, most=2, named=False))]
    if said:
        counted = len(machine.counted_runs(runs))
        said[-1] = said[-1][:-1] + f" ({counted} counted run{'s' * (counted != 1)}, each named in the detail)."
    worst = machine.worst_cliff(runs)
    return said + ([f"- The worst: {worst[0].lower()}{worst[1:]}"] if worst else [])


def beside_the_window(runs: list[Run], newest: list[Run]) -> list[str]:
    """Non-causal windows on every release, chunked attention on the newest: each sentence once, with its runs."""
    said = [(lead, r) for r in runs if (lead := neighbours.noncausal_lead(r))]
    said = [(f"Non-causal: {lead[0].lower()}{lead[1:]}", r) for lead, r in said]
    said += [(f"Chunked: {lead[0].lower()}{lead[1:]}", r) for r in newest for lead in neighbours.chunked_leads(r)]
    return merged(said, most=2)


def answers(runs: list[Run]) -> list[str]:
    parts = []
    drafts = trees.answer(runs)
    runs = [r.without_trees() for r in runs]
    reads = reads_said(runs)
    runs = [r for r in runs if not r.profiled]
    by_release = releases.in_short(runs)
    older = {id(r) for r in releases.older_releases(runs)}
    newest = [r for r in runs if id(r) not in older]
    beside = beside_the_window(runs, newest)
    runs = newest
    steps = per_step(runs)
    if len(steps):
        parts += [f"**Which path for each step** on the plain shapes of the run that timed it most "
                  f"({topic_link(speed)}), medians over the step's cases; the roofline floor is at the GPU's peak "
                  f"clocks ({topic_link(machine, 'roofline')})"
                  + ("; the Hopper shelf is FlashInfer's other Hopper kernels, held against its wrapper paths ("
                     + "".join(f"{run}, " for run in [steps.attrs.get("shelf_run")] if run) + f"{topic_link(shelf)})"
                     if SHELF_COLUMN in steps else "")
                  + ":",
                  markdown_table(steps)]
    if reads:
        parts += [f"**What each path reads**: DRAM bytes read / the bytes its window needs under Nsight Compute, "
                  f"median (least-most), per step the paths past {machine.AMPLIFIED}x; (calls): counted a call at a "
                  f"time, with its intermediates ({topic_link(machine)}):\n"
                  + "\n".join(reads)]
    graph = modes.in_short(widest) if (widest := modes.widest(runs)) else []
    if graph:
        parts += [f"**What CUDA-graph mode costs**: a FlashInfer path's kernel time with its wrappers built for graph "
                  f"capture minus built plain, median per step ({topic_link(modes)}):\n" + "\n".join(graph)]
    beyond = backends.answer(runs)
    if beyond:
        parts += [f"**Which backend** on the served shapes ({topic_link(backends)}):\n" + "\n".join(beyond)]
    mixes = served_mixes(runs)
    if mixes:
        parts += [f"**A server's mix** ({topic_link(serving)}):\n" + "\n".join(mixes)]
    models = whole_models(runs)
    if models:
        parts += [f"**A whole model's step**: the share of its attention time in its windowed layers, and ms per "
                  f"1000 model steps with each step of each layer at its fastest correct path / with one path per "
                  f"layer type ({topic_link(serving)}):\n" + "\n".join(models)]
    peers = peers_at_serving_sizes(runs)
    if peers:
        parts += [f"**The other libraries at serving sizes**: their time / the reference path's on decode and verify "
                  f"at batch >= {speed.PEER_BATCH}, context >= {speed.PEER_CONTEXT // 1024}k ({topic_link(speed)}). "
                  + peers[0]]
    if beside:
        parts += [f"**Beside the causal window** ({topic_link(neighbours)}):\n" + "\n".join(f"- {s}" for s in beside)]
    parts += [p for p in drafts if p]
    if by_release:
        parts += [f"**Which FlashInfer release** (a line names what went wrong past the declared bugs; "
                  f"slower and faster: kernel time against the newest release's; {topic_link(releases)}):\n"
                  + "\n".join(by_release)]
    return parts


SECTIONS = [
    Section("answers", "Answers", "", pages=frozenset({FINDINGS}), across=answers, every_release=True,
            profiled=True, trees=True),
]
