"""A run folder's stored files read as the current format: its table with every schema column (from the
journal's rows or a CSV, plain or gzipped), its samples, its meta.json migrated, and the names older
formats gave implementations.  ``run_folder`` writes the folder and reads it whole through these."""

from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from swabench.errors import RunFailed, UserError
from swabench.store import checks, reading, schema
from swabench.store.schema import KEY, META, ROWS, TABLE

if TYPE_CHECKING:  # pandas is imported where tables are made: the --gpus launcher starts without it
    import pandas as pd


class RunFolderError(UserError):
    """A run folder that cannot be written or read, said plainly (the CLI exits 2)."""


class JournalError(RunFailed):
    """A row the system would not let the journal take (a full disk, a file-size limit): the run ends (the CLI exits
    1), its folder resumable."""

    def __init__(self, folder: Path, error: OSError):
        super().__init__(f"{folder}: cannot record a result in {ROWS} ({error.strerror or error}); the rows recorded "
                         f"before it are kept: make room (or raise the file-size limit), then resume the run (the same "
                         f"command with --resume)")


def to_table(rows: list[dict]) -> pd.DataFrame:
    import pandas as pd
    flat = [{k: v for k, v in r.items() if k != "samples"} for r in rows]
    return with_columns(pd.DataFrame(flat))


def with_columns(df: pd.DataFrame) -> pd.DataFrame:
    """Every schema column present (empty where no row has it), leading in schema order; a table of
    an older format (from its CSV or its journal) read as the current one."""
    df = schema.migrate_table(df)
    lead = list(schema.COLUMNS)
    df = df.reindex(columns=lead + [c for c in df.columns if c not in lead])
    if df["wrapper"].isna().any() and len(df):  # written before the column named the wrapper family
        from swabench.impls import registry
        family = {i.name: i.family for i in registry.all_implementations()}
        df["wrapper"] = df["wrapper"].astype(object).fillna(df["impl"].map(family))
    return df


def to_samples(rows: list[dict]) -> pd.DataFrame:
    import pandas as pd
    records = [(r["case_id"], r["impl"], r["backend"], kind, i, v)
               for r in rows for kind, values in (r.get("samples") or {}).items() for i, v in enumerate(values)]
    return pd.DataFrame(records, columns=[*KEY, "kind", "index", "value_us"])


def stored(folder, name: str) -> Path:
    """Where ``folder`` keeps the table ``name``: gzipped or plain, whichever it has; the plain name when
    it has neither.  Both are read only when they hold the same text (which one is current cannot be
    told otherwise): RunFolderError naming the folder and both files when they differ."""
    plain = Path(folder) / name.removesuffix(".gz")
    packed = plain.with_name(plain.name + ".gz")
    if not packed.exists():
        return plain
    if plain.exists():
        text = reading.read_bytes(plain, reading.TABLE, in_folder(plain))
        try:
            same = text == gzip.decompress(reading.read_bytes(packed, reading.TABLE, in_folder(packed)))
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise RunFolderError(f"{packed} cannot be read ({type(e).__name__}: {e})") from None
        if not same:
            raise RunFolderError(f"{folder} has both {plain.name} and {packed.name} and they differ: remove the one "
                                 f"that is not current")
    return packed


def journal(path: Path) -> list[dict]:
    """The rows of the journal ``path``, one per key (the last one wins), each of its fields' kinds
    (``checks.row``).  A last line cut short by an interruption is left out; any other line that is not a row
    means the journal is damaged."""
    return [row for _, row in numbered_journal(path)]


def numbered_journal(path: Path) -> list[tuple[int, dict]]:
    """``journal``'s rows, each with the number of the line it was read from."""
    out = {}
    for number, row in _lines(path, "the journal", "a result row"):
        try:
            key = tuple(row[k] for k in KEY)
            hash(key)
        except (KeyError, TypeError):
            raise RunFolderError(f"{path}: line {number} is not a result row: the journal is damaged") from None
        out[key] = number, row
    for number, row in out.values():  # the rows that count (one a later line replaced does not)
        try:
            checks.row(row)
        except ValueError as e:
            raise RunFolderError(f"{path}: line {number}: {e}: the journal is damaged") from None
    return list(out.values())


def unfinished(folder: Path) -> list[tuple]:
    """The keys of the points ``folder``'s ``started.jsonl`` says began more often than its journal holds their
    rows, in order: the point in flight where a run ended without a word (the node lost, kill -9)."""
    folder = Path(folder)

    def keys(path: Path, what: str, each: str) -> Counter:
        lines = _lines(path, what, each)
        return Counter(tuple(line.get(k) for k in KEY) for _, line in lines if isinstance(line, dict))

    starts = keys(folder / schema.STARTED, schema.STARTED, "a point's start")
    rows = keys(folder / ROWS, "the journal", "a result row")
    return [key for key, begun in starts.items() if begun > rows[key]]


def _lines(path: Path, what: str, each: str) -> list[tuple[int, object]]:
    """(line number, JSON value) of every line of the JSON Lines file ``path`` (none where it is missing); a last
    line cut short by an interruption is left out, any other line that is not JSON is damage."""
    lines = reading.read_text(path, reading.TABLE, in_folder(path)).split("\n") if path.exists() else []
    values = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            values.append((number, reading.json_value(line, in_folder(path, f"line {number}: ", f": {what} is "
                                                                                              f"damaged"))))
        except json.JSONDecodeError:
            if number == len(lines):  # the unterminated last line of an interrupted write
                continue
            raise RunFolderError(f"{path}: line {number} is not {each}: {what} is damaged") from None
    return values


def refuse_foreign_rows(path: Path, points: set[tuple]) -> None:
    """RunFolderError when the journal ``path`` holds a row whose key is not one of ``points`` (the run's own,
    as its meta.json selection records them): a line from another run would be counted as this run's, and
    which lines the user meant to keep cannot be told; ``swabench merge`` joins runs."""
    foreign = [(number, row) for number, row in numbered_journal(path) if tuple(row[k] for k in KEY) not in points]
    if foreign:
        number, row = foreign[0]
        raise RunFolderError(f"{path}: {len(foreign)} row(s) are not points of this run ({len(points)} points), e.g. "
                             f"line {number}: {', '.join(f'{k} {row[k]}' for k in KEY)}; remove the lines that "
                             f"came from another run, or start a new --out")


def refuse_stale_table(folder, rows: list[dict], state) -> None:
    """RunFolderError when the folder's table and its journal (``rows``, the journal's rows as stored)
    disagree: a point one has and the other lacks, or a different status or median.  A running sweep's
    journal may be ahead of the table its last session wrote, no more."""
    path = stored(folder, TABLE)
    if not path.exists():
        return
    journal = {tuple(str(r.get(k)) for k in KEY): r for r in rows}
    table = {tuple(str(r[k]) for k in KEY): r for r in read_csv(path, (*KEY, "status")).to_dict("records")}
    only_table = [k for k in table if k not in journal]
    only_journal = [k for k in journal if k not in table] if state != "running" else []
    differ = [k for k in table if k in journal and not _same_result(table[k], journal[k])]
    for keys, what in ((only_table, f"in {path.name} only"), (only_journal, f"in {ROWS} only"),
                       (differ, "a different status or median_us")):
        if keys:
            raise RunFolderError(f"{folder}: {ROWS} and {path.name} disagree ({len(keys)} points {what}, e.g. "
                                 f"{', '.join(keys[0])}): remove the one that is not current")


def _same_result(listed: dict, recorded: dict) -> bool:
    def number(v):
        try:
            v = float(v)
        except (TypeError, ValueError):
            return None
        return None if v != v else v

    a, b = number(listed.get("median_us")), number(recorded.get("median_us"))
    close = a == b if a is None or b is None else math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return str(listed.get("status")) == str(recorded.get("status")) and close


TEXT_VALUES = ("cache_fill",)  # columns whose values are words, one of them "nan"


def csv_file(path: Path, empty_ok: bool = False, text: bool = False) -> pd.DataFrame:
    """A run folder's CSV file (plain or gzipped), its key columns as text (a case_id of digits stays text), or
    with ``text`` every column, each cell as spelled; a column of TEXT_VALUES keeps a value pandas would take for a
    missing one (the fill ``nan``): only its empty cells are missing.  RunFolderError naming it where it cannot be
    read, or is empty and ``empty_ok`` is not given."""
    import pandas as pd
    try:
        table = pd.read_csv(reading.regular(path, reading.TABLE, in_folder(path)),
                            dtype=str if text else {k: str for k in KEY})
        spelled = [c for c in TEXT_VALUES if c in table.columns and table[c].isna().any()]
        if spelled:  # a text value that reads as missing ("nan"), read again as written
            table[spelled] = pd.read_csv(reading.regular(path, reading.TABLE, in_folder(path)), usecols=spelled,
                                         dtype=str, keep_default_na=False, na_values=[""])[spelled]
        return table
    except pd.errors.EmptyDataError as e:
        if empty_ok:
            return pd.DataFrame()
        raise RunFolderError(f"{path} cannot be read as a table ({type(e).__name__}: {e})") from None
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, pd.errors.ParserError) as e:
        raise RunFolderError(f"{path} cannot be read as a table ({type(e).__name__}: {e})") from None


def optional_table(folder, name: str) -> pd.DataFrame | None:
    """A table that some run folders hold (replay.csv, nsys_stats.csv, ...), as it is: None where the folder has
    none, empty where its file is."""
    path = stored(folder, name)
    return csv_file(path, empty_ok=True) if os.path.lexists(path) else None


def read_csv(path: Path, needed) -> pd.DataFrame:
    if not os.path.lexists(path):
        raise RunFolderError(f"{path.parent} has no {path.name} and no {ROWS}: not a finished run folder")
    df = csv_file(path)
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise RunFolderError(f"{path} is not a swabench table: no column {', '.join(missing)}")
    try:
        checks.table(df)
        if "status" in df.columns:  # a results table: its rows hold what journal rows do
            checks.cells(csv_file(path, text=True))
    except ValueError as e:
        raise RunFolderError(f"{path}: {e}") from None
    return df


def each_once(folders) -> None:
    """RunFolderError when two of ``folders`` are one folder (the same path once resolved): a run given
    twice would count every point twice."""
    seen: dict[Path, str] = {}
    for folder in map(str, folders):
        real = Path(folder).resolve()
        if real in seen:
            raise RunFolderError(f"{seen[real]} and {folder} are the same run folder: give each run folder once")
        seen[real] = folder


def stored_version(folder) -> int:
    """The format version the folder was written in (before ``read_meta`` migrates it)."""
    try:
        return reading.json_file(Path(folder) / META, reading.META).get("format_version", 1)
    except (UserError, AttributeError):
        return schema.FORMAT_VERSION


def impl_renames(folder) -> dict[str, str]:
    """The implementations the folder's stored tables name that are called otherwise now (old -> new)."""
    return schema.renamed_impls(stored_version(folder))


def renamed(rows: list[dict], folder) -> list[dict]:
    names = impl_renames(folder)
    for row in rows:
        row["impl"] = names.get(row.get("impl"), row.get("impl"))
    return rows


def in_folder(path: Path, where: str = "", after: str = "") -> reading.Error:
    """The error that names a run folder's file ``path`` (and ``where`` in it) and what is wrong with it."""
    return lambda reason: RunFolderError(f"{path}: {where}{reason}{after}")


def read_meta(folder) -> dict:
    """A run's metadata, migrated to the current format, each key of its kind (schema.META_FIELDS)."""
    path = Path(folder) / META
    if not os.path.lexists(path):
        raise RunFolderError(f"{folder} is not a swabench run folder (no {META})")
    meta = reading.json_file(path, reading.META, in_folder(path))
    if not isinstance(meta, dict):
        raise RunFolderError(f"{path} does not hold a JSON object")
    try:
        _check_meta(meta)  # before the migration reads it, and after
        meta = schema.migrate(meta)
        _check_meta(meta)
    except ValueError as e:
        raise RunFolderError(f"{path}: {e}") from None
    return meta


def _check_meta(meta: dict) -> None:
    """ValueError unless each key is of its kind and ``peaks``, where there, holds the measured rates the ceiling
    and the floors are worked from."""
    checks.fields(meta, schema.META_FIELDS, "key")
    peaks = meta.get("peaks")
    missing = next((k for k in schema.MEASURED_PEAKS if isinstance(peaks, dict) and k not in peaks), None)
    if missing:
        raise ValueError(f"key peaks: holds no {missing}, which the peaks of every run hold")


def extent(meta: dict, table: pd.DataFrame) -> str:
    """What a page says a run holds: '68 points over 20 cases', and of a run that did not finish, how many of
    its points and that it did not: '9 of 68 points over 5 cases; the run is interrupted'."""
    state, planned = meta.get("state", "complete"), meta.get("points")
    held = f"{len(table)}" + (f" of {planned}" if planned and state != "complete" else "")
    return f"{held} points over {table['case_id'].nunique()} cases" + \
        (f"; the run is {said_state(state)}" if state != "complete" else "")


def said_state(state: str) -> str:
    """A state as a reader may say it: meta.json says "running" of a run still going and of one killed outright
    (kill -9, a node lost), which no signal handler could record."""
    return "running, or ended without a word (a resume continues it)" if state == "running" else state


def completeness(meta: dict, table: pd.DataFrame) -> str | None:
    """What a reader should say about a run that did not finish (None when it did: complete, or skipped, which
    finished with every point a skip its rows show)."""
    state = meta.get("state", "complete")
    if state in ("complete", "skipped"):
        return None
    planned = meta.get("points")
    return f"this run is {said_state(state)}: {len(table)}" + (f" of {planned}" if planned else "") + \
        " points recorded"
