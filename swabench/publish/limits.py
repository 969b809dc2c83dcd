"""Figures of the machine's limit, made from a run folder's table: the roofline (each timed point's rate
against its arithmetic intensity, under the GPU's ceiling, with the node's measured rates dashed below it),
the rate each step reaches against its context (TB/s where a step is memory-bound, TFLOP/s where it is not),
and the DRAM bytes Nsight Compute counted each path reading against the bytes its window needs.  Every path
has one look (``style.look``) in all three."""

from __future__ import annotations

import numpy as np
import pandas as pd

from swabench.analysis import derived
from swabench.core.cases import MODES
from swabench.impls import registry
from swabench.measure.ceiling import ceilings
from swabench.publish.sections.machine import ceiling_parts, counted_points
from swabench.publish.marks import Series, draw, face, legend_by_path, medians, noisy, ring
from swabench.publish.style import BACKEND_STYLE, figure, look


def _paths(t: pd.DataFrame) -> list[tuple[str, str]]:
    return sorted(set(zip(t["impl"], t["backend"])), key=lambda p: (registry.order(p[0]), p[1]))


def _correct_timed(table: pd.DataFrame) -> pd.DataFrame:
    t = table[(table["kind"] == "correct") & (table["status"] == "pass")]
    return t.dropna(subset=["median_us"]) if "median_us" in t else t.iloc[0:0]


def _points(ax, g: pd.DataFrame | None, x, y, impl: str, backend: str, k: int | None = None) -> None:
    """One path's points: its look, hollow on fa3 and pale on auto (``marks.face``); with ``k`` (its place among the
    paths drawn), a size a step smaller than the path drawn before it, so that points several paths share show as
    nested marks; the noisy ones among ``g``'s rows ringed."""
    style = look(impl)
    ax.scatter(x, y, s=14 if k is None else max(6.0, 120 * 0.72 ** k), alpha=0.85, label=f"{impl} [{backend}]",
               marker=style["marker"], edgecolors=style["color"], facecolors=face(style["color"], backend),
               linewidths=0.8)
    if g is not None:
        ring(ax, x, y, noisy(g))


def roofline(table, meta):
    """Each timed point's achieved TFLOP/s (useful flops / kernel time) against its arithmetic intensity (useful
    flops / min_bytes), under the GPU's ceiling (DRAM TB/s x intensity, and the bf16 TFLOP/s; the part's peak at
    its maximum clocks where the run has it), which no point reaches, and dashed below it what the node attained:
    its measured copy and read stream x intensity, up to its measured matmul."""
    peaks = meta.get("peaks")
    t = _correct_timed(table)
    if not peaks or t.empty:
        return None
    t = t.assign(intensity=t["flops"] / t["min_bytes"], rate=t["flops"] / t["median_us"] / 1e6)
    fig, axes = figure(meta, "Roofline: each timed point against the GPU's ceiling", size=(8.0, 5.0))
    ax = axes[0][0]
    for impl, backend in _paths(t):
        g = t[(t["impl"] == impl) & (t["backend"] == backend)]
        _points(ax, g, g["intensity"], g["rate"], impl, backend)
    tbps, tflops = ceilings(peaks)
    lo, hi = t["intensity"].min() / 2, t["intensity"].max() * 2
    xs = np.geomspace(min(lo, 1.0), max(hi, 2 * tflops / tbps), 200)
    ax.plot(xs, np.minimum(tbps * xs, tflops), color="black", lw=1.0,
            label="ceiling: " + ", ".join(ceiling_parts(peaks, how=False)))
    for name, rate, ls in (("copy", peaks["copy_tbps"], "--"), ("read", peaks.get("read_tbps"), "-.")):
        if rate and (rate, peaks["bf16_matmul_tflops"]) != (tbps, tflops):
            ax.plot(xs, np.minimum(rate * xs, peaks["bf16_matmul_tflops"]), color="black", lw=0.8, ls=ls,
                    label=f"attainable (measured): {name} {rate:.2f} TB/s, matmul {peaks['bf16_matmul_tflops']:.0f} "
                          f"TFLOP/s")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (useful flops / min_bytes)",
           ylabel="achieved TFLOP/s")
    ax.grid(alpha=0.3, which="both")
    legend_by_path(fig, axes, backends="fill")
    return fig


def _memory_bound(rows: pd.DataFrame, mode: str, peaks: dict) -> bool:
    """Whether most of a step's points have the bytes' time as their floor (without peaks: every step but
    extend, which holds thousands of queries a request)."""
    if not peaks:
        return mode != "extend"
    return bool(derived.memory_bound(rows, peaks).mean() >= 0.5)


def rate_vs_context(table, meta):
    """The rate each step reaches against context, per path: TB/s (min_bytes / time) for decode, verify and draft
    extend, which are memory-bound; TFLOP/s (useful flops / time) for extend.  On a run that measured the GPU's
    peaks, its ceiling is drawn beside them (solid), and what the node attained where it falls short of it (dashed:
    its measured copy, or its matmul)."""
    t = _correct_timed(table)
    if t.empty:
        return None
    before = pd.to_numeric(t["seq_len"], errors="coerce") - pd.to_numeric(t["qo_len"], errors="coerce")
    t = t.assign(context=pd.to_numeric(t["prefix_len"], errors="coerce").fillna(before)).dropna(subset=["context"])
    modes = [m for m in MODES if m in set(t["mode"])]
    if not modes:
        return None
    peaks = meta.get("peaks") or {}
    fig, axes = figure(meta, "Rate reached against context (median over the other axes)", 1, len(modes),
                       size=(4.2, 4.0))
    for ax, mode in zip(axes[0], modes):
        rows = t[t["mode"] == mode]
        memory = _memory_bound(rows, mode, peaks)
        column, unit = ("tbps", "TB/s") if memory else ("tflops", "TFLOP/s")
        at = {c: i for i, c in enumerate(sorted(rows["context"].unique()))}  # evenly spaced: 0 and 32768 alike
        series = [Series(impl, f"{impl} [{backend}]", medians(g, g["context"].map(at), column),
                         BACKEND_STYLE.get(backend, "-"))
                  for impl, backend in _paths(rows) for g in [rows[(rows["impl"] == impl) & (rows["backend"] == backend)]]]
        contexts = list(at)
        bars = draw(ax, series, "context (keys before the queries)", show=lambda i: f"{int(contexts[int(i)])}")
        if peaks:
            side = 0 if memory else 1
            ceiling, measured = ceilings(peaks)[side], (peaks["copy_tbps"], peaks["bf16_matmul_tflops"])[side]
            ax.axhline(ceiling, color="black", lw=0.8, label=f"ceiling: {ceiling_parts(peaks, how=False)[side]}")
            attained = f"copy {measured:.2f} TB/s" if memory else f"matmul {measured:.0f} TFLOP/s"
            if measured != ceiling:
                ax.axhline(measured, color="black", ls="--", lw=0.8, label=f"attainable (measured): {attained}")
        ax.set(yscale="log", title=f"{mode} ({unit})", ylabel=unit)
        if not bars:
            ax.set(xticks=list(at.values()), xlim=(-0.5, len(at) - 0.5))
            ax.set_xticklabels([str(int(c)) for c in at], fontsize=7)
        ax.grid(alpha=0.3, which="both")
    legend_by_path(fig, axes)
    return fig


def bytes_read(table, meta):
    """DRAM bytes each counted call read (Nsight Compute) against the bytes its window needs, per step: on the
    diagonal a path reads what it must; the dotted lines are 10x and 100x that; one decade as long on both axes."""
    t = counted_points(table)
    modes = [m for m in MODES if m in set(t["mode"])]
    if not modes:
        return None
    fig, axes = figure(meta, "Bytes each path reads: DRAM read (Nsight Compute) against the bytes the window needs",
                       1, len(modes), size=(6.0, 4.6) if len(modes) == 1 else (4.2, 4.2))
    for ax, mode in zip(axes[0], modes):
        rows = t[t["mode"] == mode]
        for k, (impl, backend) in enumerate(_paths(rows)):
            g = rows[(rows["impl"] == impl) & (rows["backend"] == backend)]
            _points(ax, None, g["min_read_bytes"] / 1e6, g["dram_read_bytes"] / 1e6, impl, backend, k)
        lo = rows["min_read_bytes"].min() / 1e6 / 2
        top = max(rows["min_read_bytes"].max(), rows["dram_read_bytes"].max()) / 1e6 * 2
        for times, ls in ((1, "-"), (10, ":"), (100, ":")):  # one decade as long on both axes: true slopes
            ax.plot([lo, top / times], [lo * times, top], color="black", lw=0.7, ls=ls)
            ax.annotate(f"{times}x", (top / times, top), fontsize=7, ha="right", va="top")
        ax.set(xscale="log", yscale="log", xlim=(lo, top), ylim=(lo, top), aspect="equal", title=mode,
               xlabel="bytes the window needs (MB)", ylabel="DRAM bytes read (MB)")
        ax.grid(alpha=0.3, which="both")
    legend_by_path(fig, axes, backends="fill")
    return fig


FIGURES = {"roofline": roofline, "rate_vs_context": rate_vs_context, "bytes_read": bytes_read}
