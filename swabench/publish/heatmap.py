"""The speedup heatmap, made from a run folder's table: the headline paths' speedup over their library's custom-mask
baseline, a panel per step with a row per window and a column per path (the cells of the speed page's headline), and
where the run times the same shapes at several page sizes, a panel per step that does, with a column per path and
page size."""

from __future__ import annotations

import matplotlib.ticker
import numpy as np
import pandas as pd

from swabench.analysis.versus import headline_paths
from swabench.core.cases import MODES
from swabench.impls import registry
from swabench.publish.marks import noisy
from swabench.publish.style import figure

SHAPE = ("mode", "batch_size", "prefix_len", "seq_len", "qo_len", "accept", "length_dist", "sliding_window",
         "num_qo_heads", "num_kv_heads", "head_dim", "dtype")  # a case's shape, less its page size
TICKS = (0.5, 1, 2, 5, 10, 20, 50, 100, 200)  # the colour bar's labels, those within the run's range


def _speedups(table: pd.DataFrame) -> pd.DataFrame:
    from swabench.publish.plots import timed_rows

    t = headline_paths(timed_rows(table))
    if t.empty:
        return t
    t = t[(t["storage"] == "paged") & (t["page_layout"] == "scattered")].dropna(subset=["speedup_vs_mask"])
    return t.assign(_noisy=noisy(t))


def _paged_sweeps(t: pd.DataFrame) -> pd.DataFrame:
    """The points of the shapes a path was timed on at several page sizes, so each cell of a step's page-size panel
    holds the same cases."""
    shape = ["impl", *(c for c in SHAPE if c in t)]
    return t[t.groupby(shape, dropna=False)["page_size"].transform("nunique") > 1]


def speedup_heatmap(table, meta):
    """The headline paths' speedup over their library's custom-mask baseline (the median over a cell's cases), a
    panel per step: a row per window, a column per path, at the page size most points use (the speed page's headline
    cells); below, where the run times the same shapes at several page sizes, a column per path and page size on each
    step that does.  One colour scale (log) for every panel; * marks a cell with a noisy point."""
    t = _speedups(table)
    if t.empty:
        return None
    page = t["page_size"].mode().iloc[0]
    at_page, sweeps = t[t["page_size"] == page], _paged_sweeps(t)
    steps = [m for m in MODES if m in set(at_page["mode"])]
    swept = [m for m in MODES if m in set(sweeps["mode"])]
    top = [(f"{step}, page size {int(page)}", _grid(at_page[at_page["mode"] == step], ["impl"])) for step in steps]
    below = [(f"{step}, by page size ({_shapes(sweeps[sweeps['mode'] == step])} timed at each)",
              _grid(sweeps[sweeps["mode"] == step], ["impl", "page_size"])) for step in swept]
    values = np.concatenate([grid.values.ravel() for _, (grid, _) in top + below])
    norm = _norm(values[values == values])
    baseline = registry.baseline_for(t["library"].iloc[0], "paged")
    ncols = max(len(top), len(below))
    widths = [max(panels[j][1][0].shape[1] if j < len(panels) else 1 for panels in (top, below)) + 1
              for j in range(ncols)]  # a panel as wide as its columns, the figure as wide as them all
    inches = 0.42 * sum(widths) + 0.9 * ncols + 1.2
    fig, axes = figure(meta, f"Speedup over {baseline} per step ({t['backend'].iloc[0]}, scattered pages; * a cell "
                             f"with a noisy point)", 2 if below else 1, ncols, size=(inches / ncols ** 0.8, 3.6),
                       gridspec_kw={"width_ratios": widths})
    for row, panels in zip(axes, (top, below)):
        for k, (ax, (title, (grid, flags))) in enumerate(zip(row, panels)):
            image = _cells(ax, grid, flags, norm)
            ax.set_title(title, fontsize=9)
            if k == 0:
                ax.set_ylabel("sliding window (keys)")
        for ax in row[len(panels):]:
            fig.delaxes(ax)
    bar = fig.colorbar(image, ax=fig.axes, shrink=0.8, label="speedup (x)")
    bar.set_ticks([v for v in TICKS if norm.vmin <= v <= norm.vmax], labels=None)
    bar.ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%gx"))
    bar.ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    return fig


def _shapes(rows: pd.DataFrame) -> str:
    n = len(rows.drop_duplicates([c for c in SHAPE if c in rows]))
    return f"{n} shape" + ("s" if n > 1 else "")


def _grid(rows: pd.DataFrame, columns: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The median speedup per window (rows) and ``columns`` (paths in registry order), and whether a cell's points
    include a noisy one."""
    grid = rows.pivot_table(index="sliding_window", columns=columns, values="speedup_vs_mask", aggfunc="median")
    flags = rows.pivot_table(index="sliding_window", columns=columns, values="_noisy", aggfunc="any")
    order = sorted(grid.columns, key=lambda c: (registry.order(c[0] if isinstance(c, tuple) else c), c))
    return grid[order], flags.reindex_like(grid[order]).fillna(False).astype(bool)


def _norm(values: np.ndarray):
    from matplotlib.colors import LogNorm

    lo, hi = float(values.min()), float(values.max())
    return LogNorm(lo, hi if hi > lo else lo * 1.01)


def _label(column) -> str:
    if isinstance(column, tuple):
        return f"{column[0]} ps{int(column[1])}"
    return str(column)


def _cells(ax, grid: pd.DataFrame, flags: pd.DataFrame, norm):
    image = ax.imshow(grid.values, cmap="cividis", norm=norm, aspect="auto", origin="lower")
    for (r, c), v in np.ndenumerate(grid.values):
        if v == v:
            ax.text(c, r, (f"{v:.0f}x" if v >= 10 else f"{v:.1f}x") + ("*" if flags.values[r, c] else ""),
                    ha="center", va="center", fontsize=7, color="white" if norm(v) < 0.5 else "black")
    ax.set_xticks(range(grid.shape[1]), [_label(c) for c in grid.columns], rotation=30, ha="right", fontsize=7)
    ax.set_yticks(range(grid.shape[0]), [f"{int(w)}" if w >= 0 else "chunked" for w in grid.index], fontsize=7)
    return image
