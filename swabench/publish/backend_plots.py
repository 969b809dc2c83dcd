"""The backend figures: one path's backends side by side (fa2, fa3, auto's pick), and the one that answers "which
backend": per step and model, each backend's fastest correct path against FlashInfer's best on the same cases (the
findings' backends table holds the same numbers)."""

from __future__ import annotations

import matplotlib.ticker

from swabench.impls import registry
from swabench.publish.sections.backends import BEYOND, FLASHINFER, engine_rows, fastest_versus
from swabench.publish.sections.shelf import _step_order
from swabench.publish.marks import noisy, ring, time_label
from swabench.publish.style import BACKEND_COLOUR, ENGINE_COLOUR, figure, legend_outside

MOST_BARS = 24  # cases a panel labels one by one; past them it sets each backend's time against fa2's


def backends(table, meta):
    """fa2 against fa3 per shape, and what auto picked: a red note where auto is >5% off the best; points that were
    skipped or failed are written where their bar would be; noisy points are ringed.  A path with more shapes than a
    panel can label is drawn as each other backend's time against fa2's on the same shape (below the diagonal: faster
    than fa2)."""
    from swabench.publish.plots import tick_labels, timed_rows

    every = table[table["kind"] == "correct"]
    every = every[every.groupby(["case_id", "impl"])["backend"].transform("nunique") > 1]
    if timed_rows(every).empty:
        return None
    impls = sorted(set(every["impl"]), key=registry.order)
    fig, axes = figure(meta, "Backends per shape: fa2 vs fa3, and auto's pick", len(impls), 1, size=(9.0, 3.2))
    for ax, impl in zip(axes[:, 0], impls):
        g = every[every["impl"] == impl]
        cases = list(dict.fromkeys(g["case_id"]))
        names = [b for b in BACKEND_COLOUR if b in set(g["backend"])]
        if len(cases) > MOST_BARS:
            _against_fa2(ax, timed_rows(g), [b for b in names if b != "fa2"], impl, len(cases), meta)
            continue
        width = 0.8 / len(names)
        for k, backend in enumerate(names):
            rows = g[g["backend"] == backend].set_index("case_id")
            for i, case in enumerate(cases):
                x = i + (k - (len(names) - 1) / 2) * width
                if case not in rows.index:
                    continue
                r = rows.loc[case]
                if r["status"] == "pass" and r["median_us"] == r["median_us"]:
                    ax.bar(x, r["median_us"], width, color=BACKEND_COLOUR[backend], label=backend if i == 0 else None)
                    ring(ax, [x], [r["median_us"]], noisy(rows.loc[[case]]))
                else:
                    ax.text(x, 0.02, r["status"], transform=ax.get_xaxis_transform(), rotation=90, ha="center",
                            va="bottom", fontsize=6, color="#999999" if r["status"] == "skip" else "#D55E00")
        for i, case in enumerate(cases):
            c = timed_rows(g[g["case_id"] == case]).set_index("backend")
            if "auto" in c.index and c["median_us"].min() < c.loc["auto", "median_us"] / 1.05:
                ax.text(i, c["median_us"].max() * 1.15, f"auto({c.loc['auto', 'resolved_backend']}) loses",
                        ha="center", fontsize=6, color="#D55E00")
        ax.set(xticks=range(len(cases)), xlim=(-0.5, len(cases) - 0.5), ylabel=time_label(meta), title=impl,
               yscale="log")  # every case in view, those with no bar (skipped, failed) too
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xticklabels(tick_labels(g, cases), rotation=30, ha="right", fontsize=6)
        ax.grid(alpha=0.3, axis="y")
    legend_outside(fig, axes)
    return fig


def _against_fa2(ax, timed, others: list[str], impl: str, shapes: int, meta: dict) -> None:
    """Each other backend's time against fa2's on the same shape, log-log, with the diagonal; a point noisy in
    either time ringed."""
    timed = timed.assign(_noisy=noisy(timed))
    fa2 = timed[timed["backend"] == "fa2"].set_index("case_id")
    paired = 0
    for backend in others:
        mine = timed[timed["backend"] == backend].set_index("case_id")
        both = mine.index.intersection(fa2.index)
        ax.scatter(fa2.loc[both, "median_us"], mine.loc[both, "median_us"], s=9, color=BACKEND_COLOUR[backend],
                   label=backend)
        ring(ax, fa2.loc[both, "median_us"], mine.loc[both, "median_us"],
             fa2.loc[both, "_noisy"] | mine.loc[both, "_noisy"])
        paired += len(both)
    if not paired:
        ax.text(0.5, 0.5, f"no shape timed on fa2 and on {' or '.join(others)}", transform=ax.transAxes,
                ha="center", va="center", fontsize=8, color="#999999")
    edge = [timed["median_us"].min() / 1.3, timed["median_us"].max() * 1.3]
    ax.plot(edge, edge, color="grey", lw=0.8)
    ax.set(xscale="log", yscale="log", xlim=edge, ylim=edge, xlabel=f"fa2 {time_label(meta)}",
           ylabel=time_label(meta), title=f"{impl}: {shapes} shapes, each against fa2 (below the line: faster)")
    ax.grid(alpha=0.3, which="both")


TICKS = [0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 50]


def which_backend(table, meta):
    """One panel per step, a group of bars per model, a bar per backend: the median over the cases of its fastest
    correct path's time / FlashInfer's best correct time on each case (log scale: below 1 beats FlashInfer); a
    backend that ran there without a timed correct point is written where its bar would be (skip, or fail)."""
    t = engine_rows(table, meta)
    if t.empty:
        return None
    fastest = fastest_versus(t)
    steps, models = sorted(set(t["step"]), key=_step_order), sorted(set(t["model"]))
    engines = [e for e in (FLASHINFER, *BEYOND.values()) if e in set(t["engine"])]
    fig, axes = figure(meta, "Which backend: each one's fastest correct path / FlashInfer's best on the same cases",
                       1, len(steps), size=(3.4, 3.6))
    width, span = 0.8 / len(engines), (min(fastest.min(), 1) / 1.15, max(fastest.max(), 1) * 1.15)  # one scale
    for ax, step in zip(axes[0], steps):
        for k, engine in enumerate(engines):
            for i, model in enumerate(models):
                x = i + (k - (len(engines) - 1) / 2) * width
                ran = t[(t["step"] == step) & (t["model"] == model) & (t["engine"] == engine)]
                if (model, step, engine) in fastest.index:  # a bar from 1: up is slower than FlashInfer, down faster
                    value = fastest[(model, step, engine)]
                    ax.bar(x, value - 1, width, bottom=1, color=ENGINE_COLOUR[engine], label=engine)
                elif len(ran[ran["kind"] == "correct"]):
                    failed = (ran["status"] == "fail").any()
                    ax.text(x, 0.03, "fail" if failed else "skip", transform=ax.get_xaxis_transform(), rotation=90,
                            ha="center", va="bottom", fontsize=6, color="#D55E00" if failed else "#999999")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(yscale="log", title=step, ylabel="time / FlashInfer's best", ylim=span)
        ax.set_yticks([v for v in TICKS if span[0] <= v <= span[1]], minor=False)
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xticks(range(len(models)), models, rotation=30, ha="right", fontsize=7)
        ax.grid(alpha=0.3, axis="y", which="both")
    legend_outside(fig, axes)
    return fig


FIGURES = {"which_backend": which_backend}
