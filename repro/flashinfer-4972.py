#!/usr/bin/env python3
"""BatchPrefillWithPagedKVCacheWrapper (fa2), causal=False, window_left: split-KV tiles miss keys past their chunks

Call: BatchPrefillWithPagedKVCacheWrapper(backend="fa2", use_cuda_graph=True), then plan(causal=False,
    window_left=333, uniform_q_len=1024) and run()
Shape: batch 1; qo_len 1024; kv_len 1024; 8 query, 2 KV heads; head_dim 128; page_size 16; window_left 333;
    non-causal; bfloat16
Matters: fa2 splits a request along KV by SM count (the rows depend on the GPU), always under use_cuda_graph=True
Expected: softmax attention in float32 over each query's window: rel-L2 <= 0.01 overall, 0.05 in each row and head
Observed on flashinfer 0.6.18.post1 and 0.7.2.post1 and 0.7.4, NVIDIA H100 80GB HBM3 (132 SMs): REPRODUCED: 864 of
    1024 rows wrong, 0-863 (rel-L2 0.667, worst row 1.44; tolerances 0.01, 0.05)
Fault: FlashInfer bug: fa2's split-KV plan under use_cuda_graph=True with causal=False and a window: flashinfer#4972
    reports it; PR flashinfer#4992 proposes a fix
Control: the same plan with disable_split_kv=True, its verdict printed beside the bug's
Run: python3 with torch and flashinfer on a CUDA GPU; kernels build on first use; exits 1 when reproduced
"""
import inspect
import subprocess
import sys

import flashinfer
import torch


def main(dev="cuda"):
    bf16, i32 = torch.bfloat16, torch.int32
    kv_indices = torch.randperm(64, generator=torch.Generator().manual_seed(1)).to(i32)  # pages, shuffled
    g = torch.Generator(dev).manual_seed(0)
    q, k_cache, v_cache = (torch.randn(shape, generator=g, device=dev).to(bf16)
                           for shape in ((1024, 8, 128), (64, 16, 2, 128), (64, 16, 2, 128)))
    k, v = (c[kv_indices.long()].flatten(0, 1)[:1024].float().repeat_interleave(4, dim=1) for c in (k_cache, v_cache))
    seen = torch.ones(1024, 1024, dtype=torch.bool, device=dev).triu(-333)  # query i sees keys j >= i - 333
    s = (torch.einsum("qhd,khd->hqk", q.float(), k) * 0.08838834764831845).masked_fill(~seen, float("-inf"))
    expected, out = torch.einsum("hqk,khd->qhd", s.softmax(dim=-1), v), torch.empty_like(q)  # float32 reference
    buffers = {name: torch.empty((n,), dtype=i32, device=dev) for name, n in (("qo_indptr_buf", 2),
               ("paged_kv_indptr_buf", 2), ("paged_kv_indices_buf", 64), ("paged_kv_last_page_len_buf", 1))}
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
        torch.empty(268435456, dtype=torch.uint8, device=dev), "NHD", backend="fa2", use_cuda_graph=True, **buffers)
    qo_indptr, kv_indptr, kv_last_page_len = (torch.tensor(v, dtype=i32) for v in ([0, 1024], [0, 64], [16]))
    for control in ({}, {"disable_split_kv": True}):  # the call, then the control: no request split along KV
        wrapper.plan(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, num_qo_heads=8, num_kv_heads=2,
                     q_data_type=bf16, kv_data_type=bf16, sm_scale=0.08838834764831845, causal=False, window_left=333,
                     head_dim_qk=128, page_size=16, **taken_by(wrapper.plan, uniform_q_len=1024), **control)
        wrong, what = outcome(lambda: wrapper.run(q, (k_cache, v_cache), out=out), out, expected)
        if not control:
            reproduced = wrong
        print(f"CONTROL, disable_split_kv=True: {what}" if control else
              f"{'REPRODUCED' if wrong else 'NOT REPRODUCED'}{' (crash)' * what.startswith('crash')}: {what}")
    # FlashInfer's own report: the GPU and its SM count, driver, CUDA, torch, cubin and JIT-cache packages
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


def taken_by(fn, **keywords):  # the keywords this release's fn takes: 0.6 plans without uniform_q_len
    return {k: v for k, v in keywords.items() if k in inspect.signature(fn).parameters}


if __name__ == "__main__":
    sys.exit(main())
