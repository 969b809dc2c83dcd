"""Recompute a committed run's statuses where the suite's prediction of a known mistake, or its table of declared
upstream bugs and documented preconditions (``impls.upstream``), has changed since it ran.

A known-bug point's status is the gate's outcome (did the output pass?) read against the prediction (must its
mistake show here?).  When the model of what a path computes is corrected, the outcome stored in the row stays true
and only the prediction moves, so the status can be recomputed without running the point again.  Only rows whose
``must_fail`` changes are touched (with ``keys_lost``, ``rows_losing`` and the verdict's note in ``reason``), and
``rows_as_predicted`` where the row's count of wrong rows settles it; a row with a declared upstream bug, or with no
gate outcome (the point raised), is left alone.  A row whose own mistake does not speak, with no ``upstream``, where
a documented precondition now declared holds takes its verdict (``xfail`` with its reason where the gate failed it,
``pass`` saying it was declared there where it passed) and its reference in ``upstream``.  With ``--write`` the
table is written back byte for byte but those cells, ``meta.json``'s ``status_counts`` updated and what was done
recorded in its ``statuses_recomputed`` list, each file replaced whole by a rename.  Every folder is checked before
any is recomputed: one that is not a finished run folder (no meta.json, a file that does not read as its kind, a
journal still there) is a message and exit 2, and so, with ``--write``, is one whose files are links or cannot be
written.

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

ROOT = Path(__file__).resolve().parent.parent
NEEDED = ("case_id", "impl", "backend", "status", "must_fail", "reason")  # the columns a recomputation reads


def checked_table(folder: Path, write: bool):
    """The folder's results table, every cell as the text stored (so writing it back changes only what is set), once
    the folder reads as a finished run: its meta.json, scenario.toml and table each of their kind, and no journal.
    With ``write``, also none of the files it rewrites a link, a hard link or unwritable.  A UserError naming the
    file otherwise, before any folder is recomputed."""
    import pandas as pd

    from swabench.inputs import scenarios
    from swabench.store import reading, run_folder, schema, tables

    if not folder.is_dir():
        raise tables.RunFolderError(f"{folder}: not a folder; give a finished run folder")
    if (folder / schema.ROWS).exists() or (folder / schema.ROWS).is_symlink():
        raise tables.RunFolderError(f"{folder} carries its journal ({schema.ROWS}), which its table is rebuilt from "
                                    f"and this would contradict: restatus rewrites finished, published folders only")
    tables.read_meta(folder)
    scenarios.load(folder / schema.SCENARIO)
    path = tables.stored(folder, schema.TABLE)
    tables.read_csv(path, NEEDED)
    if write:
        run_folder.refuse_odd_files(folder)
    raw = reading.read_bytes(path, reading.TABLE, tables.in_folder(path))
    text = gzip.decompress(raw) if path.suffix == ".gz" else raw
    return pd.read_csv(io.BytesIO(text), dtype=str, keep_default_na=False)


def write_table(folder: Path, table) -> None:
    from swabench.store import run_folder, schema, tables

    path = tables.stored(folder, schema.TABLE)
    text = table.to_csv(index=False, lineterminator="\n").encode()
    run_folder.atomic_write(path, gzip.compress(text, mtime=0) if path.suffix == ".gz" else text)


def gate_reason(reason: str) -> str:
    """What the gate said, without the verdict's note in front of it (``verdict.NOTES``, or the old xpass note)."""
    from swabench.run.verdict import NOTES

    first, _, rest = reason.partition("; ")
    return rest if first.startswith(NOTES) else reason


def rows_as_predicted(row, predicted) -> str:
    """The row's ``rows_as_predicted`` under the corrected prediction, where its count of wrong rows settles it:
    'False' where the counts differ, 'True' where they agree on every row or on none; where they agree on some rows,
    the gate's own row-by-row 'True' stands and anything else is '' (not known)."""
    was = row.get("rows_as_predicted", "")
    if row.get("wrong_rows", "") == "":
        return was
    wrong, count = int(float(row["wrong_rows"])), int(predicted.sum())
    if wrong != count:
        return "False"
    return "True" if count in (0, len(predicted)) or was == "True" else ""


def restatus(folder: Path, table) -> tuple[object, collections.Counter]:
    """(``table``, the folder's, with its changed rows recomputed, a count per change: 'xpass -> pass', 'kept: ...')
    for one finished run folder, predicted on the SM count of the run's own GPU."""
    from unittest import mock

    import torch

    from swabench.core import workloads
    from swabench.impls import fa2_split, registry
    from swabench.inputs import scenarios
    from swabench.run.verdict import verdict
    from swabench.store import schema, tables

    meta = tables.read_meta(folder)
    cases = {c.case_id: c for c in scenarios.load(folder / schema.SCENARIO).cases}
    changes = collections.Counter()
    sms = meta.get("gpu_sms") or fa2_split.H200_SMS
    with mock.patch.object(fa2_split, "device_sms", lambda: sms):  # the schedule the run's own GPU made
        for i, row in table.iterrows():
            impl = registry.get(row["impl"]) if row["impl"] in registry.names() else None
            speaks = impl is not None and impl.expected_to_fail and row["must_fail"] == "True"  # its own mistake
            if impl is not None and row["case_id"] in cases and not speaks:
                declared(table, i, row, cases[row["case_id"]], changes)
            if impl is None or not impl.expected_to_fail or row["status"] == "skip" or row["must_fail"] == "":
                continue
            if row.get("rel_l2", "") == "":  # no gate outcome (the point raised): nothing to read again
                continue
            case = cases.get(row["case_id"])
            if case is None:
                changes["no case in scenario.toml"] += 1
                continue
            qo, kv = workloads.request_lengths(case)
            must = impl.must_fail(case, qo, kv, row["backend"])
            if "rows_as_predicted" in table:
                said = rows_as_predicted(row, torch.cat(impl.rows_wrong(case, qo, kv, row["backend"])))
                if said != row["rows_as_predicted"]:
                    changes[f"rows_as_predicted {row['rows_as_predicted'] or '(none)'} -> {said or '(not known)'}"] += 1
                    table.at[i, "rows_as_predicted"] = said
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


def declared(table, i: int, row, case, changes: collections.Counter) -> None:
    """A row whose path's own mistake does not speak, gated (a pass or a fail) with nothing in ``upstream``, read again
    against the documented preconditions declared now (their conditions read the case alone; a bug's may read the
    GPU or the process): where one's holds, its verdict and its reference."""
    from swabench.impls import upstream
    from swabench.run.verdict import verdict

    if row["status"] not in ("pass", "fail") or row.get("upstream", "") or row.get("rel_l2", "") == "":
        return
    bug = upstream.hit(row["impl"], case, row["backend"])
    if bug is None or not bug.documented:
        return
    status, note = verdict(False, False, row["status"] == "pass", bug)
    table.at[i, "status"], table.at[i, "upstream"] = status, bug.ref
    table.at[i, "reason"] = "; ".join(s for s in (note, row["reason"]) if s)
    changes[f"{row['status']} -> {status} ({bug.ref})"] += 1


def record(folder: Path, table, changes: collections.Counter, why: str) -> None:
    """Write the table back and say in meta.json (as stored, not migrated) what was recomputed, at which commit and
    why; each file replaced whole by a rename."""
    from swabench.store import reading, run_folder, schema

    write_table(folder, table)
    meta_path = folder / schema.META
    meta = reading.json_file(meta_path, reading.META)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    meta["status_counts"] = {s: int(n) for s, n in sorted(table["status"].value_counts().items())}
    meta.setdefault("statuses_recomputed", []).append(
        {"commit": commit, "why": why, "changes": dict(changes),
         "method": "scripts/restatus.py: the stored gate outcome (passed or not) read against the corrected "
                   "must_fail and the bugs declared now; no point was run again"})
    run_folder.atomic_write(meta_path, json.dumps(meta, indent=2, sort_keys=True) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="a finished run folder")
    parser.add_argument("--write", action="store_true", help="write the recomputed statuses back")
    parser.add_argument("--why", default="", help="the correction, recorded in meta.json")
    args = parser.parse_args(argv)
    if args.write and not args.why:
        parser.error("--write needs --why: the correction that moved the prediction")
    from swabench.errors import UserError
    from swabench.store import tables

    try:
        tables.each_once(args.runs)
        stored = [checked_table(folder, args.write) for folder in args.runs]  # every folder, before any is touched
        for folder, table in zip(args.runs, stored):
            table, changes = restatus(folder, table)
            print(f"{folder}: " + (", ".join(f"{n} {what}" for what, n in sorted(changes.items())) or "unchanged"))
            if args.write and any(" -> " in what for what in changes):
                record(folder, table, changes, args.why)
    except UserError as e:
        parser.error(str(e))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
