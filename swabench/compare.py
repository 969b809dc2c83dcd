"""Compare two runs point by point: ratio of medians, and a Mann-Whitney U test on the raw samples.

A point is a regression only when both hold: the new median is slower by more than the threshold,
and the samples differ significantly (two-sided p < alpha).  A correct implementation that passed
in BASE and fails the gate in NEW is a regression whatever its timing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from . import results
from .report import environment_line, markdown_table

KEY = list(results.KEY)


class CompareError(ValueError):
    pass


def mann_whitney_u(x, y) -> tuple[float, float]:
    """(U of x, two-sided p) with average ranks for ties, tie-corrected normal approximation and
    continuity correction (scipy's ``method="asymptotic"``)."""
    n1, n2 = len(x), len(y)
    pooled = sorted([(v, 0) for v in x] + [(v, 1) for v in y])
    ranks, ties, i = [0.0] * len(pooled), 0.0, 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1
        t = j - i + 1
        ties += t ** 3 - t
        i = j + 1
    u1 = sum(r for r, (_, side) in zip(ranks, pooled) if side == 0) - n1 * (n1 + 1) / 2
    n = n1 + n2
    sigma = math.sqrt(n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))))
    if sigma == 0:
        return u1, 1.0
    z = (abs(u1 - n1 * n2 / 2) - 0.5) / sigma
    return u1, min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))


def _kernel_samples(folder: Path) -> dict:
    s = pd.read_csv(folder / results.SAMPLES)
    s = s[s["kind"] == "kernel"]
    return {key: g["value_us"].tolist() for key, g in s.groupby(KEY)}


def compare(base: Path, new: Path, threshold: float = 0.05, alpha: float = 0.01,
            allow_different_gpus: bool = False) -> tuple[pd.DataFrame, dict, dict]:
    base, new = Path(base), Path(new)
    (bt, bm), (nt, nm) = results.load(base), results.load(new)
    if bm.get("gpu") != nm.get("gpu") and not allow_different_gpus:
        raise CompareError(f"BASE ran on {bm.get('gpu') or 'a CPU'} and NEW on {nm.get('gpu') or 'a CPU'}; "
                           f"timings from different devices are not comparable (--allow-different-gpus to insist)")
    bs, ns = _kernel_samples(base), _kernel_samples(new)
    for t in (bt, nt):
        if "median_us" not in t:
            t["median_us"] = float("nan")
    joined = bt.merge(nt, on=KEY, how="outer", suffixes=("_base", "_new"), indicator="side")
    rows = []
    for r in joined.to_dict("records"):
        key = tuple(r[k] for k in KEY)
        row = {"case_id": key[0], "case": r["case_base"] if isinstance(r["case_base"], str) else r["case_new"],
               "impl": key[1], "backend": key[2], "status_base": r["status_base"], "status_new": r["status_new"],
               "base_us": r["median_us_base"], "new_us": r["median_us_new"]}
        row["ratio"] = row["new_us"] / row["base_us"]
        row["p"] = mann_whitney_u(bs[key], ns[key])[1] if key in bs and key in ns else float("nan")
        row["verdict"] = _verdict(row, threshold, alpha, r["side"])
        rows.append(row)
    order = {"regression": 0, "improvement": 1, "status changed": 2, "only in one run": 3, "same": 4}
    table = pd.DataFrame(rows)
    table = table.assign(_o=table["verdict"].map(order), _r=-table["ratio"].fillna(0)) \
        .sort_values(["_o", "_r"]).drop(columns=["_o", "_r"]).reset_index(drop=True)
    return table, bm, nm


def _verdict(row: dict, threshold: float, alpha: float, merge: str) -> str:
    if merge != "both":
        return "only in one run"
    if row["status_base"] == "pass" and row["status_new"] == "fail":
        return "regression"
    if row["status_base"] != row["status_new"]:
        return "status changed"
    if not row["p"] < alpha:
        return "same"
    if row["ratio"] > 1 + threshold:
        return "regression"
    if row["ratio"] < 1 - threshold:
        return "improvement"
    return "same"


def to_markdown(table: pd.DataFrame, base_meta: dict, new_meta: dict, threshold: float, alpha: float) -> str:
    counts = table["verdict"].value_counts().to_dict()
    head = (f"BASE: {environment_line(base_meta)}\n\nNEW: {environment_line(new_meta)}\n\n"
            f"{len(table)} points; a regression or improvement needs |ratio - 1| > {threshold:g} and "
            f"Mann-Whitney p < {alpha:g}: " + ", ".join(f"{v} {k}" for k, v in counts.items()) + "\n\n")
    shown = table[table["verdict"] != "same"]
    cols = ["verdict", "case", "impl", "backend", "base_us", "new_us", "ratio", "p", "status_base", "status_new"]
    return head + (markdown_table(shown[cols]) if len(shown) else "No significant differences.")


def to_json(table: pd.DataFrame) -> str:
    return json.dumps(json.loads(table.to_json(orient="records")), indent=1)
