"""The serving surface: what sinks, a soft-cap and an fp8 cache cost against the same shape without
them, the fastest correct path per model preset, a trace's mix served step by step, who reads
pages evicted from before the window, and what each path makes of a cache whose slots no query may
read hold NaN, Inf or large values."""

from __future__ import annotations

import pandas as pd

from swabench.analysis import decisions, replay, versus
from swabench.core.cases import CACHE_FILLS, MODES
from swabench.impls import registry
from swabench.publish.markdown import trace_name
from swabench.publish.sections.base import Run, Section, points, ratio, span, spread
from swabench.store import schema, tables


def feature_costs(run: Run) -> pd.DataFrame:
    """versus.feature_costs per feature, mode, path and twin: time with the feature / time of the plain
    twin, as median (best-worst, points)."""
    per_point = versus.feature_costs(run.table) if run.timed else pd.DataFrame()
    if per_point.empty:
        return pd.DataFrame()
    keys = ["feature", "mode", "impl", "backend", "twin_impl"]
    out = per_point.groupby(keys, sort=False)["ratio"].apply(spread).rename("time / plain twin").reset_index()
    order = {f: i for i, f in enumerate(versus.FEATURES)}
    return out.sort_values(["feature", "mode", "impl"], key=lambda c: c.map(order) if c.name == "feature" else
                           c.map(registry.order) if c.name == "impl" else c).reset_index(drop=True)


def dropped_features(run: Run) -> list[str]:
    """How far off each known bug that takes a feature and leaves it out (``ignores`` at its
    registration) came, where the gate caught it."""
    said = []
    for impl in (i for i in registry.all_implementations() if i.ignores):
        ran = run.table[(run.table["impl"] == impl.name) & (run.table["status"] != "skip")]
        caught = ran[ran["status"] == "xfail"]
        if len(caught):
            said.append(f"- `{impl.name}` ({impl.summary}) was caught on {len(caught)} of the {points(len(ran))} "
                        f"with {' and '.join(sorted(impl.ignores))} it ran: rel-L2 {span(caught['rel_l2'])} on random "
                        f"data; on the probe pass, rows off by up to {ratio(caught['probe_rel_l2'].max())} times their "
                        f"own norm ({run.name}).")
    return said


TIME, RUNNER_UP, FA3_FA2 = "time (us)", "runner-up: its time / the fastest's", "fa3's best time / fa2's best"


def fastest_per_model(run: Run) -> pd.DataFrame:
    """Per model preset and step (mode, storage), on the cases with the model's own sinks and soft-cap
    (not their plain twins): the fastest correct path that passed, its time (the mean over the step's
    cases where there are several, as in a trace, among the paths that timed every one), the runner-up,
    and fa3's best time against fa2's best (below 1: fa3 is faster)."""
    t = decisions.served(run.table)
    if t.empty:
        return pd.DataFrame()
    rows = []
    for (model, mode, storage), g in t.groupby(["model", "mode", "storage"], sort=False):
        paths = g.groupby(["impl", "backend"], sort=False)["median_us"].agg(["mean", "count"])
        paths = paths[paths["count"] == g["case_id"].nunique()].sort_values("mean")  # those that timed every case
        if paths.empty:
            continue
        (impl, backend), best = paths.index[0], paths["mean"].iloc[0]
        by_backend = paths.groupby(level="backend")["mean"].min()
        rows.append({"model": model, "step": f"{mode} {storage}", "fastest": f"{impl} [{backend}]", TIME: best,
                     RUNNER_UP: f"{paths.index[1][0]} [{paths.index[1][1]}] {paths['mean'].iloc[1] / best:.2f}x"
                     if len(paths) > 1 else "",
                     FA3_FA2: by_backend["fa3"] / by_backend["fa2"]
                     if {"fa2", "fa3"} <= set(by_backend.index) else None})
    return pd.DataFrame(rows)


def replay_steps(run: Run) -> pd.DataFrame:
    """A replay's ``replay.csv`` (each step x path, weighted; each step's layer type taken from the table
    where the file is older than that column), or the same made from its table where the folder has none
    (a replay that crashed, or was written before the file); empty for a run that replayed no trace."""
    trace = run.meta.get("trace")
    if not trace or run.meta.get("price"):  # a price run's steps are layer steps: its own section weighs them
        return pd.DataFrame()
    per_step = tables.optional_table(run.folder, schema.REPLAY)
    if per_step is None:
        return replay.steps(run.table, trace["weights"], trace.get("modes"))
    if "layer" not in per_step:  # a replay.csv written before the column
        per_step.insert(per_step.columns.get_loc("mode") + 1, "layer", per_step["case_id"].map(replay.layers(run.table)))
    return per_step


def replay_table(run: Run) -> pd.DataFrame:
    """A replay's time per 1000 steps of its trace's mix, per path, per library's best single path, and
    served at its best step by step (empty for a run that replayed no trace)."""
    per_step = replay_steps(run)
    return replay.per_thousand_steps(per_step, tuple(lib.name for lib in registry.libraries())) \
        if len(per_step) else pd.DataFrame()


def replay_said(run: Run) -> list[str]:
    trace = run.meta.get("trace")
    return [f"Replay of {trace_name(trace)} ({trace['steps']} steps, {trace['distinct']} distinct) ({run.name})."] \
        if trace and not run.meta.get("price") else []


def price_table(run: Run) -> pd.DataFrame:
    """A price run's milliseconds per 1000 model steps per mode (price.csv, else made from its table)."""
    from swabench.analysis import price

    if not run.meta.get("price"):
        return pd.DataFrame()
    stored = tables.optional_table(run.folder, schema.PRICE)
    stored = pd.DataFrame() if stored is None else stored
    if len(stored) and (price.PICKS in stored.columns or "trace" not in run.meta):  # older, or all there is
        return stored
    return price.per_mode(run.table, run.meta)


def price_said(run: Run) -> list[str]:
    p = run.meta.get("price")
    if not p:
        return []
    kv = "; ".join(f"{k['mode']} at {k['context']} keys, {k['kv_mib_all_pages']:.0f} MiB with every page and "
                   f"{k['kv_mib_evicted']:.0f} MiB with out-of-window pages evicted" for k in p["kv"])
    from swabench.analysis import price

    blank = [f"\"{column}\" is blank: " + "; ".join(why) + f" ({run.name})."
             for column, why in price.blanks(run.table, run.meta).items()]
    picked = price.picks(run.table, run.meta) if "trace" in run.meta else {}
    chosen = "; ".join(f"{layer} {mode}: " + (f"`{picked[layer, mode][0]}` [{picked[layer, mode][1]}]"
                                              if picked[layer, mode] else "no one path passed every step")
                       for layer, mode in sorted(picked, key=lambda k: (k[0] != "window", MODES.index(k[1]))))
    return [f"`{p['model']}`: {p['windowed_layers']} windowed of {p['num_layers']} layers, {p['model_steps']} model "
            f"steps ({run.name}).", f"KV a request holds: {kv} ({run.name}).",
            *([f"One path per layer type and step: {chosen} ({run.name})."] if chosen else []), *blank]


def evicted_reads(run: Run) -> pd.DataFrame:
    """Per implementation and backend, on pages evicted to a shared null page: points where the NaN
    diagnostic turned the output NaN (the kernel reads memory before the window) out of those tried."""
    if "reads_evicted" not in run.table:
        return pd.DataFrame()
    t = run.table.dropna(subset=["reads_evicted"])
    if t.empty:
        return pd.DataFrame()
    reads = t["reads_evicted"].astype(str).str.lower() == "true"
    out = t.assign(reads=reads).groupby(["impl", "backend"], sort=False)["reads"].agg(["sum", "count"])
    return pd.DataFrame({"impl": [i for i, _ in out.index], "backend": [b for _, b in out.index],
                         "output turned NaN": [f"{int(s)}/{int(n)}" for s, n in zip(out["sum"], out["count"])]})


def _failed_where(bad: pd.DataFrame) -> str:
    """What a path's failed points share, in words: their storage, page sizes and page layouts, head_dims, steps and
    windows."""
    if bad.empty:
        return ""
    paged = bad[bad["storage"] == "paged"]
    layouts = sorted(paged["page_layout"].dropna().unique()) if "page_layout" in paged else []
    stores = ([f"page {'/'.join(str(int(p)) for p in sorted(paged['page_size'].unique()))}"
               + (f" ({'/'.join(layouts)})" if layouts else "")] if len(paged) else []) \
        + (["ragged"] if (bad["storage"] == "ragged").any() else [])
    dims = "head_dim " + "/".join(str(int(d)) for d in sorted(bad["head_dim"].unique()))
    modes = ", ".join(m for m in MODES if m in set(bad["mode"]))
    windows = "window " + "/".join(str(int(w)) for w in sorted(bad["sliding_window"].dropna().unique())) \
        if "sliding_window" in bad and bad["sliding_window"].notna().any() else ""
    return "; ".join(filter(None, [", ".join(stores), dims, modes, windows]))


def stale_fills(run: Run) -> pd.DataFrame:
    """Per correct path, backend and cache fill (docs/scenarios.md, ``cache_fill``): the points that passed,
    failed, or were xfail (a declared bug or documented precondition spoke there), what the failed points share,
    and each declaration with what its points share; empty for a run whose every cache held random data."""
    t = run.table
    if "cache_fill" not in t or set(t["cache_fill"].dropna()) <= {"random"}:
        return pd.DataFrame()
    t = t[(t["kind"] == "correct") & (t["status"] != "skip")]
    rows = []
    for (impl, backend, fill), g in t.groupby(["impl", "backend", "cache_fill"], sort=False):
        counts, xfail = g["status"].value_counts(), g[g["status"] == "xfail"]
        declared = [f"{ref} ({_failed_where(d)})" for ref, d in xfail.groupby(xfail["upstream"].fillna("undeclared"))]
        rows.append({"impl": impl, "backend": backend, "cache_fill": fill,
                     **{s: int(counts.get(s, 0)) for s in ("pass", "fail", "xfail")},
                     "failed where": _failed_where(g[g["status"] == "fail"]), "declared": "; ".join(declared)})
    out = pd.DataFrame(rows)
    fills = {f: i for i, f in enumerate(CACHE_FILLS)}
    return out.sort_values(["impl", "backend", "cache_fill"], kind="stable", key=lambda c: c.map(
        registry.order) if c.name == "impl" else c.map(fills) if c.name == "cache_fill" else c).reset_index(drop=True)


def _listed(words) -> str:
    """'a', 'a and b', 'a, b and c'."""
    words = list(words)
    return " and ".join(filter(None, [", ".join(words[:-1]), words[-1]]))


def stale_said(run: Run) -> list[str]:
    """Each correct path that fails under some fill outside every declaration (where a slot no query may read
    reaches its output), one line a path; then the paths that passed every fill."""
    table = stale_fills(run)
    if table.empty:
        return []
    said = []
    for (impl, backend), g in table.groupby(["impl", "backend"], sort=False):
        failed = g[g["fail"] > 0]
        if len(failed):
            alike = failed.groupby(["fail", "failed where"], sort=False)["cache_fill"].apply(list)
            fills = ", ".join(_listed(f"`{f}`" for f in fs) + f" on {points(n)}{' each' if len(fs) > 1 else ''} "
                              f"({where})" for (n, where), fs in alike.items())
            said.append(f"- `{impl}` [{backend}] lets slots no query may read into its output: {fills} ({run.name}).")
    clean = table.groupby(["impl", "backend"], sort=False)[["fail", "xfail"]].sum()
    clean = clean[(clean["fail"] == 0) & (clean["xfail"] == 0)].index
    if len(clean):
        said.append("- Every fill passed on " + ", ".join(f"`{i}` [{b}]" for i, b in clean) + f" ({run.name}).")
    return said


TOPIC = "Serving: features, models, trace replay, whole-model price, evicted pages, stale caches"

SECTIONS = [
    Section("features", "Sinks, soft-cap and fp8 caches against their plain twins",
            "Time with the feature / time of the same shape without it, through the same path and backend (the "
            "sink wrapper, which runs only cases with sinks, against the reference path): median (best-worst, "
            "points); and how far off a path is that takes a feature and leaves it out.", feature_costs,
            dropped_features),
    Section("models", "Per model: the fastest correct path of each step",
            "Per model preset, on the model as served (its own sinks and soft-cap; the plain twins are in the feature "
            "table): the fastest correct path of each step, the runner-up (its time / the fastest's), and fa3's best "
            "time / fa2's best (below 1: fa3 is faster).  Where a step has several cases (a trace's distinct steps), "
            "a path's time is its mean over them, among the paths that timed every one.", fastest_per_model),
    Section("replay", "Trace replay: milliseconds per 1000 steps",
            "Each distinct step of a server's trace gated and timed once and weighted by how often it occurs: "
            "milliseconds of attention per 1000 steps of the mix, split by the step's mode (empty where a path did "
            "not run every step of that mode).  Below the paths: each library's best single path per mode, then the "
            "best over every backend together (FlashInfer, TRT-LLM's kernels, cuDNN, FlashAttention-4, "
            "FlexAttention), one per layer type where the trace mixes layers (heads, head_dim, window, sinks, soft-cap, dtypes), with the "
            "mix those picks serve (a server picks one path per layer type), and the mix served at its best, each "
            "step by the fastest correct path "
            "that passed it (known bugs never count; a mode is empty where no correct path passed one of its steps, "
            "and the row says which).  The folder's replay.csv has every step x path.", replay_table,
            replay_said),
    Section("price", "Whole-model price: milliseconds of attention per 1000 model steps",
            "Each model step as its windowed layers (sliding or chunked) and its global layers, each layer step at its "
            "fastest correct path, weighted by how many layers of each kind the model has; the windowed layers' share; "
            "the whole step with one path per kind of layer and step, the fastest over all its steps (an engine picks a "
            "backend per layer type, not per batch); and the whole step with the windowed layers through the custom mask instead, or, at decode, through the "
            "CUDA-core decode kernel over the full table (the other steps at their best).", price_table, price_said),
    Section("evicted", "Evicted pages: who reads pages wholly before the window",
            "With the pages wholly before each request's window pointed at one shared page that holds NaN: the "
            "points whose output turned NaN, that is, whose kernel read memory before the window (masked or not; "
            "with finite values there every correct path passes) / points tried.", evicted_reads),
    Section("stale", "Stale caches: NaN, Inf or large values where no query may read",
            "Per correct path, backend and cache fill (`random`: the control; `nan`, `inf`, `large`: what the slots "
            "past each request's last key, the spare pages and a ragged buffer's spare rows hold): points that "
            "passed, failed or were `xfail` (where a declared bug or a library's documented precondition speaks, "
            "named under 'declared' with what its points share), and the pages, head_dims, steps and windows the failed "
            "points share. "
            "A correct kernel that loads such a slot must keep it out of its output (`0 * NaN` is NaN).",
            stale_fills, stale_said),
]
