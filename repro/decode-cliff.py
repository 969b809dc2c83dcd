#!/usr/bin/env python3
"""BatchDecodeWithPagedKVCacheWrapper on CUDA cores reads every page of its table whatever window_left says

Call: BatchDecodeWithPagedKVCacheWrapper(backend="fa2", use_tensor_cores=False, use_cuda_graph=True), then
    plan(window_left=127) and run()
Shape: batch 32; qo_len 1 each; kv_len 8193 each; 8 query, 8 KV heads; head_dim 64; page_size 1; window_left 127;
    bfloat16
Fault: performance request: the CUDA-core decode kernel walks all of [0, kv_len)
    (include/flashinfer/attention/decode.cuh:438-442, include/flashinfer/attention/decode.cuh:539) and masks each
    score outside the window (include/flashinfer/attention/decode.cuh:97-99); the tensor-core path starts at the
    window (include/flashinfer/attention/prefill.cuh:4379), as flashinfer#4825 made cute-dsl's decode do
Expected: the full table about as fast as the trimmed one, nearer its time than a read of every page's; else exit 1
"""
import subprocess
import sys

import flashinfer
import torch


def main(dev="cuda"):
    bf16, i32 = torch.bfloat16, torch.int32
    kv_indices = torch.randperm(262176, generator=torch.Generator().manual_seed(1)).to(i32)  # pages, shuffled
    g = torch.Generator(dev).manual_seed(0)
    q, k_cache, v_cache = (torch.randn(shape, generator=g, device=dev).to(bf16)
                           for shape in ((32, 8, 64), (262176, 1, 8, 64), (262176, 1, 8, 64)))
    window = kv_indices.view(32, 8193)[:, -128:]  # each request's last 128 pages (page size 1): its window
    k, v = (c[window.long(), 0].float() for c in (k_cache, v_cache))
    s = torch.einsum("bhd,bkhd->bhk", q.float(), k) * 0.125
    expected, out = torch.einsum("bhk,bkhd->bhd", s.softmax(dim=-1), v), torch.empty_like(q)  # float32
    full = (torch.arange(0, 262176 + 1, 8193, dtype=i32), kv_indices, torch.ones(32, dtype=i32))
    trimmed = (torch.arange(0, 32 * 128 + 1, 128, dtype=i32), window.flatten(), full[2])
    buffers = (("indptr", 32 + 1), ("indices", 262176), ("last_page_len", 32))  # a CUDA-graph wrapper's plan
    table_gb = 2 * 262176 * 8 * 64 * 2 / 1e9  # the whole table's K and V, bfloat16
    calls = {"full table, CUDA cores": (False, full), "trimmed table, CUDA cores": (False, trimmed),
             "full table, tensor cores": (True, full)}  # the call first, then what it could do
    times, wrong = {}, False
    for name, (tensor_cores, table) in calls.items():
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            q.new_empty(268435456, dtype=torch.uint8), "NHD", backend="fa2", use_tensor_cores=tensor_cores,
            use_cuda_graph=True, **{f"paged_kv_{n}_buffer": q.new_empty(size, dtype=i32) for n, size in buffers})
        wrapper.plan(*table, num_qo_heads=8, num_kv_heads=8, q_data_type=bf16, kv_data_type=bf16,
                     sm_scale=0.125, head_dim=64, window_left=127, page_size=1)
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


if __name__ == "__main__":
    sys.exit(main())
