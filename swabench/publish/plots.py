"""Figures made from a run folder's table (never from typed-in numbers): PNG, Okabe-Ito
colours (safe for colour-blind readers), the device and library versions in every caption, and
points that failed the gate or were skipped drawn as such rather than dropped."""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from pathlib import Path

import pandas as pd

from swabench.analysis import versus
from swabench.analysis.versus import against_reference, reference_library
from swabench.impls import registry
from swabench.publish import backend_plots, heatmap, limits, style, tree_plots
from swabench.publish.marks import Series, draw, face, legend_by_path, medians, noisy, ring, time_label, timed
from swabench.publish.style import BACKEND_STYLE, figure, log_x_ticks, look, save
from swabench.core.cases import MODES

def _is_baseline(impl: str) -> bool:
    return impl in registry.names() and registry.get(impl).baseline


def tick_labels(frame: pd.DataFrame, case_ids: list[str]) -> list[str]:
    """The labels of these cases (keyed by id: two steps of a trace can share a label), shortened."""
    labels = frame.drop_duplicates("case_id").set_index("case_id")["case"]
    return _differences([labels[c] for c in case_ids])


def _differences(labels: list[str]) -> list[str]:
    """Case labels without the words every one of them shares (the head shape, dtype, model, ...); a label left with
    none says which of the others' words it lacks ("without sinks"), and the whole label where they all are equal."""
    words = [re.findall(r"\S*\[[^\]]*\]\S*|\S+", label) for label in labels]  # "p[32 of 1..9 sum 80]" is one word
    shared = set.intersection(*map(set, words)) if len(words) > 1 else set()
    rest = [[w for w in ws if w not in shared] for ws in words]
    others = list(dict.fromkeys(w for ws in rest for w in ws))
    return [" ".join(ws) or (f"without {' '.join(others)}" if others else label) for ws, label in zip(rest, labels)]


def timed_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The timed rows, lengths as numbers (NaN where each request has its own: length_dist says how)."""
    if "median_us" not in table:
        return table.iloc[0:0]
    t = table[table["status"] == "pass"].dropna(subset=["median_us"])
    lengths = {c: pd.to_numeric(t[c], errors="coerce") for c in ("prefix_len", "seq_len", "qo_len") if c in t}
    return t.assign(**lengths)


def _primary(table: pd.DataFrame) -> pd.DataFrame:
    """Each library's most common backend only (fa2 for FlashInfer in the shipped scenarios), so a
    median over the other axes compares series over the same cases; backends() compares backends."""
    main = table.groupby("library")["backend"].agg(lambda b: b.value_counts().index[0]).to_dict()
    return table[table["backend"] == table["library"].map(main)]


def _mark_untimed(ax, rows: pd.DataFrame, x: str, bars: bool = False) -> None:
    """Failed points as red crosses along the top, skipped as grey squares along the bottom; on a panel drawn as
    bars, whose axis has no x values, their counts in its corners instead."""
    for status, y, marker, col, label in (("fail", 0.97, "X", "#D55E00", "failed gate"),
                                          ("skip", 0.03, "s", "#999999", "skipped")):
        xs = rows.loc[rows["status"] == status, x].dropna().unique()
        if len(xs) and bars:
            count = int((rows["status"] == status).sum())
            ax.text(0.99, y, f"{label}: {count} point" + ("s" if count > 1 else ""), transform=ax.transAxes,
                    ha="right", va="top" if y > 0.5 else "bottom", fontsize=6, color=col)
        elif len(xs):
            ax.scatter(xs, [y] * len(xs), marker=marker, color=col, s=30, transform=ax.get_xaxis_transform(),
                       label=label, zorder=5, clip_on=False)


def time_vs_window(table, meta):
    """Time against the window (the kernel's on a GPU, host wall time on a CPU), per implementation, faceted by mode
    and storage; a panel of one window as a bar per path.  Cases without a window (chunked attention: the sawtooth
    figure's) have no place on its axis and are left out."""
    every = table[(table["kind"] == "correct") & (pd.to_numeric(table["sliding_window"], errors="coerce") > 0)]
    correct = _primary(every)
    modes = [m for m in MODES if m in set(correct["mode"])]
    storages = [s for s in ("paged", "ragged") if s in set(correct["storage"])]
    if not modes or timed_rows(correct).empty:
        return None
    fig, axes = figure(meta, f"{timed(meta).capitalize()} vs window (lines: median over the other axes; marks: every "
                             f"failed or skipped point, any backend)", len(modes), len(storages))
    for i, mode in enumerate(modes):
        for j, storage in enumerate(storages):
            ax = axes[i][j]
            facet = (every["mode"] == mode) & (every["storage"] == storage)
            rows = correct[(correct["mode"] == mode) & (correct["storage"] == storage)]
            if rows.empty:
                ax.set_axis_off()
                ax.set_title(f"{mode}, {storage}: no points", fontsize=8)
                continue
            series = [Series(impl, f"{impl} [{backend}]", medians(g, "sliding_window"), BACKEND_STYLE.get(backend, "-"))
                      for (impl, backend), g in timed_rows(rows).groupby(["impl", "backend"])]
            bars = draw(ax, series, "sliding window (keys)", show=lambda w: f"{int(w)}")
            _mark_untimed(ax, every[facet], "sliding_window", bars)
            ax.set(yscale="log", title=f"{mode}, {storage}", ylabel=time_label(meta))
            if not bars:
                log_x_ticks(ax, rows["sliding_window"])
            ax.grid(alpha=0.3, which="both")
    legend_by_path(fig, axes)
    return fig


def speedup_by_mode(table, meta):
    """Median speedup of each correct path over the naive custom-mask path, per mode."""
    t = _primary(timed_rows(table))
    t = t[(t["kind"] == "correct") & ~t["impl"].map(_is_baseline).astype(bool)].dropna(subset=["speedup_vs_mask"])
    if t.empty:
        return None
    fig, axes = figure(meta, "Speedup over the custom-mask baseline of the same case (median, IQR bars)")
    ax = axes[0][0]
    series = sorted({(r.impl, r.backend) for r in t.itertuples()}, key=lambda k: (registry.order(k[0]), k[1]))
    modes = [m for m in MODES if m in set(t["mode"])]
    width = 0.8 / len(series)
    for k, (impl, backend) in enumerate(series):
        rows = t[(t["impl"] == impl) & (t["backend"] == backend)]
        g = rows.groupby("mode")["speedup_vs_mask"]
        med, q1, q3 = g.median(), g.quantile(0.25), g.quantile(0.75)
        xs = [i + (k - (len(series) - 1) / 2) * width for i, m in enumerate(modes) if m in med.index]
        ms = [m for m in modes if m in med.index]
        style = look(impl)
        ax.errorbar(xs, med[ms], yerr=[med[ms] - q1[ms], q3[ms] - med[ms]], ls="none", ms=5, elinewidth=0.8,
                    mfc=face(style["color"], backend), label=f"{impl} [{backend}]", **style)
        ring(ax, xs, med[ms], rows.assign(_n=noisy(rows)).groupby("mode")["_n"].any()[ms])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set(xticks=range(len(modes)), xticklabels=modes, ylabel="speedup (x)", yscale="log")
    ax.grid(alpha=0.3, axis="y", which="both")
    legend_by_path(fig, axes, backends="fill")
    return fig


def speculative(table, meta):
    """Verify time against draft tokens, and draft-extend time against the acceptance distribution (the kernel's time
    on a GPU, host wall time on a CPU)."""
    t = _primary(table[(table["kind"] == "correct") & (table["storage"] == "paged")])
    panels = [m for m in ("verify", "draft_extend") if m in set(t["mode"])]
    if not panels or timed_rows(t).empty:
        return None
    fig, axes = figure(meta, "Speculative decoding: verify and draft extend (median over the other axes)",
                        1, len(panels))
    for ax, mode in zip(axes[0], panels):
        rows = t[t["mode"] == mode].copy()
        key = "qo_len" if mode == "verify" else "block"
        if mode == "draft_extend":
            rows["block"] = rows["accept"].astype(str) + " / " + rows["qo_len"].astype(str)
            categories = list(dict.fromkeys(rows.sort_values(["qo_len", "accept"])["block"]))
        else:
            categories = sorted(rows[key].dropna().unique())
        pos = {c: i for i, c in enumerate(categories)}
        rows["_x"] = rows[key].map(pos)
        series = [Series(impl, f"{impl} [{backend}]", medians(g, "_x"), BACKEND_STYLE.get(backend, "-"))
                  for (impl, backend), g in timed_rows(rows).groupby(["impl", "backend"])]
        bars = draw(ax, series, "draft tokens" if mode == "verify" else "acceptance distribution / draft block",
                    show=lambda x: _word(categories[int(x)]))
        _mark_untimed(ax, rows, "_x", bars)
        ax.set(yscale="log", title=mode, ylabel=time_label(meta))
        if not bars:
            ax.set_xticks(range(len(categories)), [_word(c) for c in categories], fontsize=7)
        ax.grid(alpha=0.3, which="both")
    legend_by_path(fig, axes)
    return fig


def _word(category) -> str:
    """A category as a tick label: a number without a trailing .0 (draft tokens 8, not 8.0)."""
    return f"{category:g}" if isinstance(category, (int, float)) else str(category)


def decode(table, meta):
    """Decode steps: time against context for every timed path (each wrapper, kernel and window-or-trim choice; a
    line style per backend), one panel per window; hollow marks for one-token pages.  Cases with sinks, a soft-cap
    or an fp8 cache are left out (the report's feature table has them)."""
    t = timed_rows(versus.plain(table[table["mode"] == "decode"]))  # chunked decode is the sawtooth figure's
    t = t.dropna(subset=["prefix_len"]) if "prefix_len" in t else t.iloc[0:0]  # a context per request has no place
    if t.empty:
        return None
    windows = sorted(t["sliding_window"].unique())
    fig, axes = figure(meta, f"Decode: {timed(meta)} vs context (median over batches and shapes)", 1, len(windows),
                       size=(4.2, 4.0))
    for ax, window in zip(axes[0], windows):
        rows = t[t["sliding_window"] == window]
        series = [Series(impl, f"{impl} [{backend}]" + (f" ps{int(page)}" if page == page else ""),
                         medians(g, "prefix_len"), BACKEND_STYLE.get(backend, "-"), hollow=page == 1)
                  for (impl, backend, page), g in rows.groupby(["impl", "backend", "page_size"], dropna=False)]
        if not draw(ax, series, "context (keys before the query)", show=lambda c: f"{int(c)}"):
            log_x_ticks(ax, rows["prefix_len"])
        ax.set(yscale="log", title=f"window {int(window)} keys", ylabel=time_label(meta))
        ax.grid(alpha=0.3, which="both")
    legend_by_path(fig, axes, keys=_page_key(t["page_size"]))
    return fig


def _page_key(pages: pd.Series) -> list:
    """The legend's word for each page size drawn: hollow marks for one-token pages, solid for the others."""
    from matplotlib.lines import Line2D

    sizes = sorted(int(p) for p in pages.dropna().unique())
    return [(Line2D([], [], ls="none", marker="o", ms=4, color="#555555", mfc="none" if p == 1 else "#555555"),
             f"page size {p}" + (" (hollow)" if p == 1 else "")) for p in sizes]


def _chunks(table: pd.DataFrame) -> pd.Series:
    """Each row's attention_chunk (0 where the table predates the axis)."""
    return table["attention_chunk"].fillna(0) if "attention_chunk" in table else pd.Series(0, index=table.index)


def sawtooth(table, meta):
    """Chunked attention's cost against context: a query's keys, and so its time, grow with its place in its
    chunk and fall back at every chunk start (dotted), a sawtooth; beside it the sliding window of C - 1
    keys on the same steps, flat once the context passes the window.  One panel per chunk size and step."""
    t = timed_rows(versus.plain(table, chunked=True))
    t = t.assign(chunk=_chunks(t), context=t["prefix_len"].fillna(t["seq_len"] - t["qo_len"])).dropna(subset=["context"])
    chunked = t[t["chunk"] > 0]  # a panel per chunk size and step it timed (lengths drawn per request have no axis)
    if chunked.empty:
        return None
    chunks = sorted(int(c) for c in chunked["chunk"].unique())
    modes = [m for m in MODES if m in set(chunked["mode"])]
    fig, axes = figure(meta, f"Chunked attention against a sliding window of the same keys: {timed(meta)} vs context",
                       len(chunks), len(modes), size=(4.6, 3.8))
    for row, chunk in zip(axes, chunks):
        for ax, mode in zip(row, modes):
            rows = t[(t["mode"] == mode) & ((t["chunk"] == chunk) | ((t["chunk"] == 0) & (t["window_left"] == chunk - 1)))]
            if rows.empty:
                ax.set_axis_off()
                continue
            series = [Series(impl, f"{impl} [{backend}]" + ("" if is_chunk else " (window)"), medians(g, "context"),
                             BACKEND_STYLE.get(backend, "-"), hollow=not is_chunk)
                      for (impl, backend, is_chunk), g in rows.groupby(["impl", "backend", rows["chunk"] > 0])]
            if not draw(ax, series, "context (keys before the queries)", show=lambda c: f"{int(c)}", log=False):
                for start in range(chunk, int(rows["context"].max()) + 1, chunk):
                    ax.axvline(start, color="grey", lw=0.6, ls=":")
            ax.set(title=f"{mode}, chunk {chunk}", ylabel=time_label(meta))
            ax.grid(alpha=0.3)
    from matplotlib.lines import Line2D

    window = Line2D([], [], ls="none", marker="o", ms=4, color="#555555", mfc="none")
    legend_by_path(fig, axes, keys=[(window, "the window of C - 1 keys (hollow)")])
    return fig


def peers(table, meta):
    """Each path's time over the reference path (fa2's window path) on the same case (log scale, 1 =
    as fast), on the cases where a peer library ran: fa3 and auto, FlexAttention, SDPA; below 1 beats it."""
    r = against_reference(table, baselines=False)
    r = r[r["case_id"].isin(set(r.loc[r["library"] != reference_library(), "case_id"]))]
    if r.empty:
        return None
    cases = list(dict.fromkeys(r.sort_values(["mode", "storage", "sliding_window", "batch_size"])["case_id"]))
    paths = list(dict.fromkeys(zip(r["impl"], r["backend"])))
    fig, axes = figure(meta, f"Against {registry.describe_reference()}: time / its time per case",
                        size=(8.0, 0.22 * len(cases) + 1.5))
    ax = axes[0][0]
    y = {c: i for i, c in enumerate(cases)}
    for impl, backend in paths:
        g = r[(r["impl"] == impl) & (r["backend"] == backend)]
        style = look(impl)
        ax.scatter(g["ratio"], g["case_id"].map(y), s=18, marker=style["marker"], edgecolors=style["color"],
                   facecolors=face(style["color"], backend), label=f"{impl} [{backend}]", alpha=0.85)
        ring(ax, g["ratio"], g["case_id"].map(y), noisy(g))
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xscale("log")
    ax.set_yticks(range(len(cases)), tick_labels(r, cases), fontsize=6)
    ax.set_xlabel("time / reference-path time (below 1: faster)")
    ax.invert_yaxis()
    ax.grid(alpha=0.3, axis="x")
    legend_by_path(fig, axes, backends="fill")
    return fig


def plan_vs_kernel(table, meta):
    """Host plan() cost against the step's time (the kernel's on a GPU, host wall time on a CPU): above the diagonal,
    planning costs more than the step."""
    t = timed_rows(table).dropna(subset=["plan_us"])
    if t.empty:
        return None
    fig, axes = figure(meta, f"Plan cost (host) vs {timed(meta)}, per point")
    ax = axes[0][0]
    for impl, g in t.groupby("impl"):
        style = look(impl)
        ax.scatter(g["median_us"], g["plan_us"], s=10, alpha=0.7, marker=style["marker"], color=style["color"],
                   label=impl)
        ring(ax, g["median_us"], g["plan_us"], noisy(g))
    lo, hi = min(t["median_us"].min(), t["plan_us"].min()), max(t["median_us"].max(), t["plan_us"].max())
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8, label=f"plan = {timed(meta)}")
    ax.set(xscale="log", yscale="log", xlabel=time_label(meta), ylabel="plan() host time (us)")
    ax.grid(alpha=0.3, which="both")
    legend_by_path(fig, axes, backends=None)
    return fig


def wrapper_modes(table, meta):
    """What CUDA-graph mode costs: each path's kernel time with its wrappers built for capture / built plain, on
    the same step, against the batch (one panel per step; above 1, graph mode is slower)."""
    from swabench.analysis import wrapper_modes as modes

    m = modes.pairs(table)
    if m.empty:
        return None
    steps = [x for x in MODES if x in set(m["mode"])]
    fig, axes = figure(meta, "CUDA-graph mode against plain wrappers: kernel time ratio (graph / plain)", 1,
                       len(steps), size=(4.2, 4.0))
    for ax, step in zip(axes[0], steps):
        rows = m[m["mode"] == step]
        both = rows.assign(noise=rows.reindex(columns=["noise", "plain_noise"]).max(axis=1))  # a ratio is as noisy as either time
        series = [Series(impl, f"{impl} [{backend}]", medians(g, "batch_size", "cost"), BACKEND_STYLE.get(backend, "-"))
                  for (impl, backend), g in both.groupby(["impl", "backend"])]
        if not draw(ax, series, "batch (requests)", show=lambda b: f"{int(b)}", log=False):
            log_x_ticks(ax, rows["batch_size"])
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(title=step, ylabel=f"graph / plain {timed(meta)}")
        ax.grid(alpha=0.3, which="both")
    legend_by_path(fig, axes)
    return fig


FIGURES = {"time_vs_window": time_vs_window, "speedup_by_mode": speedup_by_mode, "peers": peers,
           "speedup_heatmap": heatmap.speedup_heatmap, "speculative": speculative, "backends": backend_plots.backends, "decode": decode,
           "plan_vs_kernel": plan_vs_kernel, "sawtooth": sawtooth, "wrapper_modes": wrapper_modes,
           **limits.FIGURES, **tree_plots.FIGURES, **backend_plots.FIGURES}


def figure_files() -> list[str]:
    """The name of every figure file ``make_all`` may write."""
    return [f"{name}.png" for name in FIGURES]


def make_all(table: pd.DataFrame, meta: dict, out: Path) -> dict[str, list[Path] | None]:
    """Every figure the run has data for, as PNG in ``out``; None for those it has none for, or whose panels would
    all be empty.  The draft-tree figure reads the tree points; the others, every point but those."""
    out.mkdir(parents=True, exist_ok=True)
    made, chains = {}, table[table["tree"].isna()] if "tree" in table else table
    for name, build in FIGURES.items():
        with quiet():
            fig = build(table if name in tree_plots.FIGURES else chains, meta)
            if fig is not None and not draws_anything(fig):
                style.pyplot().close(fig)
                fig = None
            made[name] = None if fig is None else save(fig, out, name)
    return made


def draws_anything(fig) -> bool:
    """Whether some panel of ``fig`` holds a line, a mark, a bar or an image (a colour bar alone is not one)."""
    return any(ax.lines or ax.collections or ax.patches or ax.images for ax in fig.axes if ax.get_label() != "<colorbar>")


@contextlib.contextmanager
def quiet():
    """Figure building without matplotlib's and numpy's warnings on the user's stderr (a log axis of
    one point, an empty legend): the figure is drawn all the same, and the CLI's own messages stay
    readable."""
    logger = logging.getLogger("matplotlib")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
