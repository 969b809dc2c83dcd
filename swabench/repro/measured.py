"""What the suite measured of a bug in published run folders, as the table an issue comment quotes: each gated
point of the bug's paths, said in FlashInfer's terms (context, draft, page size), its wrong rows and its error or,
counted under ncu, the bytes it read against what its window needs, with the GPU and the release that ran it.
Only points the path serves now are kept (a path that skips a model today says so, and its old rows
would argue for a case the engine never runs)."""

from __future__ import annotations

from swabench.core import trees
from swabench.errors import UserError
from swabench.impls import registry
from swabench.inputs import scenarios
from swabench.store import run_folder, schema

GATED = ("pass", "xfail", "fail", "xpass")


def rows(runs, paths: dict[str, str]) -> list[dict]:
    """The gated points of each path of ``paths`` (implementation: what a reader calls it) in each run folder of
    ``runs``, with where they ran; UserError naming a folder that holds none."""
    found = []
    for run in runs:
        table, meta = run_folder.load(run)
        cases = {p.case.case_id: p.case for p in scenarios.load(f"{run}/{schema.SCENARIO}").points}
        mine = table[table["impl"].isin(list(paths)) & table["status"].isin(GATED)] if "impl" in table else \
            table.iloc[0:0]
        where = f"flashinfer {(meta.get('libraries') or {}).get('flashinfer') or '?'}, {meta.get('gpu', '?')}"
        before = len(found)
        for row in mine.itertuples():
            case = cases.get(row.case_id)
            if case is not None and registry.get(row.impl).skip_reason(case, row.backend, None) is None:
                found.append({"case": case, "path": paths[row.impl], "backend": row.backend, "wrong_rows": row.wrong_rows,
                              "rows": row.total_qo, "rel_l2": row.rel_l2, "where": where,
                              "read": getattr(row, "dram_read_bytes", None), "needed": row.min_read_bytes})
        if len(found) == before:
            raise UserError(f"--measured {run}: no gated point of {', '.join(paths)} that it serves now")
    return found


def table(found: list[dict]) -> list[str]:
    """A sentence and the Markdown table of ``rows``, one line per model, length and draft (its page sizes together
    where they agree), in FlashInfer's terms, each path's lines by context then draft; the bytes each path read where
    the run counted them (ncu), else its rows.  What is the same on every line is said once, in the sentence."""
    counted = any(r["read"] == r["read"] and r["read"] is not None for r in found)
    grouped: dict[tuple, list[dict]] = {}
    for r in found:
        c = r["case"]
        said = (f"{r['read'] / 1e6:,.1f} MB", f"{r['read'] / r['needed']:.1f}x") if counted else \
            (f"{int(r['wrong_rows'])} of {int(r['rows'])}",)
        grouped.setdefault((r["path"], r["backend"], c.model or "-", c.batch_size, (c.prefix_len or 0) + c.qo_len, _draft(c),
                            c.window_left, f"{c.num_qo_heads}/{c.num_kv_heads}", c.head_dim, r["where"], said),
                           []).append(r)
    first = {path: i for i, path in enumerate(dict.fromkeys(key[0] for key in grouped))}  # paths as given

    def order(key):  # each path's lines by backend, model, batch, context, draft size, then a chain before a tree
        case = grouped[key][0]["case"]
        return first[key[0]], key[1], key[2], key[3], key[4], case.qo_len, key[5].startswith("tree")

    lines = []
    for key in sorted(grouped, key=order):
        path, backend, model, batch, kv, draft, window, heads, head_dim, where, said = key
        same = grouped[key]
        errors = sorted(r["rel_l2"] for r in same)
        error = f"{errors[0]:.3g}" + (f"-{errors[-1]:.3g}" if f"{errors[-1]:.3g}" != f"{errors[0]:.3g}" else "")
        lines.append({"call": path, "backend": backend, "model": model, "batch": batch, "kv_len": kv, "queries": draft,
                      "window_left": window, "page_size": ", ".join(str(p) for p in sorted({r["case"].page_size
                                                                                           for r in same})),
                      "heads (query/KV)": heads, "head_dim": head_dim, "ran on": where,
                      **(dict(zip(("DRAM bytes read", "of the window's"), said)) if counted else
                         {"rows wrong": said[0], "rel-L2": error})})
    measures = ["DRAM bytes read", "of the window's"] if counted else ["rows wrong", "rel-L2"]
    constant = [k for k in lines[0] if k not in measures and len({str(line[k]) for line in lines}) == 1]
    shown = [k for k in lines[0] if k not in constant]
    every = "; ".join(f"{k} {lines[0][k]}" for k in constant if lines[0][k] not in ("-", "the call"))
    calls = "call" if len({line["call"] for line in lines}) == 1 else "calls"
    lead = f"The same {calls} measured at other shapes" + (f" (on every line: {every})" if every else "") + ":"
    return [lead, "", "| " + " | ".join(shown) + " |", "| --- " * len(shown) + "|",
            *("| " + " | ".join(str(line[k]) for k in shown) + " |" for line in lines)]


def _draft(case) -> str:
    """A step's queries: 'chain of 16', 'tree of 16 nodes, depth 3', or '16 tokens' ('1 token': decode)."""
    drafts = trees.of_case(case)
    if not drafts:
        return f"{case.qo_len} token" + ("s" if case.qo_len > 1 else "")
    tree = drafts[0]
    return f"chain of {tree.size}" if max(tree.depths) == tree.size - 1 else \
        f"tree of {tree.size} nodes, depth {max(tree.depths)}"
