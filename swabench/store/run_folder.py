"""The results store: one folder per run, written so that an interrupted sweep loses nothing, and
read back whatever state it was left in.

    rows.jsonl     every finished point, appended and fsynced as it finishes (the source of truth)
    results.csv    the tidy table: one row per case x implementation x backend (rewritten atomically)
    samples.csv.gz every timing sample, long format (case_id, impl, backend, kind, index, value_us)
    meta.json      environment, command line, method, scenario name and hash, progress (``schema``)
    scenario.toml  the scenario file exactly as run
    replay.csv     a replay's steps x paths, weighted (analysis.replay.steps)

Readers take either table plain or gzipped (``stored``): folders before samples.csv.gz have
samples.csv, and a published folder may carry a large results.csv as results.csv.gz.  A folder with
two copies that disagree (a table plain and gzipped, or rows.jsonl and results.csv) is refused.

One process writes a folder at a time (a lock file it holds; a dead holder's lock is taken over).
``--resume`` reopens a folder, drops a half-written last line, and skips the points already there.  Where a new
run folder may go is ``places``.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from swabench.store import checks, paths, reading, schema
from swabench.store.places import NOTHING_WRITTEN, check_new_run, make_folder, refuse_a_run
from swabench.store.lock import FolderLock
from swabench.store.schema import KEY, LOCK, META, ROWS, SAMPLES, SCENARIO, STARTED, TABLE  # noqa: F401
from swabench.store.tables import (JournalError, RunFolderError, impl_renames, in_folder, journal,  # noqa: F401
                                   read_csv, read_meta, refuse_stale_table, renamed, stored, stored_version, to_samples,
                                   to_table, unfinished, with_columns)

if TYPE_CHECKING:  # pandas is imported where tables are made: the --gpus launcher starts without it
    import pandas as pd


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write to a temporary file beside ``path``, fsync, then rename over it: only over a regular file
    (OutputError for a link, a device, a FIFO, a folder, or a file or folder the system will not let be written);
    its folder made if missing."""
    path = paths.file_out(path, "the output")
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as e:
        raise paths.OutputError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        os.chmod(tmp, 0o666 & ~paths.UMASK)  # mkstemp's file is the owner's alone
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise paths.OutputError(f"cannot write {path}: {e.strerror or e}") from None
        raise


def gzipped(text: str) -> bytes:
    """``text`` gzipped with no name and no time in the header (``gzip -9n``): the same rows give
    the same bytes."""
    return gzip.compress(text.encode(), compresslevel=9, mtime=0)


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class RunStore:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.lock: FolderLock | None = None

    # ------------------------------------------------------------ opening
    @classmethod
    def create(cls, folder, meta: dict, scenario_text: str) -> "RunStore":
        store = cls(make_folder(check_new_run(folder, hint=NOTHING_WRITTEN, resumable=True)))
        store._acquire()
        try:
            # again under the lock: another process may have just written one
            refuse_a_run(store.folder, NOTHING_WRITTEN, resumable=True)
            atomic_write(store.folder / SCENARIO, scenario_text)
            write_meta(store.folder, schema.check_meta({**meta, "scenario_sha256": text_hash(scenario_text),
                                                        "state": "running"}))
            (store.folder / ROWS).touch()
        except BaseException:
            store.close()
            raise
        return store

    @classmethod
    def resume(cls, folder, scenario_text: str) -> "RunStore":
        store = cls(paths.folder_out(folder))
        refuse_odd_files(store.folder)
        if not (store.folder / META).exists():
            raise RunFolderError(f"{folder} is not a swabench run folder (no {META}); nothing to resume")
        if not (store.folder / ROWS).exists():
            raise RunFolderError(f"{folder} has its {META} but no {ROWS}, the journal a resume continues (a published "
                                 f"run folder does not carry it); nothing to resume: start a new --out")
        meta = store.meta()
        if meta.get("merged_from"):
            raise RunFolderError(f"{folder} is a merge of {len(meta['merged_from'])} shards and cannot be resumed: "
                                 f"resume the unfinished shards ({', '.join(map(str, meta['merged_from']))}), then "
                                 f"merge them again into a new folder")
        version = stored_version(store.folder)
        renamed = sorted(set(schema.renamed_impls(version)) & {r.get("impl") for r in store.rows()})
        if renamed:
            raise RunFolderError(f"{folder} was written in result format {version}, where "
                                 f"{', '.join(renamed)} named another implementation than now: start a new --out")
        if meta.get("scenario_sha256") != text_hash(scenario_text):
            implementations = checks.implementations_apart(store.folder / SCENARIO, scenario_text)
            if implementations:
                raise RunFolderError(f"{folder} ran the implementations {implementations[0]} (its {SCENARIO} records "
                                     f"them), this resume asks for {implementations[1]}; resume it with the same "
                                     f"--impl, or start a new --out")
            raise RunFolderError(f"{folder} was run with a different scenario file; "
                                 f"resume it with the same file, or start a new --out")
        make_folder(store.folder)  # meta.json is rewritten beside it, in this folder
        store._acquire()
        try:
            store._drop_partial_line()
        except BaseException:
            store.close()
            raise
        return store

    def _acquire(self) -> None:
        try:
            lock = FolderLock(self.folder)
            lock.acquire()
        except OSError as e:
            raise RunFolderError(f"cannot lock {self.folder}: {e.strerror or e}") from None
        self.lock = lock

    def close(self) -> None:
        """Let another process write the folder."""
        if self.lock:
            self.lock.release()
            self.lock = None

    def _drop_partial_line(self) -> None:
        """Cut a last line an interruption left short, and make sure the journal takes new rows: a point measured
        into a journal that cannot be appended to would be lost (RunFolderError before any point)."""
        path = self.folder / ROWS
        data = reading.read_bytes(path, reading.TABLE, in_folder(path))
        try:
            with open(path, "r+b") as f:
                if data and not data.endswith(b"\n"):
                    f.truncate(data.rfind(b"\n") + 1)
        except OSError as e:
            raise RunFolderError(f"{path} cannot be appended to ({e.strerror or e}): the points this resume measures "
                                 f"would be lost; make it writable, or start a new --out") from None

    # ------------------------------------------------------------ rows
    def start(self, point) -> None:
        """Note in ``started.jsonl`` that ``point`` begins, before any of its work: a run that ends inside a point
        (the node lost, kill -9) then names it.  Not flushed to disk: the process dying keeps it, only the machine
        dying may not."""
        mark = {**dict(zip(KEY, point.key)), "pid": os.getpid()}
        fd = os.open(self.folder / STARTED, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        with os.fdopen(fd, "a") as f:
            f.write(json.dumps(mark) + "\n")

    def append(self, row: dict) -> None:
        """Record one finished point durably before the sweep moves on."""
        self.extend([row])

    def extend(self, rows: list[dict]) -> None:
        """Record several rows durably with one flush to disk (a merge writes hundreds at once).  A write the system
        refuses (a full disk, a file-size limit) leaves the journal as it was and ends the run (JournalError): the
        rows before it are kept, and --resume continues from them."""
        data = memoryview("".join(json.dumps(row, default=_json_default) + "\n" for row in rows).encode())
        try:
            fd = os.open(self.folder / ROWS, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        except OSError as e:
            raise JournalError(self.folder, e) from None
        try:
            kept = os.fstat(fd).st_size
            while data:
                data = data[os.write(fd, data):]
            os.fsync(fd)
        except OSError as e:
            with contextlib.suppress(OSError):  # else a resume drops the part of a line written
                os.ftruncate(fd, kept)
            raise JournalError(self.folder, e) from None
        finally:
            os.close(fd)

    def rows(self) -> list[dict]:
        """Every complete row, one per key (the last one wins): ``tables.journal``."""
        return journal(self.folder / ROWS)

    def done(self, again: tuple[str, ...] = ()) -> set[tuple]:
        """The keys of the points recorded, less those whose status is in ``again`` (``--retry-crashed``)."""
        return {tuple(r[k] for k in KEY) for r in self.rows() if r["status"] not in again}

    def unfinished(self) -> list[tuple]:
        """The points that began and never got a row: ``tables.unfinished``."""
        return unfinished(self.folder)

    # ------------------------------------------------------------ metadata and tables
    def meta(self) -> dict:
        return read_meta(self.folder)

    def update_meta(self, **changes) -> dict:
        """meta.json with ``changes`` (keys the schema defines); keys someone added by hand are kept."""
        meta = {**self.meta(), **schema.check_meta(changes)}
        write_meta(self.folder, meta)
        return meta

    def finalize(self, derive=None, **meta_updates) -> pd.DataFrame:
        """Write results.csv and samples.csv.gz from rows.jsonl (atomically) and update meta.json;
        ``derive(table, peaks)`` adds the columns that need other rows (analysis.derived)."""
        rows = self.rows()
        table = to_table(rows)
        table = derive(table, self.meta().get("peaks")) if derive else table
        atomic_write(self.folder / TABLE, table.to_csv(index=False))
        (self.folder / (TABLE + ".gz")).unlink(missing_ok=True)  # a copy of an older table: this one replaces it
        atomic_write(self.folder / SAMPLES, gzipped(to_samples(rows).to_csv(index=False)))
        (self.folder / SAMPLES.removesuffix(".gz")).unlink(missing_ok=True)  # an older version's, on resume
        counts = table["status"].value_counts().to_dict() if len(table) else {}
        self.update_meta(**{**meta_updates, "rows": len(table), "status_counts": counts})
        return table


def refuse_odd_files(folder: Path) -> None:
    """RunFolderError when a file the run writes in ``folder`` is there as a link, a hard link (a file with other
    names) or anything but a regular file, or it or the folder cannot be written: a resume appends to the journal
    and renames the tables over their old selves, which would write through a link or replace it, or fail once its
    points have run; checked before any point runs."""
    for name in (ROWS, STARTED, META, SCENARIO, TABLE, TABLE + ".gz", SAMPLES, SAMPLES.removesuffix(".gz"), LOCK):
        path = Path(folder) / name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            raise RunFolderError(f"{path} is a symbolic link (to {os.readlink(path)}): a run folder's files are its "
                                 f"own; replace the link with the file, or start a new --out")
        if not stat.S_ISREG(st.st_mode):
            raise RunFolderError(f"{path}: not a regular file but {paths.file_kind(st.st_mode)}; a run folder's files "
                                 f"are its own: move it away, or start a new --out")
        if st.st_nlink > 1:
            raise RunFolderError(f"{path} has {st.st_nlink - 1} other name(s) (a hard link): a run folder's files are "
                                 f"its own; replace it with a copy of its own, or start a new --out")
        if not os.access(path, os.W_OK):  # read-only, or immutable: the run would fail on it after its points
            raise RunFolderError(f"{path} cannot be written (read-only or immutable): a resume rewrites it; make it "
                                 f"writable, or start a new --out")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise RunFolderError(f"{folder} cannot be written: a resume writes its tables beside the old ones; make it "
                             f"writable, or start a new --out")


def write_meta(folder: Path, meta: dict) -> None:
    """meta.json, written atomically with the current format_version."""
    meta = {**meta, "format_version": schema.FORMAT_VERSION}
    atomic_write(Path(folder) / META, json.dumps(meta, indent=2, sort_keys=True, default=_json_default) + "\n")


def read_rows(folder) -> list[dict]:
    """A run's rows with their samples: from the journal, or rebuilt from results.csv and samples.csv.gz
    (published folders do not carry the journal); implementations by their current names."""
    store = RunStore(folder)
    if (store.folder / ROWS).exists():
        rows = _journal(store.folder, read_meta(folder) if (store.folder / META).is_file() else {})
        return renamed(rows, folder)  # each row checked as the journal is read
    table = read_csv(stored(store.folder, TABLE), (*KEY, "status"))
    grouped = {}
    samples_file = stored(store.folder, SAMPLES)
    if samples_file.exists():
        samples = read_csv(samples_file, (*KEY, "kind", "value_us"))
        grouped = {key: {kind: g["value_us"].tolist() for kind, g in rows.groupby("kind")}
                   for key, rows in samples.groupby(list(KEY))}
    rows = []
    for row in table.to_dict("records"):
        row = {k: v for k, v in row.items() if not (isinstance(v, float) and v != v)}
        row["samples"] = grouped.get(tuple(row[k] for k in KEY), {})
        rows.append(row)
    _check_samples(rows, samples_file)
    return renamed(rows, folder)


def _journal(folder: Path, meta: dict) -> list[dict]:
    """The journal's rows, once the folder's table (where it has one) agrees with them."""
    rows = RunStore(folder).rows()
    refuse_stale_table(folder, rows, meta.get("state"))
    return rows


def _check_samples(rows: list[dict], path: Path) -> None:
    try:
        checks.samples(rows)
    except ValueError as e:
        raise RunFolderError(f"{path}: {e}") from None


def load(folder, derive=None) -> tuple[pd.DataFrame, dict]:
    """A run's table (every schema column) and metadata, rebuilt from rows.jsonl when the run never
    finished (``derive`` then adds what finalize would have).  RunFolderError for anything that is
    not a readable run folder."""
    meta = read_meta(folder)
    folder = Path(folder)
    if (folder / ROWS).exists():
        table = to_table(renamed(_journal(folder, meta), folder))
        return (derive(table, meta.get("peaks")) if derive else table), meta
    table = with_columns(read_csv(stored(folder, TABLE), (*KEY, "status")))
    table["impl"] = table["impl"].replace(impl_renames(folder))
    return table, meta


def _json_default(value):
    if hasattr(value, "item"):
        return value.item()
    return str(value)
