"""How the figures draw a path's points: its line, or a bar per path where a panel has one x value (a line of one
point shows no trend); the noisy points ringed in grey; the time axis named for what was timed (the kernel on a GPU,
host wall time on a CPU); and one legend by path, with a key for what line styles, fills and rings mean."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from swabench.impls import registry
from swabench.publish.sections.base import NOISE
from swabench.publish.style import BACKEND_STYLE, look

NOISY = f"noisy: IQR / median above {NOISE:.0%} (grey ring)"
RING = {"marker": "o", "s": 80, "facecolors": "none", "edgecolors": "#888888", "linewidths": 1.2, "zorder": 1}
FILL = {"fa3": "hollow", "auto": "pale"}  # a point's face by backend in the scatter figures; solid elsewhere
PATH_LABEL = re.compile(r"(?P<impl>\S+)(?: \[(?P<backend>[^\]]+)\])?")


def on_cpu(meta: dict) -> bool:
    """Whether the run timed on the CPU (its meta names no GPU), where a time is host wall time, not a kernel's."""
    return not meta.get("gpu")


def timed(meta: dict) -> str:
    """What a time of this run is: 'kernel time' on a GPU, 'host wall time' on a CPU."""
    return "host wall time" if on_cpu(meta) else "kernel time"


def time_label(meta: dict) -> str:
    return f"{timed(meta)} (us)"


def noisy(rows: pd.DataFrame) -> pd.Series:
    """Whether each timed row's noise (IQR / median) is above the suite's bar, NOISE."""
    if "noise" not in rows:
        return pd.Series(False, index=rows.index)
    return pd.to_numeric(rows["noise"], errors="coerce").gt(NOISE)


def medians(rows: pd.DataFrame, x, value: str = "median_us") -> pd.DataFrame:
    """Per value of ``x`` (a column, or a Series beside the rows): the median of ``value`` over the rows (``y``) and
    whether any row behind it is noisy (``noisy``)."""
    keys = rows[x] if isinstance(x, str) else x
    grouped = rows.assign(_noisy=noisy(rows)).groupby(keys)
    return pd.DataFrame({"y": grouped[value].median(), "noisy": grouped["_noisy"].any()})


def ring(ax, xs, ys, flags) -> None:
    """A grey ring around each flagged point, behind it, labelled NOISY once per panel."""
    picked = [(x, y) for x, y, flag in zip(xs, ys, flags) if flag and y == y]
    if picked:
        ax.scatter(*zip(*picked), label=NOISY, **RING)


@dataclass
class Series:
    """One path's line on a panel: its points (index x; columns y and noisy), label and how it is drawn."""
    impl: str
    label: str
    points: pd.DataFrame
    style: str = "-"
    hollow: bool = False


def draw(ax, series: list[Series], xname: str, show=lambda x: f"{x:g}", log: bool = True) -> bool:
    """Each series as a line in its path's look, noisy points ringed; where the panel has one x value, a bar per
    series instead (white where the series is hollow), labelled below with the series' label, which names its backend,
    and ``xname``: that value as the axis label; on a log y axis (``log``) the bars rise from a floor below the
    lowest, else from 0.  Returns whether bars were drawn (the caller then leaves the x axis as it is)."""
    series = [s for s in series if len(s.points)]
    xs = sorted({x for s in series for x in s.points.index})
    if len(xs) == 1:
        _bars(ax, series, f"{xname}: {show(xs[0])}", log)
        return True
    for s in series:
        style = look(s.impl)
        ax.plot(s.points.index, s.points["y"], s.style, ms=3, mfc="none" if s.hollow else style["color"],
                label=s.label, **style)
        ring(ax, s.points.index, s.points["y"], s.points["noisy"])
    ax.set_xlabel(xname, fontsize=8)
    return False


def _bars(ax, series: list[Series], xlabel: str, log: bool) -> None:
    series = sorted(series, key=lambda s: (registry.order(s.impl), s.label))
    heights = [float(s.points["y"].iloc[0]) for s in series]
    floor = min(heights) / 3 if log else 0.0  # a log axis has no zero: every bar rises from one floor below the lowest
    for i, (s, height) in enumerate(zip(series, heights)):
        colour = look(s.impl)["color"]
        ax.bar(i, height - floor, 0.7, bottom=floor, color="white" if s.hollow else colour, edgecolor=colour,
               label=s.label)
        ring(ax, [i], [height], [bool(s.points["noisy"].iloc[0])])
    ax.set_xticks(range(len(series)), [s.label for s in series], rotation=40, ha="right", fontsize=6)
    ax.set_xlabel(xlabel, fontsize=8)


def _header(text: str):
    from matplotlib.lines import Line2D

    return Line2D([], [], ls="none"), text


def legend_by_path(fig, axes, backends: str | None = "line", keys: list | None = None, lines: bool | None = None) -> None:
    """One legend beside the panels: a path per entry (its colour and marker, in registry order; on a line unless the
    figure draws points alone: ``lines``, by default whether backends are told apart by line), then a key: the
    backends by line style (``backends="line"``) or by fill (``"fill"``), the caller's ``keys`` (handle, label),
    and what else the panels label (failed and skipped points, noisy rings, ceilings)."""
    from matplotlib.lines import Line2D

    paths, seen, other = {}, {}, {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            m = PATH_LABEL.match(label)
            if m and registry.known(m["impl"]):
                paths.setdefault(m["impl"], look(m["impl"]))
                if m["backend"]:
                    seen.setdefault(m["backend"], None)
            else:
                other.setdefault(label, handle)
    if not paths and not other:
        return
    style = "-" if (backends == "line" if lines is None else lines) else "none"
    entries = [_header("path")] + [(Line2D([], [], ls=style, ms=4, **st), impl) for impl, st in
                                   sorted(paths.items(), key=lambda kv: registry.order(kv[0]))]
    key = _backend_key(list(seen), backends) + list(keys or []) + [(h, label) for label, h in other.items()]
    if key:
        entries += [_header("key")] + key
    legend = fig.legend(*zip(*entries), fontsize=6, loc="outside right center", ncol=2 if len(entries) > 22 else 1)
    for text in legend.get_texts():
        if text.get_text() in ("path", "key"):
            text.set_fontweight("bold")


def _backend_key(backends: list[str], how: str | None) -> list:
    """The backends grouped by how they are drawn: a grey line per line style, or a grey mark per fill."""
    from matplotlib.lines import Line2D

    if how is None or not backends:
        return []
    drawn = BACKEND_STYLE if how == "line" else FILL
    groups: dict[str, list[str]] = {}
    for b in backends:
        groups.setdefault(drawn.get(b, "-" if how == "line" else "solid"), []).append(b)
    if how == "line":
        return [(Line2D([], [], ls=ls, color="#555555"), ", ".join(names)) for ls, names in groups.items()]
    faces = {"solid": "#555555", "hollow": "none", "pale": "#BBBBBB"}
    return [(Line2D([], [], ls="none", marker="o", color="#555555", mfc=faces[fill]), f"{', '.join(names)} ({fill})")
            for fill, names in groups.items()]


def face(colour: str, backend: str) -> str:
    """A scatter point's face on ``backend`` (FILL): hollow on fa3, pale on auto (the library's pick between the two),
    ``colour`` elsewhere."""
    from matplotlib.colors import to_hex, to_rgb

    fill = FILL.get(backend, "solid")
    if fill == "hollow":
        return "none"
    return to_hex(tuple(0.35 * c + 0.65 for c in to_rgb(colour))) if fill == "pale" else colour
