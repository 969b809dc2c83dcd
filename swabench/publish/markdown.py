"""Markdown pieces shared by the published pages and ``compare``: pure functions of pandas tables and
run metadata (no plotting library, so ``swabench compare`` starts without matplotlib)."""

from __future__ import annotations

import pandas as pd


def markdown_table(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(map(str, cols)) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, row in df.iterrows():
        lines.append("| " + " | ".join(_cell(row[c]) for c in cols) + " |")
    return "\n".join(lines)


def _cell(value) -> str:
    if isinstance(value, float):
        return "" if pd.isna(value) else f"{value:.3g}"
    return str(value)


def environment_line(meta: dict) -> str:
    gpu = meta.get("gpu") or f"CPU ({meta.get('cpu')})"
    commit = (meta.get("git_commit") or "unknown")[:10]
    return (f"{gpu}, driver {meta.get('nvidia_smi.driver_version', 'n/a')}, CUDA {meta.get('cuda') or 'n/a'}, "
            f"torch {meta.get('torch')}, {library_versions(meta)}, "
            f"swabench {meta.get('swabench')} @ {commit}; `{meta.get('command')}`")


def console_summary(table: pd.DataFrame, shown: int = 10) -> str:
    """What a finished sweep prints: points per implementation and status, the median kernel time,
    and the first failed and xpass points (lines starting '  FAIL' / '  XPASS')."""
    if not len(table):
        return ""
    counts = table.groupby("impl", sort=False)["status"].value_counts().unstack(fill_value=0)
    counts["median of medians (us)"] = table.groupby("impl", sort=False)["median_us"].median().round(1)
    lines = [counts.to_string()]
    for status in ("fail", "xpass"):
        rows = table[table["status"] == status]
        lines += [f"  {status.upper()} {r['impl']} [{r['backend']}] {r['case']}: {r['reason']}"
                  for _, r in rows.head(shown).iterrows()]
        if len(rows) > shown:
            lines.append(f"  {status.upper()} ... and {len(rows) - shown} more (results.csv has them all)")
    return "\n".join(lines)


def library_versions(meta: dict) -> str:
    """'flashinfer 0.7.2.post1' for each library the run recorded ('n/a' where it was not installed)."""
    return ", ".join(f"{name} {version or 'n/a'}" for name, version in (meta.get("libraries") or {}).items())
