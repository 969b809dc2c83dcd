"""Markdown made from a run folder, never from hand-typed numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from swabench.analysis import derived, versus
from swabench.spec import models
from swabench.store import run_folder, schema
from swabench.core.cases import MODES
from swabench.impls import registry
from swabench.publish.markdown import environment_line, markdown_table

STATUS_ORDER = list(schema.STATUSES)


def correctness_matrix(table: pd.DataFrame) -> pd.DataFrame:
    """Per implementation and backend: how many points had each status, the worst error of the
    points that passed, and the smallest error of the known bugs the gate caught."""
    rows = []
    impl_order = {name: i for i, name in enumerate(dict.fromkeys(table["impl"]))}
    keys = sorted(table.groupby(["impl", "backend"]).groups, key=lambda k: (impl_order[k[0]], k[1]))
    for impl, backend in keys:
        group = table[(table["impl"] == impl) & (table["backend"] == backend)]
        counts = group["status"].value_counts()
        passed, caught = group[group["status"] == "pass"], group[group["status"] == "xfail"]
        rows.append({"impl": impl, "kind": group["kind"].iloc[0], "backend": backend,
                     **{s: int(counts.get(s, 0)) for s in STATUS_ORDER},
                     "worst rel-L2 (pass)": passed["rel_l2"].max(),
                     "worst probe row (pass)": passed["probe_rel_l2"].max(),
                     "lowest rel-L2 (xfail)": caught["rel_l2"].min(),
                     "lowest probe row (xfail)": caught["probe_rel_l2"].min()})
    return pd.DataFrame(rows)


def correctness_summary(table: pd.DataFrame, meta: dict) -> str:
    cases = table["case_id"].nunique()
    return (f"**{meta.get('scenario')}**: {cases} cases, {len(table)} points. {environment_line(meta)}\n\n"
            + markdown_table(correctness_matrix(table)))


def timing_matrix(table: pd.DataFrame) -> pd.DataFrame:
    """Per mode, implementation and backend: timed points, median kernel time, median speedup over
    the naive custom-mask path of the same cases, and how many points met the 2% noise bar."""
    timed = table.dropna(subset=["median_us"])
    rows = []
    for (mode, impl, backend), g in timed.groupby(["mode", "impl", "backend"], sort=True):
        rows.append({"mode": mode, "impl": impl, "backend": backend, "points": len(g),
                     "median us": g["median_us"].median(),
                     "median speedup vs mask": g["speedup_vs_mask"].median() if "speedup_vs_mask" in g else None,
                     "noise <= 2%": f"{int((g['noise'] <= 0.02).sum())}/{len(g)}"})
    return pd.DataFrame(rows)


def timing_summary(table: pd.DataFrame, meta: dict) -> str:
    """The timing half of ``swabench summary`` ("" for a gate-only run)."""
    if "median_us" not in table or table["median_us"].isna().all():
        return ""
    timed = table.dropna(subset=["median_us"])
    long = timed[timed["median_us"] >= 20]
    lines = [f"**{meta.get('scenario')}** timings: {len(timed)} timed points, sweep wall time "
             f"{meta.get('wall_s')} s, JIT warm-up "
             f"{'not measured' if meta.get('jit_warmup_total_s') is None else str(meta['jit_warmup_total_s']) + ' s'}; "
             f"{int((long['noise'] <= 0.02).sum())}/{len(long)} points of 20 us or more have noise <= 2%. "
             f"Method: {meta.get('method', {}).get('kernel_time', '')}"]
    peaks = meta.get("peaks")
    if peaks:
        lines.append(f"Node peaks: bf16 matmul {peaks['bf16_matmul_tflops']:.0f} TFLOP/s, "
                     f"copy {peaks['copy_tbps']:.2f} TB/s ({peaks['method']}).")
    return "\n\n".join(lines) + "\n\n" + markdown_table(timing_matrix(table))


def headline(table: pd.DataFrame) -> pd.DataFrame:
    """Speedup of the headline paths (fa2's window and trim paths) over their baseline (the custom-mask
    path), per mode and window: the median over the run's cases, with how many cases each cell holds."""
    t = versus.headline_paths(table.dropna(subset=["median_us", "speedup_vs_mask"]))
    if t.empty:
        return pd.DataFrame()
    grid = t.groupby(["mode", "sliding_window", "impl"])["speedup_vs_mask"].agg(["median", "count"]).reset_index()
    grid["cell"] = grid.apply(lambda r: f"{r['median']:.1f}x ({int(r['count'])})", axis=1)
    wide = grid.pivot_table(index=["mode", "sliding_window"], columns="impl", values="cell", aggfunc="first")
    order = {m: i for i, m in enumerate(MODES)}
    wide = wide.reset_index().sort_values(["mode", "sliding_window"], key=lambda c: c.map(order) if c.name == "mode" else c)
    cols = ["mode", "sliding_window"] + sorted(set(t["impl"]), key=registry.order)
    return wide[cols].rename(columns={"sliding_window": "window (keys)"})


def versus_reference(table: pd.DataFrame) -> pd.DataFrame:
    """versus.against_reference summarised per mode, storage, window and path: median, best and
    worst time / the reference path's time over the cases; "faster in" counts the cases below 1.
    The reference library's baselines are left to the headline table."""
    per_point = versus.against_reference(table, baselines=False)
    if per_point.empty:
        return pd.DataFrame()
    keys = ["mode", "storage", "sliding_window", "impl", "backend"]
    ratio = per_point.groupby(keys)["ratio"]
    out = ratio.agg(cases="count", median="median", best="min", worst="max")
    out["faster in"] = ratio.apply(lambda r: f"{int((r < 1).sum())}/{len(r)}")
    order = {m: i for i, m in enumerate(MODES)}
    out = out.reset_index().sort_values(keys, key=lambda c: c.map(order) if c.name == "mode" else c)
    return out.rename(columns={"sliding_window": "window (keys)", "median": "time / reference (median)"}) \
        .reset_index(drop=True)


def _spread(ratios: pd.Series) -> str:
    """'1.07x' for one value, else 'median (best-worst, n)'."""
    if len(ratios) == 1:
        return f"{ratios.iloc[0]:.2f}x"
    return f"{ratios.median():.2f}x ({ratios.min():.2f}-{ratios.max():.2f}, {len(ratios)})"


def feature_costs(table: pd.DataFrame) -> pd.DataFrame:
    """versus.feature_costs per feature, mode, path and twin: time with the feature / time of the
    plain twin, as median (best-worst, points)."""
    per_point = versus.feature_costs(table)
    if per_point.empty:
        return pd.DataFrame()
    keys = ["feature", "mode", "impl", "backend", "twin_impl"]
    out = per_point.groupby(keys, sort=False)["ratio"].apply(_spread).rename("time / plain twin").reset_index()
    order = {f: i for i, f in enumerate(versus.FEATURES)}
    return out.sort_values(["feature", "mode", "impl"], key=lambda c: c.map(order) if c.name == "feature" else
                           c.map(registry.order) if c.name == "impl" else c).reset_index(drop=True)


def decode_table(table: pd.DataFrame) -> pd.DataFrame:
    """Decode steps per window and context: the reference path's median time, and each decode path's
    time / the reference's on the same cases (median (best-worst, cases) over batch, page size, GQA
    group and head_dim).  Cases with sinks, a soft-cap or an fp8 cache are left to feature_costs."""
    per_point = decode_versus_reference(table)
    if per_point.empty:
        return pd.DataFrame()
    index = ["sliding_window", "context"]
    cells = per_point.groupby(index + ["path"])["ratio"].apply(_spread).reset_index()
    wide = cells.pivot_table(index=index, columns="path", values="ratio", aggfunc="first").reset_index()
    reference = per_point.groupby(index)["reference_us"].median().rename("reference us (median)").reset_index()
    paths = sorted(set(per_point["path"]), key=lambda p: (registry.order(p.split(" [")[0]), p))
    wide = reference.merge(wide, on=index)
    wide = wide.sort_values(index, key=lambda c: c.map(_numeric_first) if c.name == "context" else c) \
        .reset_index(drop=True)
    columns = index + ["reference us (median)"] + paths
    return wide[columns].rename(columns={"sliding_window": "window (keys)"}).fillna("")


def _numeric_first(text: str) -> tuple:
    """Sort key: plain numbers in numeric order, then summaries of per-request mixes."""
    return (0, int(text), "") if text.isdigit() else (1, 0, text)


def decode_versus_reference(table: pd.DataFrame) -> pd.DataFrame:
    """versus.against_reference's decode rows of plain cases, with ``path`` ('impl [backend]') and
    ``context`` (the keys before the query, however the case gave them)."""
    per_point = versus.against_reference(versus.plain(table), baselines=False)
    per_point = per_point[per_point["mode"] == "decode"]
    uniform = per_point["prefix_len"].fillna(per_point["seq_len"] - 1)
    drawn = per_point.reindex(columns=["length_dist"])["length_dist"].astype(object).fillna("").astype(str) \
        .str.replace(r"^prefix_len=", "", regex=True)  # a drawn seq_len keeps its name: it counts the query too
    context = [str(int(u)) if u == u else d for u, d in zip(uniform, drawn)]  # a per-request mix by its summary
    return per_point.assign(path=[f"{i} [{b}]" for i, b in zip(per_point["impl"], per_point["backend"])],
                            context=context)


def fastest_per_model(table: pd.DataFrame) -> pd.DataFrame:
    """Per model preset and step (mode, storage), on the cases with the model's own sinks and soft-cap
    (not their plain twins): the fastest correct path that passed, its time (the mean over the step's
    cases where there are several, as in a trace, among the paths that timed every one), the runner-up,
    and fa3's best time against fa2's best (below 1: fa3 is faster)."""
    if "model" not in table:
        return pd.DataFrame()
    t = table[(table["kind"] == "correct") & (table["status"] == "pass")].dropna(subset=["median_us", "model"])
    features = t.reindex(columns=["sinks", "logits_soft_cap"])
    served = [models.serves(m, s, c) for m, s, c in zip(t["model"], features["sinks"], features["logits_soft_cap"])]
    t = t[pd.Series(served, index=t.index, dtype=bool)]
    rows = []
    for (model, mode, storage), g in t.groupby(["model", "mode", "storage"], sort=False):
        paths = g.groupby(["impl", "backend"], sort=False)["median_us"].agg(["mean", "count"])
        paths = paths[paths["count"] == g["case_id"].nunique()].sort_values("mean")  # those that timed every case
        if paths.empty:
            continue
        (impl, backend), best = paths.index[0], paths["mean"].iloc[0]
        by_backend = paths.groupby(level="backend")["mean"].min()
        rows.append({"model": model, "step": f"{mode} {storage}", "fastest": f"{impl} [{backend}]", "us": best,
                     "next": f"{paths.index[1][0]} [{paths.index[1][1]}] {paths['mean'].iloc[1] / best:.2f}x"
                     if len(paths) > 1 else "",
                     "fa3 / fa2 (best)": by_backend["fa3"] / by_backend["fa2"]
                     if {"fa2", "fa3"} <= set(by_backend.index) else None})
    return pd.DataFrame(rows)


def evicted_reads(table: pd.DataFrame) -> pd.DataFrame:
    """Per implementation and backend, on pages evicted to a shared null page: points where the NaN
    diagnostic turned the output NaN (the kernel reads memory before the window) out of those tried."""
    if "reads_evicted" not in table:
        return pd.DataFrame()
    t = table.dropna(subset=["reads_evicted"])
    if t.empty:
        return pd.DataFrame()
    reads = t["reads_evicted"].astype(str).str.lower() == "true"
    out = t.assign(reads=reads).groupby(["impl", "backend"], sort=False)["reads"].agg(["sum", "count"])
    return pd.DataFrame({"impl": [i for i, _ in out.index], "backend": [b for _, b in out.index],
                         "output turned NaN": [f"{int(s)}/{int(n)}" for s, n in zip(out["sum"], out["count"])]})


def replay_table(table: pd.DataFrame, meta: dict) -> pd.DataFrame:
    """A replay's time per 1000 steps of its trace's mix (empty for a run that replayed no trace)."""
    trace = meta.get("trace")
    if not trace:
        return pd.DataFrame()
    from swabench.analysis import replay
    return replay.per_thousand_steps(table, trace["weights"], trace.get("modes"))


def _section(title: str, caption: str, frame: pd.DataFrame) -> list[str]:
    """A report section: its heading, what the table is, the table; nothing where the run has no rows for it."""
    return [f"## {title}", caption, markdown_table(frame)] if len(frame) else []


def write(run_dir: Path, out: Path) -> Path:
    """REPORT.md and its figures in ``out``, from the run folder alone."""
    from swabench.publish import plots

    run_dir, out = Path(run_dir), Path(out)
    table, meta = derived.load(run_dir)
    made = plots.make_all(table, meta, out)
    env_keys = ["gpu", "nvidia_smi.driver_version", "cuda", "torch", "libraries", "swabench", "git_commit",
                "python", "cpu", "host", "time_utc", "command", "nvidia_smi.clocks.max.sm", "peaks"]
    env = pd.DataFrame([{"": k, "value": json.dumps(meta[k]) if isinstance(meta.get(k), dict) else meta.get(k)}
                        for k in env_keys if meta.get(k) is not None])
    method = pd.DataFrame([{"what": k, "how": json.dumps(v) if isinstance(v, dict) else v}
                           for k, v in meta.get("method", {}).items()])
    bad = table[table["status"].isin(["fail", "xpass"])]
    presets = table["model"].dropna().unique() if "model" in table else []
    parts = [f"# swabench report: {meta.get('scenario')}" + (f", {presets[0]}" if len(presets) == 1 else ""),
             f"Run folder `{run_dir}`; {len(table)} points over {table['case_id'].nunique()} cases. "
             f"{environment_line(meta)}",
             "## Environment", markdown_table(env),
             "## Method", markdown_table(method),
             "## Correctness", correctness_summary(table, meta)]
    if len(bad):
        parts += [f"{len(bad)} points failed the gate or let a known bug through:",
                  markdown_table(bad[["status", "impl", "backend", "case", "reason"]].head(50))]
    head = headline(table)
    if len(head):
        parts += ["## Headline: speedup over the custom-mask path",
                  "Median over the run's cases of the baseline's time (the custom-mask path of the same "
                  "storage) / the path's time; (n) = cases in the cell.",
                  markdown_table(head)]
    parts += _section(f"Against the reference path ({registry.describe_reference()})",
                      "Time of each path / time of the reference path of its storage on the same case: below 1 "
                      "is faster.  Other backends, the custom-mask paths of other libraries and the peers "
                      "(FlexAttention, SDPA) on the cases where the run timed both.", versus_reference(table))
    trace = meta.get("trace") or {}
    parts += _section(f"Decode: each wrapper against {registry.describe_reference()}",
                      "Time of each decode path / time of the reference path on the same decode step, per window "
                      "and context: median (best-worst, cases) over batch, page size, GQA group and head_dim; cases "
                      "with sinks, a soft-cap or an fp8 cache are in the next table.", decode_table(table))
    parts += _section("Serving features against their plain twins",
                      "Time with sinks, a soft-cap or an fp8 cache / time of the same shape without it, through the "
                      "same path and backend (the sink wrapper, which runs only cases with sinks, against the "
                      "reference path): median (best-worst, points).", feature_costs(table))
    parts += _section("Per model: the fastest correct path of each step",
                      "Among the paths that passed the gate on the model's shape, with its own sinks and soft-cap: "
                      "the fastest, the next one (its time / the fastest's), and the best fa3 time / the best fa2 "
                      "time.  Where a step has several cases (a trace's distinct steps), a path's time is its mean "
                      "over them, among the paths that timed every one.", fastest_per_model(table))
    parts += _section(f"Trace replay: {trace.get('file')}",
                      f"{trace.get('steps')} steps, {trace.get('distinct')} distinct, each gated and timed once and "
                      f"weighted by how often it occurs: milliseconds of attention per 1000 steps of the mix, split "
                      f"by the step's mode (empty where a path did not run every step of that mode); the last row "
                      f"serves each mode with its fastest path.", replay_table(table, meta))
    parts += _section("Evicted pages: who reads pages wholly before the window",
                      "With the pages wholly before each request's window pointed at one shared page, that page "
                      "filled with NaN: points whose output turned NaN (the kernel read it, masked or not; a read "
                      "whose result is never used would not show) / points tried.", evicted_reads(table))
    timings = timing_summary(table, meta)
    if timings:
        parts += ["## Timings", timings]
    parts.append("## Figures")
    for name, paths in made.items():
        doc = (plots.FIGURES[name].__doc__ or name).strip()
        parts.append(f"![{name}]({paths[0].name})\n\n*{doc}*" if paths else f"*{name}: no points for it in this run.*")
    path = out / "REPORT.md"
    run_folder.atomic_write(path, "\n\n".join(parts) + "\n")
    return path
