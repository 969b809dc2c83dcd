"""The draft-tree figure, made from a run folder's table: per layer, each correct path's time on trees of each size
past the window, beside a chain of the same size through the slot rule (exact there) and the chain paths without a
custom mask.  Every path keeps its look (``style.look``); the chains' points are hollow and dashed."""

from __future__ import annotations

from swabench.impls import registry
from swabench.publish.sections.trees import CHAIN_PATHS, is_chain, layer_of
from swabench.publish.style import figure, legend_outside, look


def tree_cost(table, meta):
    """Kernel time against the tree's nodes, one panel per layer, at the run's longest context and smallest page."""
    if "tree" not in table or table["tree"].isna().all():
        return None
    timed = table["tree"].notna() & (table["status"] == "pass") & table["median_us"].notna()
    t = table[timed & (table["library"] == "flashinfer") & ((table["kind"] == "correct")
                                                           | (table["impl"] == "tree-window-slot"))]
    t = t[t["prefix_len"] == t["prefix_len"].max()]
    t = t[t["page_size"] == t["page_size"].min()].assign(layer=layer_of(t), chain=is_chain)
    t = t[t["chain"] == t["impl"].isin(CHAIN_PATHS)]  # the tree paths on trees, the chain paths on chains
    if t.empty or t["chain"].all():
        return None
    layers = list(dict.fromkeys(t["layer"]))
    fig, axes = figure(meta, f"Draft trees past the window ({int(t['prefix_len'].max())} keys, page size "
                             f"{int(t['page_size'].min())}): each correct path on the tree, and a chain of the same "
                             f"size (hollow, dashed)", 1, len(layers), size=(4.2, 3.6))
    for ax, layer in zip(axes[0], layers):
        rows = t[t["layer"] == layer]
        sizes = sorted(rows["qo_len"].unique())
        for (impl, chain), g in sorted(rows.groupby(["impl", "chain"]), key=lambda kv: registry.order(kv[0][0])):
            line = g.groupby("qo_len")["median_us"].median()
            style = look(impl)
            ax.plot(line.index, line.values, "--" if chain else "-", marker=style["marker"], color=style["color"],
                    mfc="none" if chain else style["color"], ms=4, lw=1, label=impl + (" (a chain)" if chain else ""))
        ax.set(xscale="log", yscale="log", title=layer, xlabel="draft tokens (nodes)", ylabel="kernel time (us)")
        ax.set_xticks(sizes, [str(int(s)) for s in sizes], fontsize=7)
        ax.minorticks_off()
        ax.grid(alpha=0.3, which="both")
    legend_outside(fig, axes)
    return fig


FIGURES = {"tree_cost": tree_cost}
