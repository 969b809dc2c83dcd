"""The figure that answers "which backend": per step and model, each backend's fastest correct path against
FlashInfer's best on the same cases (the findings' backends table holds the same numbers)."""

from __future__ import annotations

import matplotlib.ticker

from swabench.core.cases import MODES
from swabench.publish.sections.backends import BEYOND, FLASHINFER, backend_of
from swabench.publish.style import ENGINE_COLOUR, figure, legend_outside


TICKS = [0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 50]


def which_backend(table, meta):
    """One panel per step, a group of bars per model, a bar per backend: the median over the cases of its fastest
    correct path's time / FlashInfer's best correct time on each case (log scale: below 1 beats FlashInfer); a
    backend that ran there without a timed correct point is written where its bar would be (skip, or fail)."""
    t = table.assign(engine=backend_of(table)).dropna(subset=["engine"])
    beyond = t[t["backend"].isin(("cudnn", "fa4"))]
    if beyond.empty or beyond["median_us"].isna().all():
        return None
    t = t.assign(model=t["model"].fillna("-") if "model" in t else "-")
    ok = t[(t["kind"] == "correct") & (t["status"] == "pass") & t["median_us"].notna()]
    best = ok[ok["engine"] == FLASHINFER].groupby("case_id")["median_us"].min()
    ok = ok.assign(versus=ok["median_us"] / ok["case_id"].map(best)).dropna(subset=["versus"])
    fastest = ok.groupby(["mode", "model", "engine", "impl", "backend"])["versus"].median() \
        .groupby(["mode", "model", "engine"]).min()
    steps, models = [m for m in MODES if m in set(t["mode"])], sorted(set(t["model"]))
    engines = [e for e in (FLASHINFER, *BEYOND.values()) if e in set(t["engine"])]
    fig, axes = figure(meta, "Which backend: each one's fastest correct path / FlashInfer's best on the same cases",
                       1, len(steps), size=(3.4, 3.6))
    width, span = 0.8 / len(engines), (min(fastest.min(), 1) / 1.15, max(fastest.max(), 1) * 1.15)  # one scale
    for ax, step in zip(axes[0], steps):
        for k, engine in enumerate(engines):
            for i, model in enumerate(models):
                x = i + (k - (len(engines) - 1) / 2) * width
                ran = t[(t["mode"] == step) & (t["model"] == model) & (t["engine"] == engine)]
                if (step, model, engine) in fastest.index:  # a bar from 1: up is slower than FlashInfer, down faster
                    value = fastest[(step, model, engine)]
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
