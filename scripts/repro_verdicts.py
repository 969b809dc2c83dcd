"""Each committed reproducer beside the suite's own verdict on the same parts, on this GPU and release.

    python3 scripts/repro_verdicts.py OUT [REF ...] [--jobs N]   (default: every script under repro/, one at a time)

For each bug: run ``repro/REF.py`` on its own (its output and exit status), then, in a fresh process,
the suite's code on the script's parts (``make.for_bug``'s, which the committed script's code must be): a
``first`` part built and run, a checked part gated (``core.gate.check``: random and probe inputs), timed
parts gated and timed with the suite's CUDA-graph timer.  The two verdicts must agree: the script exits 1
exactly where the suite's gate fails (for a docs gap, where the call's wrong rows are not the ones its declared rule
predicts: the script holds it to that rule; for the cliff, where the CUDA-core call on the full table takes nearer
a plain read of every page than the call on the trimmed table: ``cliff.reads_every_page``).
Writes OUT/verdicts.json (rows of bugs run again replace their old ones) and OUT/REF.log; prints a table.
A call that crashes the process's CUDA context counts as a failed gate, as in the sweep.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import importlib
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def suite_verdict(ref: str) -> dict:
    """The suite's verdict on the bug's parts, in this process: each part's case and gate verdict (a control planned
    with its keywords as the script plans it), and for the cliff its calls' times and a plain read of every page's
    from the suite's timer."""
    import torch

    from swabench.core import workloads
    from swabench.impls import registry
    from swabench.measure import timing
    from swabench.repro import bugs, cliff, make

    bug = bugs.get(ref)
    designed = bug.filing.kind == "FlashInfer docs gap"  # the call is held to its declared rule, as its script does
    _, parts = make.for_bug(ref)  # the script's own parts: one request, plain wrappers where it shows so
    said = {"where": parts[0].case.label + (f"; fixed in {bug.fixed_in}" if bug.fixed_in else ""), "parts": []}
    times, table = [], None
    for p in parts:
        w = workloads.build(p.case, "cuda")
        runner = registry.get(p.impl).make(w, p.backend)
        with planned_with(dict(p.plan_keywords)):
            runner.plan()
        if p.role == "first":
            runner.run()
            torch.cuda.synchronize()
            continue
        try:
            passed, reason = gated(runner, w, p, designed and p.role == "checked")
        except Exception as e:  # as the sweep records it: a call that crashes is a failed point
            passed, reason = False, f"{type(e).__name__}: {str(e).splitlines()[0]}"
            said["parts"].append({"impl": p.impl, "role": p.role, "case": p.case.label, "passed": passed,
                                  "reason": reason})
            break
        said["parts"].append({"impl": p.impl, "role": p.role, "case": p.case.label, "passed": passed,
                              "reason": reason})
        if p.role == "timed":
            kernel, _ = timing.cuda_graph_time(runner.run)
            times.append(kernel.median_us)
            if p.impl == cliff.CALLS[0][0]:  # the call, on the full table: what a read of every page reads
                table = (w.k_store, w.v_store)
    checked = [part for part in said["parts"] if part["role"] != "control"]
    wrong = not all(part["passed"] for part in checked)
    controls = [part["passed"] for part in said["parts"] if part["role"] == "control"]
    said["control_right"] = all(controls) if controls else None
    if times and len(times) == sum(p.role == "timed" for p in parts):  # else an arm crashed: the gate failed
        every_page, _ = timing.cuda_graph_time(lambda: (table[0].sum(), table[1].sum()))  # as the script reads them
        said["times_us"], said["every_page_us"] = times, every_page.median_us
        said["ratio"] = times[0] / times[1]
        said["slow"] = cliff.reads_every_page(times[0], times[1], every_page.median_us)
    said["exit"] = 1 if wrong or said.get("slow") else 0
    return said


def gated(runner, w, part, designed: bool = False) -> tuple[bool, str]:
    """(passed, reason) of a planned part on its workload: the gate's verdict, or for a docs gap's call
    (``designed``) whether it is wrong on exactly the rows the rule its path declares predicts, as its script holds
    the call to that rule."""
    import torch

    from swabench.core import gate
    from swabench.impls import registry

    if not designed:
        result = gate.check(runner, w)
        return result.passed, result.reason
    predicted = torch.cat(registry.get(part.impl).rows_wrong(part.case, w.qo_lens, w.kv_lens, part.backend))
    result = gate.check(runner, w, predicted=predicted)
    as_designed = bool(result.rows_as_predicted)
    return as_designed, f"{result.wrong_rows} rows differ from the window by depth, " \
                        f"{'as' if as_designed else 'not as'} its declared rule predicts"


@contextlib.contextmanager
def planned_with(keywords: dict):
    """Every FlashInfer wrapper's plan() given ``keywords`` too, as a control's script plans (disable_split_kv)."""
    if not keywords:
        yield
        return
    import flashinfer

    from swabench.repro import standin

    saved = {name: getattr(flashinfer, name).plan for name in standin.WRAPPERS if hasattr(flashinfer, name)}
    for name, plan in saved.items():
        setattr(getattr(flashinfer, name), "plan",
                lambda self, *a, _plan=plan, **k: _plan(self, *a, **{**k, **keywords}))
    try:
        yield
    finally:
        for name, plan in saved.items():
            setattr(getattr(flashinfer, name), "plan", plan)


def judge(ref: str) -> dict:
    """Run the bug's script, then the suite on its parts in a fresh process: what each said (subprocesses alone, so
    that several bugs are judged at once)."""
    from swabench.repro import issue, script_stem

    path = ROOT / "repro" / f"{script_stem(ref)}.py"
    text = path.read_text()
    ran = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=600)
    judged = subprocess.run([sys.executable, __file__, "--suite", ref], capture_output=True, text=True,
                            timeout=600, cwd=ROOT)
    suite = json.loads(judged.stdout.strip().splitlines()[-1]) if judged.returncode == 0 else \
        {"exit": None, "error": judged.stderr[-2000:]}
    lines = ran.stdout.splitlines()
    verdict = next((line for line in lines if line.startswith(issue.VERDICTS)), "")
    control = next((line for line in lines if line.startswith("CONTROL")), "")
    return {"ref": ref, "script_exit": ran.returncode, "suite": suite, "script_said": [verdict, control],
            "log": ran.stdout + ran.stderr, "code": issue.script_code(text), "script_digest": issue.script_digest(text)}


def agreed(said: dict) -> dict:
    """The row of a judged bug: whether the script is the one the suite writes now (``make.for_bug`` traces against a
    stand-in FlashInfer module, so this runs in the main thread), whether the controls agree, and whether the two
    verdicts do."""
    from swabench.repro import issue, make

    ref, suite = said["ref"], said["suite"]
    same_case = said["code"] == issue.script_code(make.for_bug(ref)[0])  # the code that ran
    right = bool(re.search(r": (every row )?right \(", said["script_said"][1]))
    control_agree = suite.get("control_right") is None or right == suite["control_right"]
    agree = suite.get("exit") == said["script_exit"] and same_case and control_agree
    return {"ref": ref, "case": suite.get("where", ""), "script_exit": said["script_exit"], "suite": suite,
            "same_case": same_case, "control_agree": control_agree, "agree": agree,
            "script_said": said["script_said"], "log": said["log"], "script_digest": said["script_digest"]}


def main(out: Path, refs: list[str], jobs: int = 1) -> int:
    """Judge every bug, ``jobs`` at a time; a timed bug (the cliff) alone, after the others, so that nothing else
    runs on the GPU while it is timed."""
    from swabench.repro import bugs, committed

    out.mkdir(parents=True, exist_ok=True)
    refs = refs or list(committed(ROOT / "repro"))
    timed = [ref for ref in refs if bugs.get(ref) and bugs.get(ref).twin]
    print(said_where(len(refs), jobs), flush=True)
    disagree = 0
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        judged = concurrent.futures.as_completed([pool.submit(judge, ref) for ref in refs if ref not in timed])
        for done in itertools.chain(judged, (pool.submit(judge, ref) for ref in timed)):
            row = agreed(done.result())
            disagree += not row["agree"]
            record(out, row)
    return 1 if disagree else 0


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return int(text)


def arguments(argv=None) -> argparse.Namespace:
    """The command line, every argument checked before anything runs: OUT a folder (or nothing yet), each REF a
    committed script's, --jobs 1 or more, and flashinfer and torch importable (the scripts and the suite's parts
    run on them)."""
    from swabench.errors import UserError
    from swabench.repro import committed, script_stem, unknown_ref
    from swabench.store import paths

    parser = argparse.ArgumentParser(description="Each committed reproducer beside the suite's verdict.")
    parser.add_argument("out", type=Path, metavar="OUT", help="where verdicts.json and each script's log go")
    parser.add_argument("refs", nargs="*", metavar="REF", help="a bug whose script to run (default: every one)")
    parser.add_argument("--jobs", type=positive, default=1, help="bugs judged at once (a timed one always alone)")
    args = parser.parse_args(argv)
    unknown = unknown_ref(args.refs, ROOT / "repro")
    if unknown:
        parser.error(unknown)
    known = committed(ROOT / "repro")
    try:
        paths.folder_out(args.out, "OUT")
        for ref in args.refs or known:
            paths.file_out(args.out / f"{script_stem(ref)}.log", "OUT's log")
        kept_rows(args.out)
    except UserError as e:
        parser.error(str(e))
    for module in ("torch", "flashinfer"):
        try:
            importlib.import_module(module)
        except Exception as e:  # not installed, or an install that fails on import
            parser.error(f"{module} does not import here ({type(e).__name__}: {e}); the scripts and the suite's "
                         f"verdicts run on a GPU node with it installed (docs/gpu-node.md)")
    return args


def said_where(scripts: int, jobs: int) -> str:
    """The call.log line that says when, on what and at which commit ($COMMIT, as the caller names it) this ran."""
    import datetime

    import flashinfer
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return (f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {gpu}, flashinfer "
            f"{flashinfer.__version__}, checkout {os.environ.get('COMMIT', 'not named')}: scripts/repro_verdicts.py "
            f"on {scripts} script{'s' * (scripts != 1)}, {jobs} at once")


def record(out: Path, row: dict) -> None:
    """Write the bug's log, print its line and put its row in OUT/verdicts.json at once, so that a call cut short
    keeps what it judged (a later call for some bugs replaces their rows and keeps the rest)."""
    from swabench.repro import script_stem
    from swabench.store import run_folder

    run_folder.atomic_write(out / f"{script_stem(row['ref'])}.log", row.pop("log"))
    suite = row["suite"]
    why = ([] if row["same_case"] else ["another case"]) + ([] if row["control_agree"] else ["the controls differ"])
    print(f"{row['ref']:32s} script exit {row['script_exit']}  suite {suite.get('exit')}  "
          f"{'agree' if row['agree'] else 'DISAGREE'}" + (f"  ratio {suite['ratio']:.2f}" if "ratio" in suite else "")
          + "".join(f"  ({w})" for w in why), flush=True)
    kept = [r for r in kept_rows(out) if r["ref"] != row["ref"]]
    run_folder.atomic_write(out / "verdicts.json", json.dumps(sorted(kept + [row], key=lambda r: r["ref"]), indent=1)
                            + "\n")


def kept_rows(out: Path) -> list[dict]:
    """The rows OUT/verdicts.json holds (none where there is none yet); a UserError naming it where it is not a list
    of rows that each name their bug."""
    from swabench.store import paths, reading

    path = paths.file_out(out / "verdicts.json", "OUT's verdicts.json")
    if not path.exists():
        return []
    rows = reading.json_file(path, reading.META)
    if not isinstance(rows, list) or not all(isinstance(r, dict) and isinstance(r.get("ref"), str) for r in rows):
        raise reading.ReadError(f"{path}: not a list of verdict rows, each naming its bug (ref); move it away")
    return rows


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    if sys.argv[1:2] == ["--suite"]:
        print(json.dumps(suite_verdict(sys.argv[2])))
    else:
        args = arguments()
        sys.exit(main(args.out, args.refs, args.jobs))
