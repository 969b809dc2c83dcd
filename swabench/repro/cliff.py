"""The script for the decode cliff, a performance request: BatchDecodeWithPagedKVCacheWrapper on CUDA cores reads
every page of the table plan() is given, whatever ``window_left`` says.

Three calls on the same batch, each held to the float32 reference before it is timed: the CUDA-core kernel on the
full table (the call), on the table trimmed to each request's window (what the kernel could read), and the
tensor-core kernel on the full table (which starts at the window: the first thing a maintainer asks).  Each call's
time is also said as the bandwidth it would take to read the whole table's K and V, beside a plain read of every
page timed the same way: the CUDA-core call on the full table is taken to read every page where its time is nearer
(in ratio) that read's than the trimmed table's, a line drawn by the two things it could be doing, not a chosen factor.
``check`` holds the three calls to the suite's ``decode-window``, ``decode-trim`` and ``decode-tc-window``.
"""

from __future__ import annotations

from string import Template

from swabench.core import workloads
from swabench.repro import screen, script, verify
from swabench.repro.script import Part

REF = "decode-cliff"
WIDTH = screen.WIDTH  # the top comment's lines
CALLS = (("decode-window", "", "full table, CUDA cores"), ("decode-trim", "_trim", "trimmed table, CUDA cores"),
        ("decode-tc-window", "_tc", "full table, tensor cores"))  # the first is the call, timed against the rest

MAIN = Template('''
def main(dev="cuda"):
    $drawn
    window = kv_indices.view($b, $kv)[:, -$keys:]  # each request's last $keys pages (page size 1): its window
    k, v = (c[window.long(), 0].float()$repeat for c in (k_cache, v_cache))
    s = torch.einsum("bhd,bkhd->bhk", q.float(), k) * $scale
    expected, out = torch.einsum("bhk,bkhd->bhd", s.softmax(dim=-1), v), torch.empty_like(q)  # float32
    full = (torch.arange(0, $pages + 1, $kv, dtype=i32), kv_indices, torch.ones($b, dtype=i32))
    trimmed = (torch.arange(0, $b * $keys + 1, $keys, dtype=i32), window.flatten(), full[2])
    buffers = (("indptr", $b + 1), ("indices", $pages), ("last_page_len", $b))  # a CUDA-graph wrapper's plan
    table_gb = 2 * $pages * $hkv * $d * 2 / 1e9  # the whole table's K and V, bfloat16
    calls = {"$call0": (False, full), "$call1": (False, trimmed),
             "$call2": (True, full)}  # the call first, then what it could do
    times, wrong = {}, False
    for name, (tensor_cores, table) in calls.items():
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            q.new_empty($workspace, dtype=torch.uint8), "NHD", backend="fa2", use_tensor_cores=tensor_cores,
            use_cuda_graph=True, **{f"paged_kv_{n}_buffer": q.new_empty(size, dtype=i32) for n, size in buffers})
        wrapper.plan(*table, num_qo_heads=$h, num_kv_heads=$hkv, q_data_type=bf16, kv_data_type=bf16,
                     sm_scale=$scale, head_dim=$d, window_left=$w, page_size=1)
        wrapper.run(q, (k_cache, v_cache), out=out)
        err = float((out.float() - expected).norm() / expected.norm()) if out.isfinite().all() else float("inf")
        times[name], wrong = graph_time_us(lambda: wrapper.run(q, (k_cache, v_cache), out=out)), wrong or err > 0.01
        print(f"{name}: {times[name]:.1f} us a call ({table_gb * 1e3 / times[name]:.2f} TB/s if it read every "
              f"page); rel-L2 {err:.3g}")
    every_page = graph_time_us(lambda: (k_cache.sum(), v_cache.sum()))  # a plain read of the whole table
    print(f"torch sums of K and V ({table_gb:.3f} GB): {every_page:.1f} us, {table_gb * 1e3 / every_page:.2f} TB/s")
    full_cuda, trimmed_cuda, _ = times.values()
    slow = every_page > trimmed_cuda and full_cuda**2 > every_page * trimmed_cuda  # nearer, in ratio, the read
    print(f"{'REPRODUCED' if slow else 'NOT REPRODUCED'}{' (a call is wrong)' * wrong}: on CUDA cores the full table "
          f"takes {full_cuda / trimmed_cuda:.1f}x the trimmed one, {full_cuda / every_page:.2f}x reading every page")
    print(subprocess.run([sys.executable, "-m", "flashinfer.collect_env"], capture_output=True, text=True).stdout)
    return 1 if slow or wrong else 0  # a wrong call's time says nothing
''')

TIMER = '''
def graph_time_us(step, calls=20, replays=20):
    """Microseconds a call: a CUDA graph of `calls` calls, each after an L2 flush, replayed `replays` times after one
    upload, less the same of a graph of the flushes alone."""
    flush = torch.empty(torch.cuda.get_device_properties(0).L2_cache_size // 2, dtype=torch.int32, device="cuda")
    took = []
    for body in (lambda: (flush.zero_(), step()), flush.zero_):
        graph, (start, end) = torch.cuda.CUDAGraph(), (torch.cuda.Event(enable_timing=True) for _ in "se")
        with torch.cuda.graph(graph):
            for _ in range(calls):
                body()
        graph.replay()
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        took.append(start.elapsed_time(end) * 1000 / calls / replays)
    return took[0] - took[1]
'''


def reads_every_page(full_us: float, trimmed_us: float, every_page_us: float) -> bool:
    """Whether the CUDA-core call on the full table takes, in ratio, nearer a plain read of every page than the
    call on the trimmed table: the line between the two things it could be doing (their geometric mean), which the
    script draws with the same expression.  Where the read is no slower than the trimmed call the two cannot be
    told apart, and nothing is shown."""
    return every_page_us > trimmed_us and full_us**2 > every_page_us * trimmed_us


def parts(case) -> list[Part]:
    """The three calls on ``case``, each a timed part of the suite."""
    return [Part(case, impl, "fa2", "timed", label, says=said) for impl, label, said in CALLS]


def header_lines(lines: list[str]) -> list[str]:
    """The top comment of a performance request: whose kernel, and what it could do."""
    said = dict(line.split(": ", 1) for line in lines if ": " in line and not line.startswith(" "))
    return [f"Fault: {said['Fault']}",
            "Expected: the full table about as fast as the trimmed one, nearer its time than a read of every page's; "
            "else exit 1"]


def render(case, header: script.Header) -> str:
    """The script's text for ``case`` (a decode batch at page size 1, every request the same length)."""
    from swabench.impls.flashinfer_workspace import WORKSPACE_BYTES

    qo, kv = workloads.request_lengths(case)
    if case.mode != "decode" or case.page_size != 1 or len(set(kv)) != 1:
        raise ValueError(f"the cliff's script takes a decode batch of one length at page size 1, not {case.label}")
    names = {f"call{i}": said for i, (_, _, said) in enumerate(CALLS)}
    repeat = f".repeat_interleave({case.gqa_group}, dim=2)" if case.gqa_group > 1 else ""
    main = MAIN.substitute(pages=sum(kv), kv=kv[0], b=len(kv), keys=case.window_left + 1, h=case.num_qo_heads,
                           hkv=case.num_kv_heads, d=case.head_dim, repeat=repeat, scale=case.scale,
                           w=case.window_left, workspace=WORKSPACE_BYTES,
                           drawn="\n    ".join(screen.drawn(script.case_literals(case))), **names)
    call = (f"Call: BatchDecodeWithPagedKVCacheWrapper(backend=\"fa2\", use_tensor_cores=False, use_cuda_graph=True), "
            f"then plan(window_left={case.window_left}) and run()")
    said = script.wrapped([call, script.shape_line(script.case_literals(case))], WIDTH)
    return "\n".join(["#!/usr/bin/env python3", f'"""{header.title}', "", *said, *header.lines, '"""',
                      "import subprocess", "import sys", "", "import flashinfer", "import torch", "", "",
                      main.strip(), "", "", TIMER.strip(), "", "",
                      'if __name__ == "__main__":', "    sys.exit(main())", ""])


def check(given: list[Part], header: script.Header) -> None:
    """Drift where the three calls are not the suite's paths' on the same case, in order."""
    verify.check(given, render(given[0].case, header), sequential=True)
