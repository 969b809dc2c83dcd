"""Recompute a committed run's statuses where the suite's prediction of a known mistake has changed since it ran.

A known-bug point's status is the gate's outcome (did the output pass?) read against the prediction (must its
mistake show here?).  When the model of what a path computes is corrected, the outcome stored in the row stays
true and only the prediction moves, so the status can be recomputed without running the point again.  Only rows
whose ``must_fail`` changes are touched (with ``keys_lost``, ``rows_losing`` and the verdict's note in ``reason``);
a row with a declared upstream bug is left alone and counted.  With ``--write`` the table is written back byte for
byte but those cells, ``meta.json``'s ``status_counts`` updated and what was done recorded in its
``statuses_recomputed`` list.

    python3 scripts/restatus.py results/h200-default-0.7.4 ... [--write]
"""

from __future__ import annotations

import argparse
import collections
import gzip
import io
import json
import subprocess
import sys
from pathlib import Path

NOTES = ("known bug caught", "KNOWN BUG NOT CAUGHT: fixed upstream, or the gate is blind here",
         "case does not exercise the bug", "failed where its known bug should not show")


def _table_path(folder: Path) -> Path:
    return next(p for p in (folder / "results.csv", folder / "results.csv.gz") if p.is_file())


def read_table(folder: Path):
    """The results table with every cell as the text stored (so writing it back changes only what is set)."""
    import pandas as pd

    path = _table_path(folder)
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return pd.read_csv(io.BytesIO(raw), dtype=str, keep_default_na=False)


def write_table(folder: Path, table) -> None:
    path = _table_path(folder)
    text = table.to_csv(index=False, lineterminator="\n").encode()
    path.write_bytes(gzip.compress(text, mtime=0) if path.suffix == ".gz" else text)


def gate_reason(reason: str) -> str:
    """What the gate said, without the verdict's note in front of it."""
    for note in NOTES:
        if reason == note:
            return ""
        if reason.startswith(note + "; "):
            return reason[len(note) + 2:]
    return reason


def restatus(folder: Path) -> tuple[object, collections.Counter]:
    """(the table with its changed rows recomputed, a count per change: 'xpass -> pass', 'kept: upstream bug ...',
    'no case') for one run folder."""
    from swabench.core import workloads
    from swabench.impls import registry
    from swabench.inputs import scenarios
    from swabench.run.sweep import verdict

    table = read_table(folder)
    cases = {c.case_id: c for c in scenarios.load(folder / "scenario.toml").cases}
    changes = collections.Counter()
    for i, row in table.iterrows():
        impl = registry.get(row["impl"]) if row["impl"] in registry.names() else None
        if impl is None or not impl.expected_to_fail or row["status"] == "skip" or row["must_fail"] == "":
            continue
        case = cases.get(row["case_id"])
        if case is None:
            changes["no case in scenario.toml"] += 1
            continue
        qo, kv = workloads.request_lengths(case)
        must = impl.must_fail(case, qo, kv, row["backend"])
        if str(must) == row["must_fail"]:
            continue
        if row.get("upstream", ""):
            changes[f"kept: upstream bug {row.get('upstream')} declared"] += 1
            continue
        status, note = verdict(True, must, row["status"] in ("pass", "xpass"))
        lost, losing = impl.keys_lost(case, qo, kv, row["backend"])
        said = gate_reason(row["reason"])
        updates = {"must_fail": str(must), "status": status, "reason": "; ".join(s for s in (note, said) if s)}
        if "keys_lost" in table:
            updates.update(keys_lost=str(lost), rows_losing=str(losing))
        for column, value in updates.items():
            table.at[i, column] = value
        changes[f"{row['status']} -> {status}"] += 1
    return table, changes


def record(folder: Path, table, changes: collections.Counter, why: str) -> None:
    """Write the table back and say in meta.json what was recomputed, at which commit and why."""
    write_table(folder, table)
    meta_path = folder / "meta.json"
    meta = json.loads(meta_path.read_text())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta["status_counts"] = {s: int(n) for s, n in sorted(table["status"].value_counts().items())}
    meta.setdefault("statuses_recomputed", []).append(
        {"commit": commit, "why": why, "changes": dict(changes),
         "method": "scripts/restatus.py: the stored gate outcome (passed or not) read against the corrected "
                   "must_fail; no point was run again"})
    meta_path.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--write", action="store_true", help="write the recomputed statuses back")
    parser.add_argument("--why", default="", help="the correction, recorded in meta.json")
    args = parser.parse_args(argv)
    if args.write and not args.why:
        parser.error("--write needs --why: the correction that moved the prediction")
    for folder in args.runs:
        if not any((folder / name).is_file() for name in ("results.csv", "results.csv.gz")):
            print(f"{folder}: no results table")
            continue
        table, changes = restatus(folder)
        print(f"{folder}: " + (", ".join(f"{n} {what}" for what, n in sorted(changes.items())) or "unchanged"))
        if args.write and any(" -> " in what for what in changes):
            record(folder, table, changes, args.why)
    return 0


if __name__ == "__main__":
    sys.exit(main())
