"""The draft-tree figure, made from a run folder's table: per layer, each correct path's time on trees of each size
past the window, beside a chain of the same size through the slot rule (exact there) and the chain paths without a
custom mask.  Every path keeps its look (``style.look``); the chains' points are hollow and dashed; a layer timed at
one tree size is a bar per path (``marks.draw``)."""

from __future__ import annotations

from swabench.impls import registry
from swabench.publish.sections.trees import CHAIN_PATHS, is_chain, layer_of
from swabench.publish.marks import Series, draw, legend_by_path, medians, time_label, timed
from swabench.publish.style import figure


def tree_cost(table, meta):
    """Time against the tree's nodes (the kernel's on a GPU, host wall time on a CPU), one panel per layer (its model
    or heads, with or without sinks, and window), at the run's longest context and smallest page; a layer timed at
    one tree size is a bar per path."""
    if "tree" not in table or table["tree"].isna().all():
        return None
    measured = table["tree"].notna() & (table["status"] == "pass") & table["median_us"].notna()
    t = table[measured & (table["library"] == "flashinfer") & ((table["kind"] == "correct")
                                                           | (table["impl"] == "tree-window-slot"))]
    t = t[t["prefix_len"] == t["prefix_len"].max()]
    t = t[t["page_size"] == t["page_size"].min()].assign(layer=layer_of(t), chain=is_chain)
    t = t[t["chain"] == t["impl"].isin(CHAIN_PATHS)]  # the tree paths on trees, the chain paths on chains
    if t.empty or t["chain"].all():
        return None
    layers = list(dict.fromkeys(t["layer"]))
    fig, axes = figure(meta, f"Draft trees past the window ({int(t['prefix_len'].max())} keys, page size "
                             f"{int(t['page_size'].min())}): {timed(meta)} of each correct path on the tree, and of a "
                             f"chain of the same size (hollow, dashed)", 1, len(layers), size=(4.2, 3.6))
    for ax, layer in zip(axes[0], layers):
        rows = t[t["layer"] == layer]
        groups = sorted(rows.groupby(["impl", "chain"]), key=lambda kv: registry.order(kv[0][0]))
        series = [Series(impl, impl + (" (a chain)" if chain else ""), medians(g, "qo_len"), "--" if chain else "-",
                         hollow=chain) for (impl, chain), g in groups]
        sizes = sorted(rows["qo_len"].unique())
        if not draw(ax, series, "draft tokens (nodes)", show=lambda n: f"{int(n)}"):
            ax.set_xscale("log")
            ax.set_xticks(sizes, [str(int(s)) for s in sizes], fontsize=7)
            ax.minorticks_off()
        ax.set(yscale="log", title=_title(rows, t), ylabel=time_label(meta))
        ax.title.set_fontsize(9)
        ax.grid(alpha=0.3, which="both")
    from matplotlib.lines import Line2D

    chain = Line2D([], [], ls="--", marker="o", ms=4, color="#555555", mfc="none")
    legend_by_path(fig, axes, backends=None, keys=[(chain, "a chain of the same size (hollow, dashed)")], lines=True)
    return fig


def _title(rows, every) -> str:
    """A layer in words: its model (or heads), with or without sinks where the run has both, and its window."""
    first = rows.iloc[0]
    name = first["model"] if "model" in rows and first["model"] == first["model"] else \
        f"h{first['num_qo_heads']}/{first['num_kv_heads']} d{first['head_dim']}"
    same = every[every["model"] == first["model"]] if "model" in every else every
    both = same["sinks"].astype(str).str.lower().nunique() > 1
    sinks = str(first["sinks"]).lower() == "true"
    return f"{name}{(' with sinks' if sinks else ' without sinks') if both else ''}, window_left {first['window_left']}"


FIGURES = {"tree_cost": tree_cost}
