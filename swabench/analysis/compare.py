"""Compare two runs point by point: ratio of medians, each point's own noise, and a Mann-Whitney U
test on the raw samples.

A point's noise is its IQR / median (the ``noise`` column, or computed from its kernel samples).  The
rule, per point timed in both runs:

- too noisy: either run's noise is above the threshold, so a change of the threshold's size cannot
  be told from the spread of the samples; never a regression (raise ``--threshold`` to judge it);
- same: |ratio - 1| <= max(threshold, the two points' combined noise sqrt(noise_base² + noise_new²)),
  or the samples do not differ significantly (two-sided p >= alpha);
- regression / improvement: slower / faster beyond that, with p < alpha;
- cannot judge: a median of 0 in either run (no ratio to take).

A correct implementation that passed in BASE and fails the gate in NEW is a regression whatever its
timing.

Runs are read with ``run_folder.read_rows`` (the journal when the folder has one, else results.csv and
samples.csv.gz), so an interrupted run compares too.  Anything that makes a comparison impossible is a
``CompareError`` naming the folder and what is wrong with it; things a reader should know but that
do not stop the comparison (different scenarios, an unfinished run, a run that timed nothing) are
``Comparison.warnings``.  No plotting library is imported here.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from swabench.store import run_folder, tables
from swabench.errors import UserError
from swabench.publish.markdown import environment_line, markdown_table

KEY = list(run_folder.KEY)
class CompareError(UserError, ValueError):
    """Two folders that cannot be compared, or options out of range: the CLI exits 2."""


@dataclass
class Comparison:
    """The outcome of ``compare``: one row per point in either run (``table``), both runs' metadata,
    how many points were in both runs / in one only, and warnings for the reader."""
    table: pd.DataFrame
    base_meta: dict
    new_meta: dict
    joined: int
    only_base: int
    only_new: int
    warnings: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> int:
        return int((self.table["verdict"] == "regression").sum())


def validate(threshold, alpha) -> None:
    """CompareError unless threshold is a finite number >= 0 and 0 < alpha < 1."""
    what = "a relative change, 0.05 = 5%"
    try:
        t = float(threshold)
    except (TypeError, ValueError):
        raise CompareError(f"--threshold must be a number >= 0 ({what}), got {threshold!r}") from None
    if not math.isfinite(t):
        raise CompareError(f"--threshold must be a finite number >= 0 ({what}), got {t:g}")
    if t < 0:
        raise CompareError(f"--threshold must be >= 0 ({what}), got {t:g}")
    try:
        a = float(alpha)
    except (TypeError, ValueError):
        raise CompareError(f"--alpha must be a number between 0 and 1 (a significance level, e.g. 0.01), "
                           f"got {alpha!r}") from None
    if not 0 < a < 1:  # NaN fails this too
        raise CompareError(f"--alpha must be between 0 and 1, both excluded (a significance level, e.g. 0.01), "
                           f"got {a:g}")


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


def noise(samples) -> float:
    """IQR / median of timing samples, as ``measure.timing`` computes it (NaN for fewer than two)."""
    if len(samples) < 2:
        return float("nan")
    q1, median, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return (q3 - q1) / median if median > 0 else float("nan")


def _point_noise(recorded, samples) -> float:
    """The point's recorded noise, else its samples' (NaN when it has neither)."""
    if isinstance(recorded, (int, float)) and math.isfinite(recorded):
        return float(recorded)
    return noise(samples) if samples else float("nan")


def _read_run(label: str, folder) -> tuple[pd.DataFrame, dict, dict]:
    """(table, meta, kernel samples by key) of one run folder, or a CompareError saying what is wrong
    (``run_folder`` names the file and the damage; here, what compare itself needs)."""
    folder = Path(folder)
    try:
        meta = run_folder.read_meta(folder)
        table_file = run_folder.stored(folder, run_folder.TABLE)
        if not (folder / run_folder.ROWS).exists() and table_file.exists() \
                and not run_folder.stored(folder, run_folder.SAMPLES).exists():
            raise CompareError(f"{label} {folder} has {table_file.name} but no {run_folder.SAMPLES} "
                               f"(and no {run_folder.ROWS}): its timing samples are missing")
        rows = run_folder.read_rows(folder)
    except run_folder.RunFolderError as e:
        raise CompareError(f"{label} {e}") from None
    table = run_folder.to_table(rows)
    if table.empty:
        raise CompareError(f"{label} {folder} has no points (state: {meta.get('state', 'unknown')})")
    missing = [c for c in [*KEY, "status"] if table[c].isna().any()]
    if missing:
        raise CompareError(f"{label} {folder}: some points have no {', '.join(missing)}")
    # Keys as text: a table column pandas read as numbers must still meet the journal's strings.
    table = table.assign(**{k: table[k].astype(str) for k in KEY})
    table["case"] = table["case"].fillna(table["case_id"])
    table["median_us"] = pd.to_numeric(table["median_us"], errors="coerce")
    table["noise"] = pd.to_numeric(table["noise"], errors="coerce")
    samples = {}
    for r in rows:
        kernel = r.get("samples") if isinstance(r.get("samples"), dict) else {}
        kernel = kernel.get("kernel")
        if not kernel:
            continue
        try:
            samples[tuple(str(r[k]) for k in KEY)] = [float(v) for v in kernel]
        except (TypeError, ValueError) as e:
            raise CompareError(f"{label} {folder}: a kernel timing sample is not a number ({e})") from None
    return table.reset_index(drop=True), meta, samples


def _run_warnings(label: str, table: pd.DataFrame, meta: dict) -> list[str]:
    out = []
    state = meta.get("state", "complete")  # folders from before ``state`` existed were complete
    if state != "complete":
        planned = meta.get("points")
        of = f" of {planned}" if isinstance(planned, int) and planned else ""
        out.append(f"{label} is not a complete run ({state or 'state unknown'}: {len(table)}{of} points)")
    if table["median_us"].isna().all():
        out.append(f"{label} timed nothing (no median_us: a `check` run?): its points are compared by "
                   f"status only")
    return out


def _device(meta: dict) -> str:
    """Where a run ran, as its meta.json says: its GPU, a CPU, or that it does not say."""
    if meta.get("gpu"):
        return meta["gpu"]
    return "a CPU" if meta.get("device") == "cpu" or meta.get("cpu") else "a device its meta.json does not name"


def compare(base, new, threshold: float = 0.05, alpha: float = 0.01,
            allow_different_gpus: bool = False) -> Comparison:
    validate(threshold, alpha)
    threshold, alpha = float(threshold), float(alpha)
    try:
        tables.each_once([base, new])
    except tables.RunFolderError as e:
        raise CompareError(str(e)) from None
    base, new = Path(base), Path(new)
    bt, bm, bs = _read_run("BASE", base)
    nt, nm, ns = _read_run("NEW", new)
    warnings = []
    if bm.get("gpu") != nm.get("gpu"):
        devices = f"BASE ran on {_device(bm)} and NEW on {_device(nm)}"
        if not allow_different_gpus:
            raise CompareError(f"{devices}; timings from different devices are not comparable "
                               f"(--allow-different-gpus to insist)")
        warnings.append(f"{devices} (compared anyway: --allow-different-gpus)")
    if (bm.get("scenario_sha256"), bm.get("scenario")) != (nm.get("scenario_sha256"), nm.get("scenario")):
        warnings.append(f"different scenarios: BASE ran {bm.get('scenario')!r} (sha256 {bm.get('scenario_sha256')}), "
                        f"NEW {nm.get('scenario')!r} (sha256 {nm.get('scenario_sha256')}); "
                        f"only the points in both are compared")
    warnings += _run_warnings("BASE", bt, bm) + _run_warnings("NEW", nt, nm)

    joined = bt.merge(nt, on=KEY, how="outer", suffixes=("_base", "_new"), indicator="side")
    sides = joined["side"].value_counts()
    n_both, n_base, n_new = (int(sides.get(s, 0)) for s in ("both", "left_only", "right_only"))
    if n_both == 0:
        raise CompareError(f"BASE {base} ({len(bt)} points) and NEW {new} ({len(nt)} points) have no point in "
                           f"common (a point is a case_id, impl and backend): different scenarios or "
                           f"implementations?")
    rows = []
    for r in joined.to_dict("records"):
        key = tuple(r[k] for k in KEY)
        row = {"case_id": key[0], "case": r["case_base"] if isinstance(r["case_base"], str) else r["case_new"],
               "impl": key[1], "backend": key[2], "status_base": r["status_base"], "status_new": r["status_new"],
               "base_us": r["median_us_base"], "new_us": r["median_us_new"],
               "noise_base": _point_noise(r["noise_base"], bs.get(key)),
               "noise_new": _point_noise(r["noise_new"], ns.get(key))}
        row["throttled"] = "+".join(side for side in ("base", "new") if _flagged(r.get(f"throttled_{side}")))
        row["ratio"] = row["new_us"] / row["base_us"] if row["base_us"] else float("nan")
        row["p"] = mann_whitney_u(bs[key], ns[key])[1] if key in bs and key in ns else float("nan")
        row["verdict"] = _verdict(row, threshold, alpha, r["side"])
        rows.append(row)
    order = {"regression": 0, "improvement": 1, "status changed": 2, "cannot judge": 3, "too noisy": 4,
             "only in one run": 5, "same": 6}
    table = pd.DataFrame(rows)
    table = table.assign(_o=table["verdict"].map(order), _r=-table["ratio"].fillna(0)) \
        .sort_values(["_o", "_r"]).drop(columns=["_o", "_r"]).reset_index(drop=True)
    return Comparison(table=table, base_meta=bm, new_meta=nm, joined=n_both, only_base=n_base, only_new=n_new,
                      warnings=warnings)


def _flagged(value) -> bool:
    """A row's ``throttled`` as read back from a journal (a bool) or a table (a bool or its text)."""
    return value is True or str(value) == "True"


def _verdict(row: dict, threshold: float, alpha: float, merge: str) -> str:
    if merge != "both":
        return "only in one run"
    if row["status_base"] == "pass" and row["status_new"] in ("fail", "crash"):
        return "regression"
    if row["status_base"] != row["status_new"]:
        return "status changed"
    if not math.isfinite(row["ratio"]):
        timed = all(isinstance(row[k], (int, float)) and math.isfinite(row[k]) for k in ("base_us", "new_us"))
        return "cannot judge" if timed else "same"  # a zero median; else untimed in one run or both: by status
    noises = [n for n in (row["noise_base"], row["noise_new"]) if math.isfinite(n)]
    if any(n > threshold for n in noises):
        return "too noisy"
    if abs(row["ratio"] - 1) <= max(threshold, math.hypot(*noises)) or not row["p"] < alpha:
        return "same"
    return "regression" if row["ratio"] > 1 else "improvement"


def to_markdown(comparison: Comparison, threshold: float, alpha: float) -> str:
    c = comparison
    counts = c.table["verdict"].value_counts().to_dict()
    head = f"BASE: {environment_line(c.base_meta)}\n\nNEW: {environment_line(c.new_meta)}\n\n"
    if c.warnings:
        head += "**Warnings:**\n\n" + "".join(f"- {w}\n" for w in c.warnings) + "\n"
    head += (f"{c.joined} points joined ({c.only_base} only in BASE, {c.only_new} only in NEW); "
             f"noise is a point's IQR / median; a point is too noisy to judge when either run's noise is above "
             f"{threshold:g} (never a regression: raise --threshold to judge it); a regression or improvement "
             f"needs |ratio - 1| > max({threshold:g}, sqrt(noise_base² + noise_new²)) and Mann-Whitney "
             f"p < {alpha:g}: "
             + ", ".join(f"{v} {k}" for k, v in counts.items()) + "\n\n")
    shown = c.table[c.table["verdict"] != "same"]
    cols = ["verdict", "case", "impl", "backend", "base_us", "new_us", "ratio", "noise_base", "noise_new", "p",
            "status_base", "status_new"]
    if (shown["throttled"] != "").any():
        head += ("`throttled` names the run that timed the point while the card held its clock back for power or "
                 "heat (NVML): a difference there may be the clock's, not the code's.\n\n")
        cols.append("throttled")
    return head + (markdown_table(shown[cols]) if len(shown) else "No significant differences.")


def to_json(comparison: Comparison) -> str:
    """The points, one JSON object each, for CI to parse (the counts and warnings are in
    ``to_markdown`` and on the object)."""
    return json.dumps(json.loads(comparison.table.to_json(orient="records")), indent=1)
