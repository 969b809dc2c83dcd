"""The script for ``holistic-offset``: BatchAttention reading pages past 2^32 elements of its cache, on the
smallest case that shows it with every row wrong.

One request of ``QO`` queries whose ``KV`` pages (page size 1, the default float workspace enough) are the cache's
last: each starts past element 2^32, so the 32-bit offset wraps to the cache's first pages, which hold zeros.  The
control is the same call on the same memory seen from the request's first page: the same pages numbered from 0.
A cache that large (8 GiB a side) cannot be built on the CPU, so ``check`` renders the template with the pages at
0 and holds its calls, argument by argument and input by value, to the suite's ``batch-attention-trim`` on the
same request with contiguous pages; the two differ only in where the pages sit.
"""

from __future__ import annotations

from string import Template

from swabench.core import cases
from swabench.impls.batch_attention import OFFSET_WRAPS
from swabench.repro import screen, script, verify
from swabench.repro.script import Part

REF = "holistic-offset"
QO, PREFIX, HEADS, KV_HEADS, HEAD_DIM = 8, 120, 32, 8, 128
KV = PREFIX + QO
CONTROL = "the same pages numbered from 0 (the cache seen from the request's first page)"
CASE = cases.Case(mode="verify", storage="paged", batch_size=1, prefix_len=PREFIX, seq_len=None, qo_len=QO,
                  accept=None, window_left=KV - 1, page_size=1, page_layout="contiguous", num_qo_heads=HEADS,
                  num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, dtype="bfloat16", seed=0)  # the window reaches key 0
FIRST = f"2**32 // ({KV_HEADS} * {HEAD_DIM})"  # the first page that starts past 2^32 elements, at page size 1
GIB = 2 * 2 * (OFFSET_WRAPS + KV * KV_HEADS * HEAD_DIM) / 2**30  # K and V caches of bfloat16
WIDTH = screen.WIDTH  # the top comment's lines

MAIN = Template('''
def main(dev="cuda"):
    bf16, i32 = torch.bfloat16, torch.int32
    first = $first  # the first page at element 2^32 of a cache of page size 1
    g = torch.Generator(dev).manual_seed(0)
    q, keys, values = (torch.randn(shape, generator=g, device=dev).to(bf16)
                       for shape in (($qo, $h, $d), ($kv, 1, $hkv, $d), ($kv, 1, $hkv, $d)))
    k_cache, v_cache = (torch.zeros(first + $kv, 1, $hkv, $d, dtype=bf16, device=dev) for _ in "kv")  # $gib GiB
    k_cache[first:], v_cache[first:] = keys, values  # the request's pages: the cache's last $kv
    k, v = (c[:, 0].float().repeat_interleave($group, dim=1) for c in (keys, values))
    seen = torch.ones($qo, $kv, dtype=torch.bool, device=dev).tril($prefix)  # query i: keys 0 .. $prefix + i
    s = (torch.einsum("qhd,khd->hqk", q.float(), k) * $scale).masked_fill(~seen, float("-inf"))
    expected, out = torch.einsum("hqk,khd->qhd", s.softmax(dim=-1), v), torch.empty_like(q)  # float32
    lse = torch.empty($qo, $h, dtype=torch.float32, device=dev)
    qo_indptr, kv_indptr, kv_lens = (torch.tensor(v, dtype=i32) for v in ([0, $qo], [0, $kv], [$kv]))
    wrapper = flashinfer.BatchAttention(kv_layout="NHD", device=q.device)
    for start, control in ((first, False), (0, True)):  # the pages from 2^32 on, then the same ones from 0
        kv_indices = torch.arange(start, start + $kv, dtype=i32, device=dev)
        wrapper.plan(qo_indptr, kv_indptr, kv_indices, kv_lens, $h, $hkv, $d, $d, 1, causal=True,
                     sm_scale=$scale, logits_soft_cap=None, q_data_type=bf16, kv_data_type=bf16)
        caches = (k_cache[first - start:], v_cache[first - start:])
        wrong, what = outcome(lambda: wrapper.run(q, caches, out=out, lse=lse, logits_soft_cap=0.0), out, expected)
        if not control:
            reproduced = wrong
        print(f"CONTROL, the same pages numbered from 0: {what}" if control else
              ("REPRODUCED: " if wrong else "NOT REPRODUCED: ") + what)
    print(subprocess.run([sys.executable, "-m", "flashinfer.collect_env"], capture_output=True, text=True).stdout)
    return 1 if reproduced else 0
''')


def header_lines(lines: list[str]) -> list[str]:
    """The top comment in FlashInfer's terms: where the pages sit and what that needs, whose bug, the fix."""
    said = dict(line.split(": ", 1) for line in lines if ": " in line and not line.startswith(" "))
    return [f"Where: the request's {KV} pages are the cache's last, from page {OFFSET_WRAPS // (KV_HEADS * HEAD_DIM)}: "
            f"each starts at or past element 2^32",
            f"Needs: {GIB:.1f} GiB of GPU memory (a K and a V cache of 2^32 + {KV * KV_HEADS * HEAD_DIM} elements)",
            f"Fault: {said['Fault']}", f"Control: {CONTROL}",
            "Expected: float32 softmax over each query's keys, computed in main(): rel-L2 <= 0.01, <= 0.05 per row; "
            "else exit 1"]


def parts(case=CASE) -> list[Part]:
    """The suite's side of the script: its checked call (the control renumbers pages, which no suite path does)."""
    return [Part(case, "batch-attention-trim", "fa2")]


def render(case, header: script.Header, first: str = FIRST) -> str:
    """The script's text under ``header``: always on ``CASE`` (the shipped case that shows the bug is 40 GiB);
    ``first``: the first page's index, an expression (``check`` puts the pages at 0)."""
    main = MAIN.substitute(first=first, qo=QO, kv=KV, prefix=PREFIX, h=HEADS, hkv=KV_HEADS, d=HEAD_DIM,
                           group=HEADS // KV_HEADS, scale=CASE.scale, gib=f"{GIB / 2:.0f}")
    call = ("Call: BatchAttention(kv_layout=\"NHD\"), then plan(qo_indptr, kv_indptr, kv_indices, kv_lens, ..., "
            "page_size=1, causal=True) and run(q, (k_cache, v_cache), out=, lse=)")
    shape = (f"Shape: one request; qo_len {QO}; kv_len {KV}; {HEADS} query, {KV_HEADS} KV heads; head_dim {HEAD_DIM}; "
             f"page_size 1; causal; bfloat16")
    return "\n".join(["#!/usr/bin/env python3", f'"""{header.title}', "", *script.wrapped([call, shape], screen.WIDTH),
                      *header.lines, '"""', "import subprocess", "import sys", "", "import flashinfer",
                      "import torch", "", "", main.strip(), "", "", screen.outcome_source(CASE.dtype), "", "",
                      'if __name__ == "__main__":', "    sys.exit(main())", ""])


def check(given: list[Part], header: script.Header) -> None:
    """Drift where the template, its pages put at 0, does not make the suite's calls on ``CASE``: its checked call
    call for call, and its control the same plan() again on the same pages.  The suite sizes BatchAttention's float
    workspace itself (from 256 MiB, grown on overflow); the script keeps the 384 MiB BatchAttention allocates, which
    ``KV_HEADS`` heads fit (its planner reserves about 311 MB on an H200 at 8 KV heads)."""
    want = [c for c in verify.suite_calls(parts())[0] if not (c[1] == "__setattr__" and c[2][0] ==
                                                              "float_workspace_buffer")]
    got, _ = verify.script_calls(render(CASE, header, first="0"))
    checked, control = got[:len(want)], got[len(want):]
    verify.same_calls(want, checked)
    planned = [c for c in checked if c[1] == "plan"]
    replanned = [c for c in control if c[1] == "plan"]
    if len(planned) != 1 or len(replanned) != 1 or not verify.same(planned[0], replanned[0]):
        raise verify.Drift("the control is not the checked plan() on its pages numbered from 0")


def where(case) -> str:
    """Where the suite finds it: the shipped case and the requests that read past 2^32 elements, in words."""
    from swabench.impls import batch_attention

    wrapped = batch_attention.wrapped_requests(case)
    return f"{case.label}: requests {', '.join(map(str, wrapped))} read a page that ends past 2^32 elements"
