#!/usr/bin/env python3
"""BatchDecodeWithPagedKVCacheWrapper (CUDA cores) reads every page of its table whatever window_left says

Call: flashinfer.BatchDecodeWithPagedKVCacheWrapper(backend='fa2', use_tensor_cores=False,
    use_cuda_graph=True), then plan(window_left=127), run()
Shape: batch 32; qo_len 1 each; kv_len 8193 each; 8 query and 8 KV heads; head_dim 64; page_size 1 (scattered
    pages); window_left 127; causal=True; no sinks; no soft-cap; bfloat16
What is wrong: the CUDA-core decode kernel reads every page of the table plan() gets, whatever window_left
    says: with the full table a decode step reads the whole context where its window needs the last W + 1 keys
Where it shows: decode b32 p8192 q1 W127 ps1 h8/8 d64 bfloat16 s0: 262176 keys in the table
Matters: use_tensor_cores=False (the CUDA-core kernel) with window_left >= 0 and a page table longer than the
    window
Expected: the full table takes about the trimmed table's time (at most 3.0x): the kernel skips the pages
    before the window
Observed on flashinfer 0.7.4, NVIDIA H200 (132 SMs): REPRODUCED: the full page table takes 147.5 us a call,
    12.66x the 11.7 us of the table trimmed to the window (threshold 3.0x; CUDA graphs, L2 flushed before each
    call)
Observed on flashinfer 0.7.2.post1, NVIDIA H200 (132 SMs): REPRODUCED: the full page table takes 142.6 us a
    call, 12.35x the 11.5 us of the table trimmed to the window (threshold 3.0x; CUDA graphs, L2 flushed
    before each call)
Fault: FlashInfer, as a performance request: the CUDA-core decode kernel reads every page plan() is given,
    whatever window_left says.
Control: the table trimmed to the window; its verdict is printed beside the bug's
Made by: swabench repro --bug decode-cliff
Run: python3 with torch, flashinfer and a CUDA GPU (kernels build on first use: minutes). It prints the timing
    verdict, each path's check, the environment; exits 1 when reproduced.
"""

import sys

import torch

import flashinfer

CASE = dict(
    qo_lens=[1] * 32, kv_lens=[8193] * 32, num_qo_heads=8, num_kv_heads=8, head_dim=64, page_size=1,
    window_left=127, sm_scale=0.125, dtype='bfloat16', cache_dtype='bfloat16', seed=0)
TOLERANCE = {'rel_l2': 0.01, 'row_rel_l2': 0.05}  # swabench's gate on random inputs, bfloat16
THRESHOLD = 3.0  # the most the path may take, in multiples of its control's time
DEVICE = "cuda"


def main():
    dev = torch.device(DEVICE)
    env = environment()  # before any call: a crash can take the CUDA context with it
    # the full page table
    x = make_inputs(CASE, dev)
    q, k_cache, v_cache, kv_indptr = x["q"], x["k_cache"], x["v_cache"], x["kv_indptr"]
    kv_indices, kv_last_page_len = x["kv_indices"], x["kv_last_page_len"]
    out = torch.empty_like(x["q"])
    workspace = torch.empty((268435456,), dtype=torch.uint8, device=dev)
    decode_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        workspace, "NHD", backend="fa2", use_tensor_cores=False, use_cuda_graph=True,
        paged_kv_indptr_buffer=torch.empty((33,), dtype=torch.int32, device=dev),
        paged_kv_indices_buffer=torch.empty((262176,), dtype=torch.int32, device=dev),
        paged_kv_last_page_len_buffer=torch.empty((32,), dtype=torch.int32, device=dev))
    decode_wrapper.plan(
        kv_indptr, kv_indices, kv_last_page_len, num_qo_heads=8, num_kv_heads=8, q_data_type=torch.bfloat16,
        kv_data_type=torch.bfloat16, sm_scale=0.125, head_dim=64, window_left=127, page_size=1)

    def step():
        decode_wrapper.run(q, (k_cache, v_cache), out=out)

    # the table trimmed to the window
    out_twin = torch.empty_like(x["q"])
    workspace_twin = torch.empty((268435456,), dtype=torch.uint8, device=dev)
    decode_wrapper_twin = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        workspace_twin, "NHD", backend="fa2", use_tensor_cores=False, use_cuda_graph=True,
        paged_kv_indptr_buffer=torch.empty((33,), dtype=torch.int32, device=dev),
        paged_kv_indices_buffer=torch.empty((262176,), dtype=torch.int32, device=dev),
        paged_kv_last_page_len_buffer=torch.empty((32,), dtype=torch.int32, device=dev))
    kv_indptr_1_twin, kv_indices_1_twin, kv_last_page_len_1_twin = table_slice(
        CASE, x, starts=[8065] * 32, ends=[8193] * 32)
    decode_wrapper_twin.plan(
        kv_indptr_1_twin, kv_indices_1_twin, kv_last_page_len_1_twin, num_qo_heads=8, num_kv_heads=8,
        q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, sm_scale=0.125, head_dim=64, window_left=127,
        page_size=1)

    def step_twin():
        decode_wrapper_twin.run(q, (k_cache, v_cache), out=out_twin)

    wrong, what, _ = outcome(CASE, x, step, out, TOLERANCE)
    wrong_twin, what_twin, _ = outcome(CASE, x, step_twin, out_twin, TOLERANCE)
    slow, fast = graph_time_us(step), graph_time_us(step_twin)
    print(('REPRODUCED' if slow > THRESHOLD * fast else 'NOT REPRODUCED')
          + f': the full page table takes {slow:.1f} us a call, {slow / fast:.2f}x the {fast:.1f} us'
          + f' of the table trimmed to the window (threshold {THRESHOLD}x; CUDA graphs, L2 flushed before each call)')
    print('the full page table: ' + what)
    print('CONTROL, the table trimmed to the window: ' + what_twin)
    print(*env, sep="\n")
    return 1 if slow > THRESHOLD * fast or wrong or wrong_twin else 0


def make_inputs(case, device):
    """The case's tensors as swabench builds them: the page table (pages in a seeded random order unless
    contiguous), then N(0, 1) data from one seeded generator on the device."""
    qo_lens, kv_lens, ps, n = case["qo_lens"], case["kv_lens"], case["page_size"], len(case["kv_lens"])
    slot_start = [sum(kv_lens[:b]) for b in range(n + 1)]
    x = {"qo_indptr": torch.tensor([sum(qo_lens[:b]) for b in range(n + 1)], dtype=torch.int32),
         "slot_start": slot_start}
    pages = [-(-k // ps) for k in kv_lens]
    indptr = [sum(pages[:b]) for b in range(n + 1)]
    indices = torch.randperm(indptr[-1], generator=torch.Generator().manual_seed(case["seed"] + 1)).tolist()
    x["kv_indptr"] = torch.tensor(indptr, dtype=torch.int32)
    x["kv_indices"] = torch.tensor(indices, dtype=torch.int32)
    x["kv_last_page_len"] = torch.tensor([k - (p - 1) * ps for k, p in zip(kv_lens, pages)], dtype=torch.int32)
    request = torch.repeat_interleave(torch.arange(n), torch.tensor(kv_lens))
    j = torch.arange(slot_start[-1]) - torch.tensor(slot_start[:-1])[request]  # each key's position
    x["slots"] = torch.tensor(indices)[torch.tensor(indptr[:-1])[request] + j // ps] * ps + j % ps
    shape = (max(indices + [indptr[-1] - 1]) + 1, ps, case["num_kv_heads"], case["head_dim"])
    dtype, cache_dtype = ({"float8_e4m3": torch.float8_e4m3fn}.get(d) or getattr(torch, d)
                          for d in (case["dtype"], case["cache_dtype"]))
    g = torch.Generator(device=device).manual_seed(case["seed"])
    x["q"] = torch.randn((sum(qo_lens), case["num_qo_heads"], case["head_dim"]), generator=g, device=device).to(dtype)
    x["k_cache"], x["v_cache"] = (torch.randn(shape, generator=g, device=device).to(cache_dtype) for _ in "kv")
    return x


def table_slice(case, x, starts, ends, requests=None):
    """The page table of keys [start, end) of each entry's request (entry b is request b unless
    ``requests`` says otherwise): (indptr, indices, last_page_len), int32 on the host."""
    ps, requests = case["page_size"], requests or list(range(len(starts)))
    indptr, indices, last = [0], [], []
    for b, s, e in zip(requests, starts, ends):
        first = int(x["kv_indptr"][b])
        indices += x["kv_indices"][first + s // ps:first - (-e // ps)].tolist()
        indptr.append(len(indices))
        last.append(e - (-(-e // ps) - 1) * ps)
    return tuple(torch.tensor(v, dtype=torch.int32) for v in (indptr, indices, last))


def seen(case, b, device):
    """Bool [qo_len, kv_len] of request b: True where query i, at position kv_len - qo_len + i, sees key j."""
    qo, kv = case["qo_lens"][b], case["kv_lens"][b]
    position = torch.arange(kv - qo, kv, device=device)[:, None]
    key = torch.arange(kv, device=device)[None, :]
    allowed = torch.ones(qo, kv, dtype=torch.bool, device=device)
    allowed &= key <= position
    allowed &= key >= position - case["window_left"]
    return allowed


def reference(case, x):
    """The exact output in float32: per request, softmax(scale * q k^T) v over the keys its page table holds,
    masked as ``seen`` says."""
    h, hkv, d = case["num_qo_heads"], case["num_kv_heads"], case["head_dim"]
    k_all, v_all = x["k_cache"].reshape(-1, hkv, d), x["v_cache"].reshape(-1, hkv, d)
    out, row = torch.empty(x["q"].shape, dtype=torch.float32, device=x["q"].device), 0
    for b, (qo, kv) in enumerate(zip(case["qo_lens"], case["kv_lens"])):
        slots = x["slots"][x["slot_start"][b]:x["slot_start"][b + 1]].to(x["q"].device)
        k = k_all[slots].float().repeat_interleave(h // hkv, dim=1)
        v = v_all[slots].float().repeat_interleave(h // hkv, dim=1)
        s = torch.einsum("qhd,khd->hqk", x["q"][row:row + qo].float(), k) * case["sm_scale"]
        s = s.masked_fill(~seen(case, b, s.device), float("-inf"))
        out[row:row + qo] = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1)[..., :kv], v)
        row += qo
    return out


def outcome(case, x, step, out, tolerance):
    """Run ``step`` into ``out`` (NaN first: a row it never writes reads as wrong) and hold it to the reference:
    (wrong, what, the worst row's values).  A row is wrong where a head's rel-L2 error passes the row tolerance."""
    out.fill_(float("nan"))
    try:
        step()
        if out.is_cuda:
            torch.cuda.synchronize()
    except RuntimeError as e:  # an illegal memory access or a launch failure: the call never finished
        return True, f"crash: {str(e).strip().splitlines()[0]}", []
    ref, got = reference(case, x), out.float()
    diff = (got - ref).nan_to_num(nan=float("inf"))
    rel, head_err = float(diff.norm() / ref.norm()), diff.norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-6)
    row_err = head_err.amax(dim=-1)
    bad = row_err > tolerance["row_rel_l2"]
    errors = f"rel-L2 {rel:.3g}, worst row {float(row_err.max()):.3g}; tolerances {tolerance['rel_l2']:g}, " \
             f"{tolerance['row_rel_l2']:g}"
    if rel <= tolerance["rel_l2"] and not bad.any():
        return False, f"right ({errors})", []
    w, starts = int(row_err.argmax()), [0] + torch.tensor(case["qo_lens"]).cumsum(0).tolist()
    b, h = sum(start <= w for start in starts[1:-1]), int(head_err[w].argmax())
    values = ", ".join(f"{name} {[round(v, 3) for v in t[w, h, :4].tolist()]}" for name, t in (("expected", ref),
                                                                                               ("got", got)))
    return True, f"{wrong_rows(case, bad)} ({errors})", [f"worst: request {b} row {w - starts[b]}, head {h}, "
                                                          f"first values {values}"]


def wrong_rows(case, bad):
    """'request 0: rows 0-863 wrong': each request's wrong rows as ranges, neighbouring requests with the same
    ranges said once ('requests 0-31: rows 0-7 wrong')."""
    said = []
    for b, rows in enumerate(bad.split(case["qo_lens"])):
        i = rows.nonzero().flatten().tolist()
        runs = zip([r for k, r in enumerate(i) if k == 0 or i[k - 1] < r - 1],
                   [r for k, r in enumerate(i) if k == len(i) - 1 or i[k + 1] > r + 1])
        text = ", ".join(f"{a}-{z}" if z > a else f"{a}" for a, z in runs)
        if text and said and said[-1][1:] == [b - 1, text]:
            said[-1][1] = b
        elif text:
            said.append([b, b, text])
    return "; ".join((f"request {a}" if a == z else f"requests {a}-{z}") + f": rows {text} wrong"
                     for a, z, text in said) or "no row past the row tolerance"


def graph_time_us(step):
    """Microseconds a call of ``step`` as swabench times it: a CUDA graph of k calls (k for ~2 ms replays), an L2
    flush captured before each call and a graph of the flushes alone subtracted, the median of 20 replays."""
    flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size // 4, dtype=torch.int32, device="cuda")

    def replay_us(graph):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1000

    def captured(body, k):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            body()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(k):
                body()
        torch.cuda.synchronize()
        return graph

    once = replay_us(captured(step, 1))
    k = max(1, min(200, int(2000 / max(once, 1.0)) + 1))
    work, base = captured(lambda: (flush.zero_(), step()), k), captured(flush.zero_, k)
    replay_us(work), replay_us(base)  # the first replay uploads the graph
    samples = sorted((replay_us(work) - replay_us(base)) / k for _ in range(20))
    return samples[len(samples) // 2]


def environment():
    """What a maintainer asks first: Python, torch and its CUDA, the GPU (compute capability, SMs) and its driver,
    the flashinfer packages; then FlashInfer's own report (python -m flashinfer.collect_env) where the release has
    one."""
    import importlib.metadata, platform, subprocess, sys

    lines = [f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda})"]
    if torch.cuda.is_available():
        p, smi = torch.cuda.get_device_properties(0), "nvidia-smi --query-gpu=driver_version --format=csv,noheader"
        driver = subprocess.run(smi.split(), capture_output=True, text=True).stdout.split() or ["unknown"]
        lines.append(f"{p.name}: compute capability {p.major}.{p.minor}, {p.multi_processor_count} SMs, "
                     f"driver {driver[0]}")
    lines += [f"{d.metadata['Name']} {d.version}" for d in importlib.metadata.distributions()
              if (d.metadata["Name"] or "").lower().startswith("flashinfer")]
    report = subprocess.run([sys.executable, "-m", "flashinfer.collect_env"], capture_output=True, text=True)
    return lines + ([report.stdout.rstrip()] if report.returncode == 0 else [])


if __name__ == "__main__":
    sys.exit(main())
