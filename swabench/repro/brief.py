"""The one-screen script for flashinfer#4972: one request, its numbers and its float32 reference written into main(),
and the control (the same plan with ``disable_split_kv=True``) in the same wrapper.

The traced scripts carry swabench's general kit (many requests, every mask feature); a comment on an upstream issue
reads best as one page a maintainer takes in at once.  ``check`` holds its calls, argument by argument and input by
value, to the suite's own on the same case, as every traced script is held.
"""

from __future__ import annotations

from string import Template

from swabench.core import workloads
from swabench.impls.flashinfer_workspace import WORKSPACE_BYTES
from swabench.repro import screen, script, verify
from swabench.repro.script import Part

REF = "flashinfer#4972"
WIDTH = 118  # the top comment's lines: a maintainer's screen, as the code below it
EXPECTED = "softmax attention in float32 over each query's window: rel-L2 <= 0.01 overall, 0.05 in each row and head"
CONTROL = "the same plan with disable_split_kv=True, its verdict printed beside the bug's"
RUN = "python3 with torch and flashinfer on a CUDA GPU; kernels build on first use; exits 1 when reproduced"

MAIN = Template('''
def main(dev="cuda"):
    $drawn
    k, v = (c[kv_indices.long()].flatten(0, 1)[:$kv].float().repeat_interleave($group, dim=1) for c in (k_cache, v_cache))
    seen = torch.ones($qo, $kv, dtype=torch.bool, device=dev).triu($diagonal)  # query i sees keys j >= i - $w
    s = (torch.einsum("qhd,khd->hqk", q.float(), k) * $scale).masked_fill(~seen, float("-inf"))
    expected, out = torch.einsum("hqk,khd->qhd", s.softmax(dim=-1), v), torch.empty_like(q)  # float32 reference
    buffers = {name: torch.empty((n,), dtype=i32, device=dev) for name, n in (("qo_indptr_buf", 2),
               ("paged_kv_indptr_buf", 2), ("paged_kv_indices_buf", $pages), ("paged_kv_last_page_len_buf", 1))}
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
        torch.empty($workspace, dtype=torch.uint8, device=dev), "NHD", backend="fa2", use_cuda_graph=True, **buffers)
    qo_indptr, kv_indptr, kv_last_page_len = (torch.tensor(v, dtype=i32) for v in ([0, $qo], [0, $pages], [$last]))
    for control in ({}, {"disable_split_kv": True}):  # the call, then the control: no request split along KV
        wrapper.plan(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, num_qo_heads=$h, num_kv_heads=$hkv,
                     q_data_type=bf16, kv_data_type=bf16, sm_scale=$scale, causal=False, window_left=$w,
                     head_dim_qk=$d, page_size=$ps, **taken_by(wrapper.plan, uniform_q_len=$qo), **control)
        wrong, what = outcome(lambda: wrapper.run(q, (k_cache, v_cache), out=out), out, expected)
        if not control:
            reproduced = wrong
        print(f"CONTROL, disable_split_kv=True: {what}" if control else
              f"{'REPRODUCED' if wrong else 'NOT REPRODUCED'}{' (crash)' * what.startswith('crash')}: {what}")
    # FlashInfer's own report: the GPU and its SM count, driver, CUDA, torch, cubin and JIT-cache packages
    print(subprocess.run([sys.executable, "-m", "flashinfer.collect_env"], capture_output=True, text=True).stdout)
    return 1 if reproduced else 0

''')


DROPPED = ("What is wrong", "Upstream", "Made by", "Where it shows", "Rows, as the suite models the path")


def header_lines(lines: list[str]) -> list[str]:
    """The traced scripts' top comment, cut to what a maintainer reads: Expected and Control said shortly."""
    short = {"Expected": EXPECTED, "Control": CONTROL, "Run": RUN}
    return [f"{name}: {short.get(name, text)}" for name, _, text in (line.partition(": ") for line in lines)
            if name not in DROPPED]


def render(case, header: script.Header) -> str:
    """The script's text for ``case`` (one request, planned non-causal with its window) under ``header``."""
    qo, kv = workloads.request_lengths(case)
    if len(kv) != 1 or case.causal or case.window_left < 0 or case.storage != "paged" or \
            {case.dtype, case.cache_dtype} != {"bfloat16"}:
        raise ValueError(f"the one-screen script takes one paged bfloat16 request planned non-causal with a window, "
                         f"not {case.label}")
    ps = case.page_size
    pages = -(-kv[0] // ps)
    main = MAIN.substitute(qo=qo[0], kv=kv[0], diagonal=kv[0] - qo[0] - case.window_left, pages=pages, ps=ps,
                           last=kv[0] - (pages - 1) * ps, h=case.num_qo_heads, hkv=case.num_kv_heads,
                           group=case.num_qo_heads // case.num_kv_heads, d=case.head_dim, w=case.window_left,
                           scale=case.scale, workspace=WORKSPACE_BYTES,
                           drawn="\n    ".join(screen.drawn(script.case_literals(case))))
    call = (f"Call: BatchPrefillWithPagedKVCacheWrapper(backend=\"fa2\", use_cuda_graph=True), then plan(causal=False, "
            f"window_left={case.window_left}, uniform_q_len={qo[0]}) and run()")
    said = script.wrapped([call, script.shape_line(script.case_literals(case))], WIDTH)
    return "\n".join(["#!/usr/bin/env python3", f'"""{header.title}', "", *said, *header.lines, '"""',
                      "import inspect", "import subprocess", "import sys", "", "import flashinfer", "import torch", "",
                      "", main.strip(), "", "", screen.outcome_source(case.dtype), "", "", screen.TAKEN_BY.strip(), "", "",
                      'if __name__ == "__main__":', "    sys.exit(main())", ""])


def check(parts: list[Part], header: script.Header) -> None:
    """Drift where the script's calls are not the suite's on the same case: the checked call, then its control."""
    want, _ = verify.suite_calls(parts)
    got, _ = verify.script_calls(render(parts[0].case, header))
    verify.same_calls(want, got)
