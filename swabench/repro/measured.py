"""What the suite measured of a bug in published run folders, as the table an issue comment quotes: each gated
point of the bug's path, said in FlashInfer's terms (context, draft, page size), its wrong rows and its error,
with the GPU and the release that ran it.  Only points the path serves now are kept (a path that skips a model
today says so, and its old rows would argue for a case the engine never runs)."""

from __future__ import annotations

from swabench.core import trees
from swabench.errors import UserError
from swabench.impls import registry
from swabench.inputs import scenarios
from swabench.store import run_folder, schema

GATED = ("pass", "xfail", "fail", "xpass")


def rows(runs, impl: str) -> list[dict]:
    """The gated points of ``impl`` in each run folder of ``runs``, with where they ran; UserError naming a folder
    that holds none."""
    path, found = registry.get(impl), []
    for run in runs:
        table, meta = run_folder.load(run)
        cases = {p.case.case_id: p.case for p in scenarios.load(f"{run}/{schema.SCENARIO}").points}
        mine = table[(table["impl"] == impl) & table["status"].isin(GATED)] if "impl" in table else table.iloc[0:0]
        where = f"flashinfer {(meta.get('libraries') or {}).get('flashinfer') or '?'}, {meta.get('gpu', '?')}"
        for row in mine.itertuples():
            case = cases.get(row.case_id)
            if case is not None and path.skip_reason(case, row.backend, None) is None:
                found.append({"case": case, "status": row.status, "wrong_rows": row.wrong_rows,
                              "rows": row.total_qo, "rel_l2": row.rel_l2, "where": where})
        if not any(r["where"] == where for r in found):
            raise UserError(f"--measured {run}: no gated point of {impl} that it serves now")
    return found


def table(found: list[dict]) -> list[str]:
    """The Markdown table of ``rows``, one line per model, length and draft (its page sizes together where they
    agree), in FlashInfer's terms."""
    grouped: dict[tuple, list[dict]] = {}
    for r in found:
        c = r["case"]
        grouped.setdefault((c.model or "-", (c.prefix_len or 0) + c.qo_len, _draft(c), c.window_left, r["where"],
                            r["wrong_rows"], r["rows"]), []).append(r)
    lines = ["| model | kv_len | draft | window_left | page_size | rows wrong | rel-L2 | ran on |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (model, kv, draft, window, where, wrong, total), same in grouped.items():
        pages = ", ".join(str(p) for p in sorted({r["case"].page_size for r in same}))
        errors = sorted(r["rel_l2"] for r in same)
        error = f"{errors[0]:.3g}" + (f"-{errors[-1]:.3g}" if f"{errors[-1]:.3g}" != f"{errors[0]:.3g}" else "")
        lines.append(f"| {model} | {kv} | {draft} | {window} | {pages} | {int(wrong)} of {int(total)} | {error} | "
                     f"{where} |")
    return lines


def _draft(case) -> str:
    """A verify step's draft: 'chain of 16', 'tree of 16 nodes, depth 3', or '16 tokens'."""
    drafts = trees.of_case(case)
    if not drafts:
        return f"{case.qo_len} tokens"
    tree = drafts[0]
    return f"chain of {tree.size}" if max(tree.depths) == tree.size - 1 else \
        f"tree of {tree.size} nodes, depth {max(tree.depths)}"
