#!/usr/bin/env python3
"""BatchAttention reads the wrong keys from pages past 2^32 elements of the K/V cache

Call: flashinfer.BatchAttention(kv_layout='NHD'), its float_workspace_buffer grown until plan() fits, then
    plan(qo_indptr, kv_indptr, kv_indices, kv_lens, ..., causal=True) on each request's table trimmed to its
    window, run(q, (k_cache, v_cache), out=, lse=)
Shape: batch 128; qo_len 1 each; kv_len 16385 each; 32 query and 16 KV heads; head_dim 128; page_size 1
    (scattered pages); window_left 1023; causal=True; no sinks; no soft-cap; bfloat16
What is wrong: BatchAttention (the persistent holistic kernel) computes a page's K/V offset as the int32 page
    index times the uint32 page stride in 32 bits (prefetch_offest, attention/persistent.cuh): a page that
    ends past 2^32 elements of its cache (8 GiB of bfloat16) is read from the wrong place (flashinfer#3136
    fixed the same product in the MLA kernels)
Where it shows: decode b128 p16384 q1 W1023 ps1 h32/16 d128 bfloat16 scale0.07715 s0 [gemma-3-27b]: requests
    47, 64, 121, 123 read a page that ends past 2^32 elements
Matters: a K (or V) cache of more than 2^32 elements (8 GiB of bfloat16: 128 requests x 16K tokens x 16 KV
    heads x 128) and a request whose table holds a page past that point. Seen on decode at page size 1; the
    source has the same offset for every page size and step. The script needs about 40 GiB of GPU memory
Expected: every row is float32 softmax attention over the keys its mask allows (reference() below), within
    swabench's gate: rel-L2 at most 0.01 overall and 0.05 in every row and head
Observed on flashinfer 0.7.4, NVIDIA H200 (132 SMs): REPRODUCED: request 47: rows 0 wrong; request 64: rows 0
    wrong; request 121: rows 0 wrong; request 123: rows 0 wrong (rel-L2 0.00938, worst row 0.225; tolerances
    0.01, 0.05)
Observed on flashinfer 0.7.2.post1, NVIDIA H200 (132 SMs): REPRODUCED: request 47: rows 0 wrong; request 64:
    rows 0 wrong; request 121: rows 0 wrong; request 123: rows 0 wrong (rel-L2 0.00938, worst row 0.225;
    tolerances 0.01, 0.05)
Fault: FlashInfer: prefetch_offest in include/flashinfer/attention/persistent.cuh sums the offset
    indices[page_iter] * kv_stride_page + entry_idx * kv_stride_n + kv_head_idx * kv_stride_h + ... in uint32
    (an int32 index, uint32 strides) and only then stores it in a size_t, so it wraps at 2^32 elements. The
    fix is static_cast<size_t>(indices[page_iter]) * kv_stride_page, as paged_kv_t::get_elem_offset does for
    the prefill and decode kernels and as pull request flashinfer#3136 did in the MLA kernels. Not reported
    upstream yet: file it as a new issue.
Control: the same call on a copy of the trimmed pages numbered from 0 (every offset below 2^32 elements); its
    verdict is printed beside the bug's
Made by: swabench repro --bug holistic-offset
Run: python3 with torch, flashinfer and a CUDA GPU (kernels build on first use: minutes). It prints REPRODUCED
    or NOT REPRODUCED, the control's verdict, the environment; exits 1 when reproduced.
"""

import sys

import torch

import flashinfer

CASE = dict(
    qo_lens=[1] * 128, kv_lens=[16385] * 128, num_qo_heads=32, num_kv_heads=16, head_dim=128, page_size=1,
    window_left=1023, sm_scale=0.07715167498104596, dtype='bfloat16', cache_dtype='bfloat16', seed=0)
TOLERANCE = {'rel_l2': 0.01, 'row_rel_l2': 0.05}  # swabench's gate on random inputs, bfloat16
DTYPE = torch.bfloat16
WORKSPACE, CAP = 256 * 2**20, 4096 * 2**20  # float workspace bytes: the first tried, the most
OVERFLOW = 'Increase the workspace buffer size'  # what plan() says when its workspace is too small
CONTROL = 'the same call on a copy of the trimmed pages numbered from 0 (every offset below 2^32 elements)'
DEVICE = "cuda"


def main():
    dev = torch.device(DEVICE)
    env = environment()  # before any call: a crash can take the CUDA context with it
    x = make_inputs(CASE, dev)
    q, k_cache, v_cache = x["q"], x["k_cache"], x["v_cache"]
    out, lse = torch.empty_like(q), torch.empty(q.shape[:2], dtype=torch.float32, device=dev)
    # each request's table from the page that holds its oldest visible key (page size 1: exactly its window)
    ps, window = CASE["page_size"], CASE["window_left"]
    starts = [max(0, k - n - window) // ps * ps for n, k in zip(CASE["qo_lens"], CASE["kv_lens"])]
    kv_indptr, kv_indices, _ = table_slice(CASE, x, starts, CASE["kv_lens"])
    kv_lens = torch.tensor([k - s for k, s in zip(CASE["kv_lens"], starts)], dtype=torch.int32)
    stride = ps * CASE["num_kv_heads"] * CASE["head_dim"]  # elements a page holds, K's and V's alike
    last_page = [int(kv_indices[kv_indptr[b]:kv_indptr[b + 1]].max()) for b in range(len(starts))]
    past = [b for b, page in enumerate(last_page) if (page + 1) * stride > 2**32]
    holistic = flashinfer.BatchAttention(kv_layout="NHD", device=dev)

    def plan(indices):
        plan_grown(holistic, dev, x["qo_indptr"], kv_indptr, indices.to(device=dev), kv_lens, CASE["num_qo_heads"],
                   CASE["num_kv_heads"], CASE["head_dim"], CASE["head_dim"], ps, causal=True,
                   sm_scale=CASE["sm_scale"], logits_soft_cap=None, q_data_type=DTYPE, kv_data_type=DTYPE)

    plan(kv_indices)

    def step():
        holistic.run(q, (k_cache, v_cache), out=out, lse=lse, logits_soft_cap=0.0)

    wrong, what, detail = outcome(CASE, x, step, out, TOLERANCE)
    verdict = "NOT REPRODUCED" if not wrong else "REPRODUCED (crash)" if what.startswith("crash") else "REPRODUCED"
    print(f"{verdict}: {what}", *detail, f"requests {past} read a page that ends past 2^32 elements", sep="\n")
    # Control: the same pages copied out and numbered from 0, so every offset stays below 2^32
    used = kv_indices.to(device=dev, dtype=torch.int64)
    k_small, v_small = k_cache[used], v_cache[used]
    plan(torch.arange(len(used), dtype=torch.int32))

    def step_control():
        holistic.run(q, (k_small, v_small), out=out, lse=lse, logits_soft_cap=0.0)

    print(f"CONTROL, {CONTROL}: " + outcome(CASE, x, step_control, out, TOLERANCE)[1])
    print(*env, sep="\n")
    return 1 if wrong else 0


def plan_grown(wrapper, dev, *args, **kwargs):
    """plan() in a float workspace that holds its partial outputs: BatchAttention allocates 384 MiB and its
    planner reserves them by SM count and KV heads (622 MB on an H200 at 16 KV heads), so grow it on overflow."""
    size = WORKSPACE
    while True:
        wrapper.float_workspace_buffer = torch.empty((size,), dtype=torch.uint8, device=dev)
        try:
            return wrapper.plan(*args, **kwargs)
        except RuntimeError as e:
            if OVERFLOW not in str(e) or size >= CAP:
                raise
            size *= 2


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
