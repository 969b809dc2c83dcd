"""Why does a cold FlashAttention-4 ragged kernel kill `swabench run`?  Each hypothesis runs in a process of its own
with a fresh, empty FA4 disk cache (FLASH_ATTENTION_CUTE_DSL_CACHE_DIR in a temporary folder), at the ragged extend
the suite runs (4 requests of 64 queries after 512 keys, 32/8 heads, head_dim 128, bf16, causal, window 127,
num_splits=1: the call of swabench's Fa4Runner), each output checked against a float32 reference; a table says how
each process ended.  On a GPU node with flash-attn-4 (and FlashInfer and the cuDNN frontend for the variants that
import them), from the checkout's root:

    python scripts/fa4_cold_crash.py                        # every variant, 4 at a time: 2-3 minutes on an H100
    python scripts/fa4_cold_crash.py --only bare,concurrent,suite --repeat 3
    python scripts/fa4_cold_crash.py --add "mine=flashinfer+real-thread"    # a variant of your own conditions
    python scripts/fa4_cold_crash.py --only suite --suite-root /path/to/other/checkout   # another swabench's run
    python scripts/fa4_cold_crash.py --list                 # the variants and what each condition does

Nothing of swabench is imported: the `suite` variants run `python -m swabench run --impl fa4-window` on a scenario
written into the temporary folder (the ragged extends of the four kernels the `concurrent` condition compiles, four
module signatures).  Every other variant runs scripts/fa4_cold_child.py (torch and flash_attn.cute), which enables
faulthandler (all threads) and says when each cute.compile, each disk-cache export and each first call starts and
ends, so the tail of a dead child says where it died.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from fa4_cold_child import CONCURRENT, MARK  # noqa: E402  (the child's own module: stdlib at import)

SCENARIO = dict(name="fa4-cold-ragged", description="the ragged extends of scripts/fa4_cold_crash.py",
                implementations=["fa4-window"])  # then [fixed], and a [[sweep]] a kernel of the concurrent condition
CONDITIONS = {
    "flashinfer": "import flashinfer (it imports the CuTe DSL) before flash_attn.cute, as a run's metadata does",
    "cudnn": "import cudnn and load its library (backend_version), as a run's metadata does",
    "nvtx": "every call inside an NVTX range, as the suite's warm-up and points are",
    "nvml": "NVML initialised and the SM clock read, as the suite's timer does",
    "peaks": "a bf16 8192^3 matmul and a 1 GiB copy first, as a run's peaks",
    "warmup-thread": "the suite's warm-up first: its tiny case (1 x 4 queries after 64 keys) in a pool of 8 threads",
    "warmup-main": "the tiny case first, in the main thread",
    "real-thread": "the point's call in a pool thread instead of the main thread",
    "bigstack": "threads get a 512 MiB stack (threading.stack_size)",
    "concurrent": "4 ragged kernels (d128; d64 with sinks; soft-cap 50; no window) compiled at once by 4 threads",
    "same-key": "2 threads compile the point's kernel at once (window 127 and 128 share FA4's compile key)",
    "paged-first": "a paged call of the point's shape compiled and run first",
    "paged": "the point paged (page_table, seqused_k) instead of ragged",
    "capture-first": "the point's first call inside a CUDA graph capture",
    "graph": "after its first call, the suite's timer: a side-stream call, a graph of 2 calls, replays",
    "no-disk-cache": "FA4's disk cache off (FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=0): nothing exported",
    "suite": "`python -m swabench run` --impl fa4-window of the 4 concurrent kernels' ragged extends (the suite)",
    "faulthandler": "(suite only) PYTHONFAULTHANDLER=1: the Python stack of every thread at a fatal signal",
}
SUITE_LIKE = ("flashinfer", "cudnn", "nvtx", "nvml", "peaks", "warmup-thread", "graph")
VARIANTS = {
    "bare": (), "suite": ("suite",), "concurrent": ("concurrent",), "same-key": ("same-key",),
    "warmup-thread": ("warmup-thread",), "thread": ("real-thread",), "suite-like": SUITE_LIKE,
    "imports-first": ("flashinfer", "cudnn", "nvtx", "nvml"), "flashinfer-first": ("flashinfer",),
    "cudnn-first": ("cudnn",), "bigstack": ("real-thread", "bigstack"), "paged-then-ragged": ("paged-first",),
    "tiny-then-real": ("warmup-main",),
    "suite-like-serial": tuple(c if c != "warmup-thread" else "warmup-main" for c in SUITE_LIKE),
    "suite-like-no-disk-cache": SUITE_LIKE + ("no-disk-cache",), "nvtx-graph": ("nvtx", "graph"),
    "capture-first": ("capture-first",), "bare-paged": ("paged",), "suite-faulthandler": ("suite", "faulthandler"),
}
DISTRIBUTIONS = ("torch", "flash-attn-4", "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base",
                 "nvidia-cutlass-dsl-libs-core", "nvidia-cutlass-dsl-libs-cu12", "nvidia-cutlass-dsl-libs-cu13",
                 "quack-kernels", "apache-tvm-ffi", "torch-c-dlpack-ext", "flashinfer-python", "nvidia-cudnn-frontend")


class InputError(Exception):
    """A bad argument: the message names it and the allowed values."""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--only", default="", help="comma-separated variants (--list names them); default: all")
    p.add_argument("--add", action="append", default=[], metavar="NAME=COND+COND", help="a variant of your own")
    p.add_argument("--repeat", type=int, default=1, help="runs of each variant (races need several)")
    p.add_argument("--jobs", type=int, default=4, help="variants run at once, each in its own process")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a variant may take before it is killed")
    p.add_argument("--deadline", type=float, default=570.0, help="seconds after which no further variant starts")
    p.add_argument("--tail", type=int, default=12, help="lines of a failed variant's output to print")
    p.add_argument("--suite-root", type=Path, default=ROOT, help="the checkout whose `python -m swabench` runs")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, caches, run folders)")
    p.add_argument("--list", action="store_true", help="print the variants and conditions, then exit")
    args = p.parse_args(argv)
    args.variants = chosen(args.only, args.add)
    for name, low in (("--repeat", 1), ("--jobs", 1), ("--timeout", 1), ("--tail", 0)):
        if getattr(args, name[2:]) < low:
            raise InputError(f"{name} must be at least {low}, not {getattr(args, name[2:])}")
    if any("suite" in conds for conds in args.variants.values()) and not (args.suite_root / "swabench").is_dir():
        raise InputError(f"--suite-root {args.suite_root}: no swabench package there (a checkout's root, or leave "
                         "out the suite variants with --only)")
    return args


def chosen(only: str, added: list[str]) -> dict[str, tuple[str, ...]]:
    """The variants to run: --only's names (all where empty) and the --add ones, each checked."""
    variants = dict(VARIANTS)
    for text in added:
        name, _, conds = text.partition("=")
        if not name or not conds or name in VARIANTS:
            raise InputError(f"--add {text!r}: give NAME=COND+COND with a NAME none of the variants has")
        variants[name] = tuple(conds.split("+"))
    for name, conds in variants.items():
        unknown = [c for c in conds if c not in CONDITIONS]
        if unknown:
            raise InputError(f"--add {name}: unknown condition {', '.join(unknown)}; allowed: {', '.join(CONDITIONS)}")
        if "suite" in conds and set(conds) - {"suite", "faulthandler", "no-disk-cache"}:
            raise InputError(f"--add {name}: suite takes only faulthandler and no-disk-cache beside it")
    names = [n.strip() for n in only.split(",") if n.strip()] or list(VARIANTS)
    unknown = [n for n in names if n not in variants]
    if unknown:
        raise InputError(f"--only: unknown variant {', '.join(unknown)}; allowed: {', '.join(variants)}")
    return {n: variants[n] for n in dict.fromkeys(names + [a.partition("=")[0] for a in added])}


# ---------------------------------------------------------------- the parent: run each variant, read how it ended

def run_variant(name: str, conds: tuple[str, ...], folder: Path, timeout: float, suite_root: Path) -> dict:
    folder.mkdir(parents=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(folder / "fa4cache"),
           "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "0" if "no-disk-cache" in conds else "1",
           "CUTE_DSL_CACHE_DIR": str(folder / "dslcache")}
    if "suite" in conds:
        (folder / "scenario.toml").write_text(scenario_text())
        cmd = [sys.executable, "-m", "swabench", "run", str(folder / "scenario.toml"), "--impl", "fa4-window",
               "--out", str(folder / "run")]
        env.update({"PYTHONFAULTHANDLER": "1"} if "faulthandler" in conds else {})
    else:
        cmd = [sys.executable, str(HERE / "fa4_cold_child.py"), ",".join(conds)]
    started, timed_out = time.monotonic(), False
    with open(folder / "log.txt", "wb") as log:
        child = subprocess.Popen(cmd, cwd=suite_root if "suite" in conds else None, env=env, stdin=subprocess.DEVNULL,
                                 stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = child.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)  # the child's session: it and whatever it started
            rc, timed_out = child.wait(), True
    text = (folder / "log.txt").read_text(errors="replace")
    rows = read_rows(folder / "run") if "suite" in conds else None
    return {"name": name, "conds": conds, "rc": rc, "signal": signal_name(rc), "seconds": time.monotonic() - started,
            "verdict": verdict(rc, text, timed_out, rows), "where": where(text), "text": text,
            "objects": len(list((folder / "fa4cache").rglob("*.o")))}


def scenario_text() -> str:
    """The suite's scenario: the ragged extend of each of the concurrent condition's kernels (REAL first), four module
    signatures of fa4-window, which a warm-up that builds them at once builds in four threads."""
    line = lambda k, v: f"{k} = {json.dumps(v)}"  # noqa: E731  (JSON's strings, numbers, booleans, lists are TOML's)
    text = [*(line(k, v) for k, v in SCENARIO.items()), "", "[fixed]", line("dtype", "bfloat16"),
            line("backend", "fa4"), line("storage", "ragged"), line("mode", "extend")]
    for spec in CONCURRENT:
        text += ["", "[[sweep]]", *(line(k, spec[v]) for k, v in (
            ("num_qo_heads", "heads"), ("num_kv_heads", "kv_heads"), ("head_dim", "head_dim"), ("extend_len", "q_len"),
            ("prefix_len", "prefix"), ("batch_size", "batch"), ("sinks", "sinks"), ("logits_soft_cap", "softcap"))),
            line("window_left", -1 if spec["window"] is None else spec["window"])]
    return "\n".join(text) + "\n"


def read_rows(run: Path) -> list[dict]:
    path = run / "rows.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def signal_name(rc: int | None) -> str:
    """The signal that ended a process: a negative return code, or a shell's 128 + N."""
    number = -rc if rc is not None and rc < 0 else rc - 128 if rc is not None and 128 < rc < 160 else None
    if number is None:
        return ""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def verdict(rc: int | None, text: str, timed_out: bool = False, rows: list[dict] | None = None) -> str:
    if timed_out:
        return "HUNG (killed)"
    if signal_name(rc):
        return f"CRASH {signal_name(rc)}"
    crashed = [r for r in rows or [] if r.get("status") == "crash"]
    if crashed:
        return f"CRASH row: {plain(crashed[0].get('reason'))}"
    rows = [r for r in rows or [] if r.get("status")] if rows is not None else None  # a journal's starts have none
    if rows is not None and rc in (0, 1):
        statuses = sorted({r["status"] for r in rows})
        bad = [r for r in rows if r.get("status") not in ("pass", "xfail")]
        return "ok" if rows and not bad else f"{'/'.join(map(str, statuses)) or 'no rows'}: " + \
            (plain(bad[0].get("reason")) if bad else "")
    said = marks(text)[-1:] or [""]
    if rc == 0 and said[0] == "RESULT ok":
        return "ok"
    if rc == 0 or said[0].startswith("RESULT wrong"):
        return "WRONG OUTPUT" if said[0].startswith("RESULT wrong") else "ended without a result"
    errors = [line.strip() for line in text.splitlines() if line[:1].isalpha() and ("Error" in line.split(":")[0])]
    return f"error rc {rc}: {plain(errors[-1])}" if errors else f"error rc {rc}"


def plain(text, width: int = 70) -> str:
    """A message on one table line: no terminal colours, its whitespace one space, cut at ``width``."""
    return " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(text)).split())[:width]


def where(text: str) -> str:
    """Where a child was when it ended: the innermost frame of the thread faulthandler names, else its last mark."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Current thread") or (line.startswith("Fatal Python error") and not any(
                later.startswith("Current thread") for later in lines[i:])):
            frame = next((f.strip() for f in lines[i + 1:] if f.strip().startswith("File ")), "")
            if frame:
                path, _, rest = frame[len('File "'):].partition('", line ')
                return f"{Path(path).name}:{rest.replace(' in ', ' ')}"
    said = marks(text)
    return said[-1] if said else ""


def marks(text: str) -> list[str]:
    """What the child said, in order: each mark line's message (after its time and thread)."""
    return [line.split("] ", 2)[-1] for line in text.splitlines() if line.startswith(MARK)]


def table(results: list[dict]) -> str:
    head = "| hypothesis | rc | signal | verdict | died in / last step | s | cache .o |\n|---|---|---|---|---|---|---|"
    return "\n".join([head] + [f"| {r['name']} | {r['rc']} | {r['signal']} | {r['verdict']} | {r['where'][:60]} | "
                               f"{r['seconds']:.0f} | {r['objects']} |" for r in results])


def reading(results: list[dict]) -> str:
    """What the rows say together: the control, and the conditions every crashed variant shares and none passed has."""
    ok = [r for r in results if r["verdict"] == "ok"]
    bad = [r for r in results if r["verdict"] != "ok" and r["verdict"] != "not run"]
    said = [f"passed: {', '.join(r['name'] for r in ok) or '-'}", f"failed: {', '.join(r['name'] for r in bad) or '-'}"]
    control = [r for r in results if r["conds"] == ()]
    if control and any(r["verdict"] != "ok" for r in control):
        said.append("the control (bare: torch and flash_attn.cute alone) did not pass: what ended it happens "
                    "outside the suite's process (its lines above say what); the other rows isolate nothing")
    synthetic = [r for r in bad if "suite" not in r["conds"]]
    if synthetic:
        shared = set.intersection(*(set(r["conds"]) for r in synthetic))
        shared -= set().union(*(set(r["conds"]) for r in ok))
        said.append(f"conditions in every failed variant and in no passed one: {', '.join(sorted(shared)) or 'none'}")
    return "\n".join(said)


def preamble(tmp: Path) -> str:
    import importlib.metadata as metadata
    import resource

    def version(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "-"
    stack = resource.getrlimit(resource.RLIMIT_STACK)[0]
    return "\n".join([f"python {sys.version.split()[0]} ({sys.executable}); stack limit (ulimit -s) "
                      f"{'unlimited' if stack == resource.RLIM_INFINITY else f'{stack >> 10} KiB'}; folder {tmp}",
                      ", ".join(f"{d} {version(d)}" for d in DISTRIBUTIONS)])


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.list:
        print("\n".join([f"{n}: {'+'.join(c) or '(nothing beside torch and FA4)'}" for n, c in args.variants.items()]
                        + [""] + [f"{c}: {d}" for c, d in CONDITIONS.items()]))
        return 0
    tmp, started = Path(tempfile.mkdtemp(prefix="fa4cold-")), time.monotonic()
    print(preamble(tmp), flush=True)
    runs = [(f"{n}#{i}" if args.repeat > 1 else n, c)
            for n, c in args.variants.items() for i in range(1, args.repeat + 1)]

    def one(run):
        name, conds = run
        if time.monotonic() - started > args.deadline:
            return {"name": name, "conds": conds, "rc": None, "signal": "", "seconds": 0.0, "verdict": "not run",
                    "where": f"past --deadline {args.deadline:.0f} s", "text": "", "objects": 0}
        result = run_variant(name, conds, tmp / name.replace("#", "-"), args.timeout, args.suite_root)
        print(f"{name}: {result['verdict']} ({result['seconds']:.0f} s)", flush=True)
        return result
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(one, runs))
    print("\n" + "\n".join(f"{r['name']}: {'+'.join(r['conds']) or 'bare'}" for r in results) + "\n")
    print(table(results) + "\n")
    for r in results:
        if r["verdict"] not in ("ok", "not run"):
            print(f"--- {r['name']}: last {args.tail} lines\n" + "\n".join(r["text"].splitlines()[-args.tail:]))
    print("\n" + reading(results))
    if not args.keep:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if all(r["verdict"] in ("ok", "not run") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
