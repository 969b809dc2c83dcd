#!/usr/bin/env python3
"""Play a serving engine's step sequence through FlashInfer with its API log on, then check that
`swabench import` reads back exactly the steps played (needs CUDA and flashinfer).

    python scripts/play_dump.py OUT [--runs] [--no-log]

OUT/dump/       FlashInfer's own log (FLASHINFER_LOGLEVEL=10, FLASHINFER_DUMP_INCLUDE='*Wrapper.plan', plus
                '*Wrapper.run' with --runs: then counts weigh the layers that share a plan)
OUT/expected.jsonl  the trace lines this script knows it played (from its own lengths, not from the log)
OUT/imported.jsonl  what swabench.inputs.dumps read from OUT/dump
OUT/play.json   the forward steps, the plan calls, the log's bytes (and per 1000 steps), each plan's median
                host time, and whether the import matched
--no-log        the same steps without the log (the plan times to hold the logged ones against)

The steps, as an engine runs them on two attention layer types per forward:
  - a prefill of two new requests and a chunked-prefill extend on a cached prefix, through the paged
    prefill wrapper (window), beside a global layer planned without a window (counted, never imported);
  - the new tokens of an extend through the ragged wrapper (window), as SGLang's extend does;
  - decode steps through the decode wrapper over page tables trimmed to the window (SGLang-style): the
    wrapper sees only the trimmed lengths, so that is what the trace holds;
  - verify steps of a uniform draft block after each request's prefix;
  - a GPT-OSS layer through the sink wrapper (verify, then decode as one query per request);
  - one decode step played twice, which the import merges into one line of count 2.
Each plan is run twice (two layers share it), as a server runs one plan per layer type per forward.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from swabench.errors import UserError  # noqa: E402
from swabench.store import paths, places  # noqa: E402


def arguments() -> argparse.Namespace:
    """The command line, checked before anything is written or imported: OUT a folder (or nothing yet), and
    flashinfer and torch installed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, metavar="OUT", help="the folder to write the log, the traces and play.json")
    parser.add_argument("--runs", action="store_true", help="log the run() calls too")
    parser.add_argument("--no-log", action="store_true", help="play the same steps without the log")
    args = parser.parse_args()
    try:
        paths.folder_out(args.out, "OUT")
    except UserError as e:
        parser.error(str(e))
    missing = [m for m in ("torch", "flashinfer") if importlib.util.find_spec(m) is None]
    if missing:
        parser.error(f"{' and '.join(missing)} not installed here; the steps play on a GPU node (docs/gpu-node.md)")
    return args


ARGS = arguments()
OUT, LOG, RUNS_LOGGED = ARGS.out, not ARGS.no_log, ARGS.runs
MADE = not OUT.exists()
OUT.mkdir(parents=True, exist_ok=True)
if LOG:  # read once, when flashinfer is imported
    os.environ.update(FLASHINFER_LOGLEVEL="10", FLASHINFER_DUMP_DIR=str(OUT / "dump"),
                      FLASHINFER_DUMP_INCLUDE="*Wrapper.plan" + (",*Wrapper.run" * RUNS_LOGGED),
                      FLASHINFER_DUMP_MAX_COUNT="100000", FLASHINFER_LOGDEST=str(OUT / "flashinfer.log"))
try:
    import torch

    import flashinfer
except Exception as e:  # installed, yet failing on import (its CUDA libraries missing)
    if MADE:
        places.remove_if_empty(OUT)
    print(f"play_dump.py: torch and flashinfer must import; {type(e).__name__}: {e}", file=sys.stderr)
    sys.exit(2)

from swabench.inputs import dumps  # noqa: E402

DEV, BF16, I32 = torch.device("cuda"), torch.bfloat16, torch.int32
PAGE, W = 16, 255  # page size; window_left (a 256-token sliding window)
SWA = dict(num_qo_heads=32, num_kv_heads=8, head_dim=128)  # a Gemma-like SWA layer
SINK = dict(num_qo_heads=64, num_kv_heads=8, head_dim=64)  # GPT-OSS's
LAYERS_PER_PLAN = 2
workspace = torch.empty(256 << 20, dtype=torch.uint8, device=DEV)
expected: Counter = Counter()
plan_us: dict[str, list[float]] = {}
plans = forwards = 0


def cache(layer, pages):
    shape = (pages, PAGE, layer["num_kv_heads"], layer["head_dim"])
    return torch.randn(shape, dtype=BF16, device=DEV), torch.randn(shape, dtype=BF16, device=DEV)


def table(kv_lens, starts=None):
    """Page table of requests whose first kept key is starts[i] (a page boundary) and last kv_lens[i]-1."""
    starts = starts or [0] * len(kv_lens)
    indptr, indices, last, page = [0], [], [], 0
    for kv, start in zip(kv_lens, starts):
        n = -(-(kv - start) // PAGE)
        indices += range(page, page + n)
        page += n
        indptr.append(len(indices))
        last.append(kv - start - (n - 1) * PAGE)
    as_tensor = lambda x: torch.tensor(x, dtype=I32)  # noqa: E731
    return as_tensor(indptr), as_tensor(indices), as_tensor(last), page


def timed_plan(label, wrapper, *args, **kwargs):
    global plans
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    wrapper.plan(*args, **kwargs)
    plan_us.setdefault(label, []).append((time.perf_counter() - t0) * 1e6)
    plans += 1


def expect(mode, layer, requests, window=True, **extra):
    if window:
        expected[json.dumps({"mode": mode, **{k: layer[k] for k in ("num_qo_heads", "num_kv_heads", "head_dim")},
                             "window_left": W, **extra, "dtype": "bfloat16",
                             "requests": [list(r) for r in requests]}, sort_keys=True)] += \
            LAYERS_PER_PLAN if RUNS_LOGGED else 1


def paged_prefill(requests, window=True, layer=SWA, label="paged prefill"):
    """requests: (prefix, queries); one plan, a run per layer."""
    kv = [p + q for p, q in requests]
    indptr, indices, last, pages = table(kv)
    qo = torch.tensor([0] + [sum(q for _, q in requests[:i + 1]) for i in range(len(requests))], dtype=I32)
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
    timed_plan(label + ("" if window else ", no window"), w, qo, indptr, indices, last, layer["num_qo_heads"],
               layer["num_kv_heads"], layer["head_dim"], PAGE, causal=True, window_left=W if window else -1,
               q_data_type=BF16, kv_data_type=BF16)
    q = torch.randn(int(qo[-1]), layer["num_qo_heads"], layer["head_dim"], dtype=BF16, device=DEV)
    k, v = cache(layer, pages)
    for _ in range(LAYERS_PER_PLAN):
        w.run(q, (k, v))
    mode = "verify" if len({q for _, q in requests}) == 1 and requests[0][1] > 1 and all(p for p, _ in requests) \
        else "decode" if all(q == 1 for _, q in requests) else "extend"
    expect(mode, layer, requests, window, page_size=PAGE)


def ragged_extend(requests):
    kv = [p + q for p, q in requests]
    qo = torch.tensor([0] + [sum(q for _, q in requests[:i + 1]) for i in range(len(requests))], dtype=I32)
    kv_indptr = torch.tensor([0] + [sum(kv[:i + 1]) for i in range(len(kv))], dtype=I32)
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend="fa2")
    timed_plan("ragged prefill", w, qo, kv_indptr, SWA["num_qo_heads"], SWA["num_kv_heads"], SWA["head_dim"],
               causal=True, window_left=W, q_data_type=BF16, kv_data_type=BF16)
    q = torch.randn(int(qo[-1]), SWA["num_qo_heads"], SWA["head_dim"], dtype=BF16, device=DEV)
    k = torch.randn(int(kv_indptr[-1]), SWA["num_kv_heads"], SWA["head_dim"], dtype=BF16, device=DEV)
    for _ in range(LAYERS_PER_PLAN):
        w.run(q, k, torch.randn_like(k))
    expect("extend", SWA, requests, storage="ragged")


def trimmed_decode(contexts):
    """SGLang-style: the table starts at the page holding key kv_len-1-W; the wrapper sees the trimmed lengths."""
    starts = [max(0, kv - 1 - W) // PAGE * PAGE for kv in contexts]
    indptr, indices, last, pages = table(contexts, starts)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    timed_plan("decode, trimmed table", w, indptr, indices, last, SWA["num_qo_heads"], SWA["num_kv_heads"],
               SWA["head_dim"], PAGE, window_left=W, q_data_type=BF16, kv_data_type=BF16)
    q = torch.randn(len(contexts), SWA["num_qo_heads"], SWA["head_dim"], dtype=BF16, device=DEV)
    k, v = cache(SWA, pages)
    for _ in range(LAYERS_PER_PLAN):
        w.run(q, (k, v))
    expect("decode", SWA, [(kv - s - 1, 1) for kv, s in zip(contexts, starts)], page_size=PAGE)


def sink_step(requests):
    kv = [p + q for p, q in requests]
    indptr, indices, last, pages = table(kv)
    qo = torch.tensor([0] + [sum(q for _, q in requests[:i + 1]) for i in range(len(requests))], dtype=I32)
    w = flashinfer.BatchAttentionWithAttentionSinkWrapper(
        workspace, "NHD", backend="fa2", q_data_type=BF16, kv_data_type=BF16, head_dim_qk=SINK["head_dim"],
        head_dim_vo=SINK["head_dim"], window_left=W)
    timed_plan("sink wrapper", w, qo, indptr, indices, last, SINK["num_qo_heads"], SINK["num_kv_heads"],
               SINK["head_dim"], PAGE, causal=True, window_left=W, q_data_type=BF16, kv_data_type=BF16)
    q = torch.randn(int(qo[-1]), SINK["num_qo_heads"], SINK["head_dim"], dtype=BF16, device=DEV)
    k, v = cache(SINK, pages)
    sinks = torch.randn(SINK["num_qo_heads"], dtype=torch.float32, device=DEV)
    for _ in range(LAYERS_PER_PLAN):
        w.run(q, (k, v), sinks, SINK["head_dim"] ** -0.5)
    mode = "decode" if all(q == 1 for _, q in requests) else "verify"
    expect(mode, SINK, requests, page_size=PAGE, sinks=True)


def forward(*plays):
    global forwards
    for play, *args in plays:
        play(*args)
    forwards += 1


forward((paged_prefill, [(0, 700), (0, 1200)]), (paged_prefill, [(0, 700), (0, 1200)], False))
forward((paged_prefill, [(1024, 512), (3000, 256)]), (paged_prefill, [(1024, 512), (3000, 256)], False),
        (ragged_extend, [(0, 300), (0, 200)]))
for t in range(4):
    contexts = [3001 + t, 1537 + t, 700 + t, 5000 + t]
    forward((trimmed_decode, contexts), (paged_prefill, [(c - 1, 1) for c in contexts], False))
forward((trimmed_decode, [3100, 1600, 800, 5100]))
forward((trimmed_decode, [3100, 1600, 800, 5100]))  # the same step again: one line, count 2
for t in range(3):
    forward((paged_prefill, [(3000 + 4 * t, 4), (1600 + 4 * t, 4)]),
            (paged_prefill, [(3000 + 4 * t, 4), (1600 + 4 * t, 4)], False))
forward((sink_step, [(2000, 8), (900, 8)]), (sink_step, [(2000, 1), (500, 1)]))
torch.cuda.synchronize()

summary = {"release": flashinfer.__version__, "log": LOG, "runs_logged": RUNS_LOGGED, "forward_steps": forwards,
           "plan_calls": plans, "plan_us_median": {k: round(statistics.median(v), 1) for k, v in plan_us.items()}}
if LOG:
    (OUT / "expected.jsonl").write_text("".join(json.dumps({**json.loads(k), "count": n}) + "\n"
                                                for k, n in expected.items()))
    imported = dumps.read(OUT / "dump")
    (OUT / "imported.jsonl").write_text(dumps.to_jsonl(imported))
    got = Counter({json.dumps({k: v for k, v in line.items() if k != "count"}, sort_keys=True): line["count"]
                   for line in imported.lines})
    size = sum(f.stat().st_size for f in (OUT / "dump").rglob("*") if f.is_file())
    summary.update(dump_bytes=size, dump_bytes_per_1000_forward_steps=round(size / forwards * 1000),
                   dump_bytes_per_1000_plans=round(size / plans * 1000), import_summary=imported.summary(),
                   expected_lines=len(expected), imported_lines=len(got), matches=got == expected,
                   missing=sorted(set(expected) - set(got)), unexpected=sorted(set(got) - set(expected)),
                   count_differs=sorted(k for k in set(got) & set(expected) if got[k] != expected[k]))
(OUT / "play.json").write_text(json.dumps(summary, indent=1) + "\n")
print(json.dumps(summary, indent=1))
sys.exit(0 if not LOG or summary["matches"] else 1)
