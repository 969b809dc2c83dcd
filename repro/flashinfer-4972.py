#!/usr/bin/env python3
"""BatchPrefillWithPagedKVCacheWrapper (fa2), causal=False with window_left: rows past a split-KV chunk are wrong

Call: BatchPrefillWithPagedKVCacheWrapper(backend="fa2", use_cuda_graph=True), then plan(causal=False,
    window_left=333, uniform_q_len=1024) and run()
Shape: batch 1; qo_len 1024; kv_len 1024; 8 query and 2 KV heads; head_dim 128; page_size 16 (scattered pages);
    window_left 333; causal=False; no sinks; no soft-cap; bfloat16
Where it shows: extend b1 p0 q1024 W333 non-causal ps16 h8/2 d128 bfloat16 s0 on 132 SMs (request 0: rows 0-863)
Matters: fa2 splits a request along KV by SM count (the rows depend on the GPU), always under use_cuda_graph=True
Expected: softmax attention in float32 over each query's window: rel-L2 <= 0.01 overall, 0.05 in each row and head
Observed on flashinfer 0.7.4 and 0.7.2.post1, NVIDIA H200 (132 SMs): REPRODUCED: request 0: rows 0-863 wrong (rel-L2
    0.667, worst row 1.44; tolerances 0.01, 0.05)
Fault: FlashInfer's fa2 split-KV scheduler: a comment on issue flashinfer#4972; PR flashinfer#4992 proposes a fix
Control: the same plan with disable_split_kv=True, its verdict printed beside the bug's
Run: python3 with torch and flashinfer on a CUDA GPU; kernels build on first use; exits 1 when reproduced
"""
import subprocess
import sys

import flashinfer
import torch

TOLERANCE = {'rel_l2': 0.01, 'row_rel_l2': 0.05}  # swabench's gate on random inputs, bfloat16


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
                     q_data_type=bf16, kv_data_type=bf16, sm_scale=0.08838834764831845, causal=False,
                     window_left=333, head_dim_qk=128, page_size=16, uniform_q_len=1024, **control)
        wrong, what = outcome(lambda: wrapper.run(q, (k_cache, v_cache), out=out), out, expected)
        if not control:
            reproduced = wrong
        print(f"CONTROL, disable_split_kv=True: {what}" if control else
              f"{'REPRODUCED' if wrong else 'NOT REPRODUCED'}{' (crash)' * what.startswith('crash')}: {what}")
    # FlashInfer's own report: the GPU and its SM count, driver, CUDA, torch, cubin and JIT-cache packages
    print(subprocess.run([sys.executable, "-m", "flashinfer.collect_env"], capture_output=True, text=True).stdout)
    return 1 if reproduced else 0


def outcome(step, out, expected):
    """(wrong, what): what step() writes to out against expected, NaN first: a row it never writes is wrong."""
    out.fill_(float("nan"))
    try:
        step()
        torch.cuda.synchronize()
    except RuntimeError as e:  # an illegal memory access or a launch failure: the call never finished
        return True, f"crash: {str(e).strip().splitlines()[0]}"
    err, tol = (out.float() - expected).nan_to_num(nan=float("inf")), TOLERANCE
    head = err.norm(dim=-1) / expected.norm(dim=-1).clamp_min(1e-6)  # [row, head]
    rel, row = float(err.norm() / expected.norm()), head.amax(dim=-1)
    said = f"rel-L2 {rel:.3g}, worst row {float(row.max()):.3g}; tolerances {tol['rel_l2']:g}, {tol['row_rel_l2']:g}"
    bad = set((row > tol["row_rel_l2"]).nonzero().flatten().tolist())
    if rel <= tol["rel_l2"] and not bad:
        return False, f"right ({said})"
    rows = ", ".join(f"{a}-{z}" if z > a else f"{a}" for a, z in zip(sorted(r for r in bad if r - 1 not in bad),
                                                                      sorted(r for r in bad if r + 1 not in bad)))
    w, h = divmod(int(head.argmax()), head.shape[1])
    e, o = ([round(x, 3) for x in t[w, h, :4].tolist()] for t in (expected, out.float()))
    return True, (f"request 0: rows {rows} wrong" if rows else "no row past the row tolerance") + f" ({said})\n" \
                 f"worst: request 0 row {w}, head {h}, first values expected {e}, got {o}"


if __name__ == "__main__":
    sys.exit(main())
