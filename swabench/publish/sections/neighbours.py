"""The attention beside a causal sliding window that engines also run: non-causal windows (where FlashInfer's
fa2 has flashinfer#4972) and chunked local attention (Llama 4), each gated like the window and held against it."""

from __future__ import annotations

import pandas as pd

from swabench.publish.markdown import library_versions
from swabench.publish.sections.base import Run, Section, of, path_of, points, ranged, ratio

TWIN = ["mode", "batch_size", "prefix_len", "seq_len", "num_qo_heads", "num_kv_heads", "head_dim", "storage",
        "page_size", "dtype", "kv_dtype", "logits_soft_cap", "sinks"]  # a step's shape, as far as the table has it
REFERENCE = ("paged-window", "fa2")


def _non_causal(run: Run) -> pd.DataFrame:
    """The correct paths' non-causal points."""
    t = run.table
    if "causal" not in t:
        return t.iloc[:0]
    t = t[t["causal"].astype(str).str.lower() == "false"]
    return t[t["kind"] == "correct"] if "kind" in t else t


def noncausal_table(run: Run) -> pd.DataFrame:
    """Per path: the non-causal points, how many passed, how many were wrong where flashinfer#4972 is declared
    (and right there), failed outside it, or skipped."""
    t = _non_causal(run)
    if t.empty:
        return pd.DataFrame()
    declared = t["upstream"].notna() if "upstream" in t else pd.Series(False, index=t.index)
    t = t.assign(path=path_of(t), declared=declared)
    rows = []
    for path, g in t.groupby("path", sort=False):
        ran = g[g["status"] != "skip"]
        rows.append({"release": library_versions(run.meta), "path": path, "points": len(ran),
                     "pass": int(((g["status"] == "pass") & ~g["declared"]).sum()),
                     "wrong where declared": int(((g["status"] == "xfail") & g["declared"]).sum()),
                     "right where declared": int(((g["status"] == "pass") & g["declared"]).sum()),
                     "fail": int((g["status"] == "fail").sum()), "skip": int((g["status"] == "skip").sum())})
    return pd.DataFrame(rows)


def noncausal_lead(run: Run) -> str:
    """Whether the correct paths pass the run's non-causal points, and where a declared bug makes them wrong;
    '' where the run has none."""
    table = noncausal_table(run)
    if table.empty:
        return ""
    bugs = sorted(set(_non_causal(run)["upstream"].dropna())) if "upstream" in run.table else []
    wrong = table[table["wrong where declared"] > 0]
    caught = ", ".join(f"`{p}` on {w} of {n}" for p, w, n in zip(wrong["path"], wrong["wrong where declared"],
                                                                   wrong["points"]))
    where = f"where {' and '.join(bugs)} is declared, each is wrong: {caught}" if len(wrong) else ""
    failed = table[table["fail"] > 0]
    if len(failed):
        n = int(failed["fail"].sum())
        return (f"{points(n)} of correct paths {'fails' if n == 1 else 'fail'} outside any declared bug ("
                + ", ".join(f"`{p}`" for p in failed["path"]) + ")" + (f"; {where}" if where else ""))
    return "every correct path passes its non-causal points" + (
        f", except {where}; no point fails outside it" if where else "")


def noncausal_said(run: Run) -> list[str]:
    lead = noncausal_lead(run)
    return [f"{library_versions(run.meta)}: {lead} ({run.name})."] if lead else []


def _chunked(run: Run) -> pd.DataFrame:
    t = run.table
    if "attention_chunk" not in t:
        return t.iloc[:0]
    return t[t["attention_chunk"].fillna(0) > 0]


def _window_twins(run: Run, chunked: pd.DataFrame) -> pd.DataFrame:
    """The reference path's time on the sliding window of the same keys (window C - 1), per step shape."""
    t = run.table
    reference = t[(t["impl"] == REFERENCE[0]) & (t["backend"] == REFERENCE[1]) & (t["status"] == "pass")
                  & (t["attention_chunk"].fillna(0) == 0)]
    chunks = set(chunked["attention_chunk"].astype(int))
    reference = reference[reference["window_left"].isin({c - 1 for c in chunks})]
    key = [c for c in TWIN if c in t] + ["attention_chunk"]
    reference = reference.assign(attention_chunk=reference["window_left"] + 1).fillna({c: -1 for c in key})
    return reference.groupby(key, dropna=False)["median_us"].median().reset_index()  # one time per step shape


def chunked_table(run: Run) -> pd.DataFrame:
    """Per chunked path: its points and statuses, and its time / the window path's on the same steps over a
    sliding window of the chunk's keys: median (best-worst, steps)."""
    t = _chunked(run)
    if t.empty:
        return pd.DataFrame()
    twins = _window_twins(run, t)
    key = [c for c in TWIN if c in t] + ["attention_chunk"]
    joined = t.assign(path=path_of(t)).fillna({c: -1 for c in key})
    joined = joined.merge(twins, on=key, how="left", suffixes=("", "_window"), validate="many_to_one")
    rows = []
    for (path, kind), g in joined.groupby(["path", "kind"], sort=False):
        timed = g[(g["status"] == "pass") & g["median_us"].notna() & g["median_us_window"].notna()]
        r = timed["median_us"] / timed["median_us_window"]
        rows.append({"path": path, "kind": kind, **{s: int((g["status"] == s).sum())
                                                    for s in ("pass", "xfail", "xpass", "fail", "skip")},
                     f"time / {REFERENCE[0]} [{REFERENCE[1]}] on the window of C keys":
                         f"{ratio(r.median())} ({ranged(r)}, {len(r)})" if len(r) else ""})
    return pd.DataFrame(rows)


def chunked_said(run: Run) -> list[str]:
    t = _chunked(run)
    if t.empty:
        return []
    chunks = ", ".join(str(c) for c in sorted(set(t["attention_chunk"].astype(int))))
    return [f"Chunk {chunks}, {library_versions(run.meta)} ({run.name}).", *chunked_findings(run)]


def chunked_leads(run: Run) -> list[str]:
    """What the gate found on the chunked points, each without its run: where the natural mistake was caught,
    whether the correct paths passed."""
    t = _chunked(run)
    if t.empty:
        return []
    said = []
    for impl, g in t[t["kind"] == "known-bug"].groupby("impl", sort=False):
        must = g["must_fail"].astype(str).str.lower() == "true"
        caught = int(((g["status"] == "xfail") & must).sum())
        exact = int((~must & (g["status"] == "pass")).sum())
        said.append(f"`{impl}` is wrong on {of(caught, int(must.sum()))} where a query sees keys before its "
                    f"chunk start" + (f", and exact on the {exact} where none does" if exact else "")
                    + f" ({int((g['status'] == 'xpass').sum())} not caught)")
    failed = t[(t["kind"] == "correct") & (t["status"] == "fail")]
    said.append(f"{len(failed)} points of the correct chunked paths fail" if len(failed) else
                "Every correct chunked path passes every point it ran")
    return said


def chunked_findings(run: Run) -> list[str]:
    return [f"{s} ({run.name})." for s in chunked_leads(run)]


TOPIC = "Beside the causal window: non-causal windows and chunked attention"

SECTIONS = [
    Section("noncausal", "Non-causal windows: where flashinfer#4972 shows",
            "Non-causal points (a query at position p sees every key of its request from p - W on), per path: "
            "points run, passed, wrong where a declared upstream bug predicts it (fa2's split-KV schedule, "
            "flashinfer#4972), right where it was declared, failed outside any declared bug, and skipped; every "
            "release given.", noncausal_table, noncausal_said, one_table=True, every_release=True),
    Section("chunked", "Chunked local attention: the chunk paths, the natural mistake, and the cost against a window",
            "Chunked points (a query sees its own chunk of C keys, causally), per path: statuses, and the time / the "
            "window path's (paged-window on fa2) on the same step over a sliding window of the chunk's keys "
            "(W = C - 1), the twin a chunked scenario runs beside it: under 1 where a query is early in its chunk, "
            "1 at its end.  The report's sawtooth figure draws it against context.", chunked_table, chunked_said),
]
