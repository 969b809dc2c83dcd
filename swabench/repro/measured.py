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


def rows(runs, paths: dict[str, str], case=None) -> list[dict]:
    """The gated points of each path of ``paths`` (implementation: what a reader calls it) in each run folder of
    ``runs``, with where they ran, on ``case`` alone where one is given (a script that times one shape); UserError
    naming a folder that holds none."""
    found = []
    for run in runs:
        table, meta = run_folder.load(run)
        cases = {p.case.case_id: p.case for p in scenarios.load(f"{run}/{schema.SCENARIO}").points}
        mine = table[table["impl"].isin(list(paths)) & table["status"].isin(GATED)] if "impl" in table else \
            table.iloc[0:0]
        mine = mine if case is None else mine[mine["case_id"] == case.case_id]
        where = f"flashinfer {(meta.get('libraries') or {}).get('flashinfer') or '?'}, {meta.get('gpu', '?')}"
        before = len(found)
        for row in mine.itertuples():
            case = cases.get(row.case_id)
            if case is not None and registry.get(row.impl).skip_reason(case, row.backend, None) is None:
                found.append({"case": case, "path": paths[row.impl], "backend": row.backend,
                              "wrong_rows": row.wrong_rows, "rows": row.total_qo, "rel_l2": row.rel_l2, "where": where,
                              "read": getattr(row, "dram_read_bytes", None), "needed": row.min_read_bytes})
        if len(found) == before:
            at = f" on the script's case {case.label} ({case.case_id})" if case is not None else ""
            raise UserError(f"--measured {run}: no gated point of {', '.join(paths)} that it serves now{at}")
    return found


def table(found: list[dict], one_case: bool = False) -> list[str]:
    """A sentence and the Markdown table of ``rows``, one line per model, length and draft (its page sizes together
    where they agree, and the drafts of one length that measured alike: 'chain of 8; tree of 8 nodes, depth 2'), in
    FlashInfer's terms, each path's lines by context then draft; the bytes each path read where the run counted them
    (ncu), else its rows.  What is the same on every line is said once, in the sentence (``one_case``: the rows are
    at the script's own shape)."""
    counted = any(r["read"] == r["read"] and r["read"] is not None for r in found)
    measures = ["DRAM bytes read", "of the window's"] if counted else ["rows wrong", "rel-L2"]
    grouped: dict[tuple, tuple[dict, list[dict]]] = {}
    for r in found:
        c = r["case"]
        line = {"call": r["path"], "backend": r["backend"], "model": c.model or "-", "batch": c.batch_size,
                "kv_len": (c.prefix_len or 0) + c.qo_len, "queries": _draft(c), "window_left": c.window_left,
                "page_size": None, "heads (query/KV)": f"{c.num_qo_heads}/{c.num_kv_heads}", "head_dim": c.head_dim,
                "ran on": r["where"]}
        line |= ({measures[0]: f"{r['read'] / 1e6:,.1f} MB", measures[1]: f"{r['read'] / r['needed']:.1f}x"}
                 if counted else {measures[0]: f"{int(r['wrong_rows'])} of {int(r['rows'])}"})
        grouped.setdefault(tuple(line.values()), (line, []))[1].append(r)
    first = {call: i for i, call in enumerate(dict.fromkeys(line["call"] for line, _ in grouped.values()))}

    def order(kept):  # each path's lines by backend, model, batch, context, draft size, then a chain before a tree
        line, same = kept
        return (first[line["call"]], line["backend"], line["model"], line["batch"], line["kv_len"],
                same[0]["case"].qo_len, line["queries"].startswith("tree"))

    drafts: dict[tuple, tuple[dict, list[str], list[dict]]] = {}  # the drafts of one length that measured alike
    for line, same in sorted(grouped.values(), key=order):
        alike = tuple(v for k, v in line.items() if k != "queries")
        drafts.setdefault(alike, (line, [], []))[1].append(line["queries"])
        drafts[alike][2].extend(same)
    lines = []
    for line, queries, same in drafts.values():
        errors = [f"{e:.3g}" for e in sorted(r["rel_l2"] for r in same)]
        line = {**line, "queries": "; ".join(queries),
                "page_size": ", ".join(str(p) for p in sorted({r["case"].page_size for r in same}))}
        lines.append(line if counted else {**line, "rel-L2": "-".join(dict.fromkeys([errors[0], errors[-1]]))})
    constant = [k for k in lines[0] if k not in measures and len({str(line[k]) for line in lines}) == 1]
    shown = [k for k in lines[0] if k not in constant]
    every = "; ".join(f"{k} {lines[0][k]}" for k in constant if lines[0][k] not in ("-", "the call"))
    calls = "call" if len({line["call"] for line in lines}) == 1 else "calls"
    where = ("counted by Nsight Compute" if counted else "measured") + (" at this shape" if one_case else
                                                                         " at other shapes")
    lead = f"The same {calls} {where}" + (f" (on every line: {every})" if every else "") + ":"
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
