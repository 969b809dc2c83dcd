"""A trace from FlashInfer's own API log: what every wrapper's ``plan()`` received on a running server,
read back as the steps ``swabench replay`` takes (docs/serving-paths.md, "Capturing a trace").

With ``FLASHINFER_LOGLEVEL=10`` FlashInfer (0.6.1 and later) writes one folder per logged call,
``<time>_pid<PID>_<Class.method>_call<NNNN>/``, holding ``inputs.pt`` (the call's tensors, by
``arg_<i>`` / ``kwarg_<name>``) and ``metadata.jsonl`` (its scalars, the signature it was called
through, and ``execution_status``: ``inputs_saved``, then ``completed``); ``session.jsonl`` beside
them repeats every record in call order.  ``FLASHINFER_DUMP_INCLUDE="*Wrapper.plan"`` keeps the log to
the plan calls, whose tensors are index arrays, never the KV cache.

Each plan with a window (``window_left >= 0``) becomes a trace line (``inputs.plan_calls``).  Identical
steps are merged into one line with a count.  Where the log holds the ``run()`` calls too, a plan counts
once per run (one per layer that shares it); where it does not, once per plan, and the summary says so.

A server's log runs to a million calls: it is read as a stream (session.jsonl line by line, one call
folder at a time), keeping a count per distinct step and the plan each wrapper object last made.  A log
cut short by a stopped process (the last line of session.jsonl or of a call's metadata.jsonl cut) keeps
its intact calls, and the summary names what was cut.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from swabench.errors import UserError
from swabench.inputs import plan_calls
from swabench.inputs.plan_calls import VERIFY_MAX, WRAPPERS

CALL_FOLDER = re.compile(r"^(\d{8}_\d{6}_\d{3})_pid(\d+)_(.+)_call(\d{4,})$")
INCLUDE = "*Wrapper.plan"  # FLASHINFER_DUMP_INCLUDE: the plan calls alone (add *Wrapper.run to count layers)
NEVER_RUN = "planned and never run (no run() call of its wrapper logged after it)"
CUT = "its metadata.jsonl ends in a cut record (the process stopped while writing it)"


class DumpError(UserError, ValueError):
    def __init__(self, where, message: str):
        super().__init__(f"{where}: {message}")


@dataclass
class Imported:
    """What an import found: the trace's lines (JSON objects, counts merged), and what it left out."""

    lines: list[dict]
    plans: int  # plan calls of the wrappers above that completed
    runs_logged: bool  # whether the log held run() calls (then counts weigh the layers that share a plan)
    left_out: Counter = field(default_factory=Counter)  # why -> plan calls not imported
    releases: set = field(default_factory=set)  # the FlashInfer releases that wrote the log
    cut: list = field(default_factory=list)  # what a stopped process left cut short: session.jsonl's line, calls

    def summary(self) -> str:
        steps = sum(line["count"] for line in self.lines)
        said = [f"{self.plans} plan calls of FlashInfer {', '.join(sorted(self.releases)) or '(release unknown)'}: "
                f"{len(self.lines)} trace lines, {steps} steps"]
        said += [f"  {n} not imported: {why}" for why, n in self.left_out.most_common()]
        if self.cut:
            shown = ", ".join(self.cut[:5]) + (f" and {len(self.cut) - 5} more" if len(self.cut) > 5 else "")
            said.append(f"  cut short (a stopped process; the intact calls were imported): {shown}")
        said.append("  counts are run() calls (one per layer that shares a plan)" if self.runs_logged else
                    "  counts are plan calls: the log holds no run() calls, so the layers that share a plan are not "
                    "counted (log *Wrapper.run too to count them; that also writes the KV cache)")
        return "\n".join(said)


def read(dump: Path, bucket: int = 1, progress=None, verify_max: int = VERIFY_MAX) -> Imported:
    """The trace lines of a FlashInfer API log folder; DumpError naming the problem for a folder that is
    no dump, a corrupt one, or one with no plan that has a window.  ``progress`` (start, advance, finish:
    the CLI's bar) is told of each call read."""
    dump = Path(dump)
    if not dump.is_dir():
        raise DumpError(dump, "not a folder")
    total, last = _survey(dump)
    if not total:
        raise DumpError(dump, "not a FlashInfer API log: no call folders (<time>_pid<PID>_<Class.method>_call<NNNN>); "
                              "set FLASHINFER_LOGLEVEL=10 and FLASHINFER_DUMP_DIR to this folder on the server")
    out = Imported([], 0, False)
    planned, ran = Counter(), Counter()  # step -> plans, runs of it
    pending: dict[tuple, list] = {}  # wrapper object -> [its latest plan's step (or None), runs since]
    refused: dict[str, str | None] = {}  # a distinct step -> why swabench cannot replay it
    if progress:
        progress.start(total, "import", "calls")
    for name, record in _calls(dump, out.cut, last):
        if progress:
            progress.advance(1)
        wrapper, _, method = CALL_FOLDER.match(name).group(3).partition(".")
        if wrapper not in WRAPPERS or method not in ("plan", "run"):
            continue
        key = tuple(v if isinstance(v, (int, str)) else repr(v) for v in
                    (record.get("process_id"), record.get("self_id"))) if record else None
        if method == "run":
            out.runs_logged = True
            if key in pending:
                pending[key][1] += 1
            continue
        step, why = _plan(dump / name, wrapper, record, bucket, verify_max, out)
        if step and step not in refused:
            refused[step] = _refused(json.loads(step))
        why = why or (refused[step] if step else None)
        if why:
            out.left_out[why] += 1
            step = None
        else:
            planned[step] += 1
        if key is not None:
            _settle(pending.get(key), ran, out.left_out)
            pending[key] = [step, 0]
    for plan in pending.values():
        _settle(plan, ran, out.left_out)
    if progress:
        progress.finish()
    if not out.runs_logged:
        del out.left_out[NEVER_RUN]
    counts = ran if out.runs_logged else planned
    out.lines = [{**json.loads(text), "count": counts[text]} for text in planned if counts[text]]
    if not out.lines:
        found = f"{out.plans} plans" + (f" (and {sum(n for why, n in out.left_out.items() if _unfinished(why))} "
                                        f"that did not complete)" if any(map(_unfinished, out.left_out)) else "")
        why = "; ".join(f"{n} {reason}" for reason, n in out.left_out.most_common() if not _unfinished(reason))
        raise DumpError(dump, f"{found}, none with a window" + (f" ({why})" if why else "") +
                        ": nothing to import (a layer with a window plans with window_left >= 0)")
    return out


def _unfinished(why: str) -> bool:
    return why.startswith("the call did not complete")


def _plan(folder: Path, wrapper: str, record: dict | None, bucket: int, verify_max: int,
          out: Imported) -> tuple[str | None, str | None]:
    """A plan call's step (its trace line as JSON, sorted) or why it is left out; counts the completed
    plans and the releases that wrote them into ``out``."""
    if record is None:
        return None, CUT
    status = record.get("execution_status")
    if status != "completed":
        return None, (f"the call did not complete ({status}: it raised, or the process stopped)"
                      if not out.cut or out.cut[-1] != folder.name else CUT)
    out.plans += 1
    versions = record.get("versions")
    if isinstance(versions, dict) and versions.get("flashinfer"):
        out.releases.add(str(versions["flashinfer"]))
    line, why = plan_calls.step(folder, wrapper, record, bucket, verify_max)
    return (json.dumps(line, sort_keys=True) if line else None), why


def _settle(plan: list | None, ran: Counter, left_out: Counter) -> None:
    """A wrapper's plan, superseded (or the log over): its runs count for its step, or it never ran."""
    if plan and plan[0] is not None:
        if plan[1]:
            ran[plan[0]] += plan[1]
        else:
            left_out[NEVER_RUN] += 1


def _refused(step: dict) -> str | None:
    """Why swabench cannot replay this step (a shape or dtype no scenario takes), or None."""
    from swabench.inputs import axes, traces

    try:
        traces.parse(json.dumps(step).encode(), "<plan>")
    except (traces.TraceError, axes.ScenarioError) as e:
        return f"a step swabench does not take ({re.sub(r'^<plan>: line 1[:.] ?', '', str(e))})"
    return None


def _folder_names(dump: Path):
    """The names of the call folders, unordered, one at a time."""
    with os.scandir(dump) as entries:
        for e in entries:
            if CALL_FOLDER.match(e.name) and e.is_dir():
                yield e.name


def _calls(dump: Path, cut: list, last: set[str]):
    """(folder name, its last intact metadata record or None) of every logged call, in call order
    (session.jsonl's, then the folders it does not name, by name); what was cut short goes into ``cut``
    (only the ``last`` calls of their processes may be)."""
    session = dump / "session.jsonl"
    seen: set[str] = set()
    if session.is_file():
        for n, record in _jsonl(session, cut, may_be_cut=True):
            name = Path(str(record.get("dump_dir", ""))).name
            if name in seen:
                continue
            if not CALL_FOLDER.match(name) or not (dump / name).is_dir():
                if record.get("graph_capture_flushed"):
                    continue
                raise DumpError(session, f"line {n} names a call folder that is not here ({name or 'none'}): a dump "
                                         f"copied in part?")
            seen.add(name)
            yield name, _last_record(dump / name, cut, name in last)
    for name in sorted(n for n in _folder_names(dump) if n not in seen):
        yield name, _last_record(dump / name, cut, name in last)


def _survey(dump: Path) -> tuple[int, set[str]]:
    """In one pass over the folder: how many call folders it holds, and each process's last one (by the
    time in its name, to the millisecond, then its number), the only call a stopped process can leave cut."""
    total, last = 0, {}
    for name in _folder_names(dump):
        found = CALL_FOLDER.match(name)
        pid, order = found.group(2), (found.group(1), int(found.group(4)), name)
        last[pid] = max(last.get(pid, order), order)
        total += 1
    return total, {order[-1] for order in last.values()}


def _last_record(folder: Path, cut: list, may_be_cut: bool) -> dict | None:
    """The call's last intact metadata record (None where its only one was cut short, and said: only a
    process's last call may be)."""
    meta = folder / "metadata.jsonl"
    if not meta.is_file():
        raise DumpError(folder, "no metadata.jsonl: a truncated dump (the process stopped while writing this call)")
    records = [r for _, r in _jsonl(meta, cut, may_be_cut, folder.name)]
    if not records and not (cut and cut[-1] == folder.name):
        raise DumpError(meta, "empty: a truncated dump")
    return records[-1] if records else None


def _jsonl(path: Path, cut: list, may_be_cut: bool, name: str | None = None):
    """(line number, record) of a JSON Lines log, read line by line; where the log ``may_be_cut`` (the
    session's, a process's last call's), a last line cut short is noted in ``cut`` (as ``name``, or the
    file's line) and skipped; any other bad line is a DumpError."""
    try:
        with open(path, "rb") as f:
            held = None  # a line that did not parse: fatal unless it is the last
            for n, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                if held:
                    raise DumpError(path, f"line {held[0]} is not JSON ({held[1]}): a corrupt log")
                try:
                    record = json.loads(raw)
                except ValueError as e:  # a JSON or UTF-8 error, or a number of more digits than Python converts
                    from swabench.inputs.traces import not_json

                    held = (n, not_json(e))
                    continue
                except RecursionError:
                    raise DumpError(path, f"line {n} is nested too deeply: not a FlashInfer API log") from None
                if not isinstance(record, dict):
                    raise DumpError(path, f"line {n} is not a JSON object: not a FlashInfer API log")
                yield n, record
    except OSError as e:
        raise DumpError(path, f"cannot be read ({e.strerror or e})") from None
    if held and not may_be_cut:
        raise DumpError(path, f"line {held[0]} is not JSON ({held[1]}): a corrupt log (a stopped process leaves "
                              f"only its last call cut short, and this call is not its last)")
    if held:
        cut.append(name or f"{path.name} line {held[0]}")


def to_jsonl(imported: Imported) -> str:
    return "".join(json.dumps(line) + "\n" for line in imported.lines)
