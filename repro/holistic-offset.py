#!/usr/bin/env python3
"""BatchAttention reads the wrong K/V rows from pages past 2^32 elements of the cache

Call: BatchAttention(kv_layout="NHD"), then plan(qo_indptr, kv_indptr, kv_indices, kv_lens, ..., page_size=1,
    causal=True) and run(q, (k_cache, v_cache), out=, lse=)
Shape: one request; qo_len 8; kv_len 128; 32 query, 8 KV heads; head_dim 128; page_size 1; causal; bfloat16
Where: the request's 128 pages are the cache's last, from page 4194304: each starts at or past element 2^32
Needs: 16.0 GiB of GPU memory (a K and a V cache of 2^32 + 131072 elements)
Fault: FlashInfer bug: prefetch_offest in include/flashinfer/attention/persistent.cuh:66 computes indices[page_iter] *
    kv_stride_page (an int32 index, uint32 strides) in 32 bits and widens it to size_t only when it stores it, so the
    offset wraps at 2^32 elements
Control: the same pages numbered from 0 (the cache seen from the request's first page)
Expected: float32 softmax over each query's keys, computed in main(): rel-L2 <= 0.01, <= 0.05 per row; else exit 1
"""
import subprocess
import sys

import flashinfer
import torch


def main(dev="cuda"):
    bf16, i32 = torch.bfloat16, torch.int32
    first = 2**32 // (8 * 128)  # the first page at element 2^32 of a cache of page size 1
    g = torch.Generator(dev).manual_seed(0)
    q, keys, values = (torch.randn(shape, generator=g, device=dev).to(bf16)
                       for shape in ((8, 32, 128), (128, 1, 8, 128), (128, 1, 8, 128)))
    k_cache, v_cache = (torch.zeros(first + 128, 1, 8, 128, dtype=bf16, device=dev) for _ in "kv")  # 8 GiB
    k_cache[first:], v_cache[first:] = keys, values  # the request's pages: the cache's last 128
    k, v = (c[:, 0].float().repeat_interleave(4, dim=1) for c in (keys, values))
    seen = torch.ones(8, 128, dtype=torch.bool, device=dev).tril(120)  # query i: keys 0 .. 120 + i
    s = (torch.einsum("qhd,khd->hqk", q.float(), k) * 0.08838834764831845).masked_fill(~seen, float("-inf"))
    expected, out = torch.einsum("hqk,khd->qhd", s.softmax(dim=-1), v), torch.empty_like(q)  # float32
    lse = torch.empty(8, 32, dtype=torch.float32, device=dev)
    qo_indptr, kv_indptr, kv_lens = (torch.tensor(v, dtype=i32) for v in ([0, 8], [0, 128], [128]))
    wrapper = flashinfer.BatchAttention(kv_layout="NHD", device=q.device)
    for start, control in ((first, False), (0, True)):  # the pages from 2^32 on, then the same ones from 0
        kv_indices = torch.arange(start, start + 128, dtype=i32, device=dev)
        wrapper.plan(qo_indptr, kv_indptr, kv_indices, kv_lens, 32, 8, 128, 128, 1, causal=True,
                     sm_scale=0.08838834764831845, logits_soft_cap=None, q_data_type=bf16, kv_data_type=bf16)
        caches = (k_cache[first - start:], v_cache[first - start:])
        wrong, what = outcome(lambda: wrapper.run(q, caches, out=out, lse=lse, logits_soft_cap=0.0), out, expected)
        if not control:
            reproduced = wrong
        print(f"CONTROL, the same pages numbered from 0: {what}" if control else
              ("REPRODUCED: " if wrong else "NOT REPRODUCED: ") + what)
    print(subprocess.run([sys.executable, "-m", "flashinfer.collect_env"], capture_output=True, text=True).stdout)
    return 1 if reproduced else 0


def outcome(step, out, expected, rel_l2=0.01, row_rel_l2=0.05):
    """(wrong, what): step() writes out (NaN first: a row it never writes is wrong), held to expected."""
    out.fill_(float("nan"))
    try:
        step()
        torch.cuda.synchronize()
    except RuntimeError as e:  # an illegal memory access or a launch failure: the call never finished
        return True, f"crash: {str(e).strip().splitlines()[0]}"
    err = (out.float() - expected).nan_to_num(nan=float("inf"))
    row = (err.norm(dim=-1) / expected.norm(dim=-1).clamp_min(1e-6)).amax(dim=-1)  # rel-L2 of each row's worst head
    rel, bad = float(err.norm() / expected.norm()), (row > row_rel_l2).nonzero().flatten().tolist()
    rows = f"{len(bad)} of {len(row)} rows wrong, {bad[0]}-{bad[-1]}" if bad else "every row right"
    return rel > rel_l2 or bool(bad), f"{rows} (rel-L2 {rel:.3g}, worst row {float(row.max()):.3g}; tolerances " \
                                      f"{rel_l2:g}, {row_rel_l2:g})"


if __name__ == "__main__":
    sys.exit(main())
