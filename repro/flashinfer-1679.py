#!/usr/bin/env python3
"""BatchAttentionWithAttentionSinkWrapper at a second head_dim in one process runs the first's module

Call: flashinfer.BatchAttentionWithAttentionSinkWrapper(backend='fa2', use_cuda_graph=True, window_left=127),
    then plan(causal=True, window_left=127, uniform_q_len=8), run()
Shape: batch 4; qo_len 8 each; kv_len 308 each; 64 query and 8 KV heads; head_dim 64; page_size 16 (scattered
    pages); window_left 127; causal=True; sinks; no soft-cap; bfloat16
What is wrong: the sink wrapper's JIT module is named by query dtype, window and backend only (since the
    wrapper came in flashinfer#1679; 0.7.4 adds the head_dims and cache dtype, no upstream report found): a
    process that built it at one head_dim runs that module again at another: rows unwritten or wrong, or the
    CUDA context lost
Where it shows: verify b4 p300 q8 W127 ps16 h64/8 d64 bfloat16 sinks s0, run after the same wrapper at
    head_dim 128 in one process; fixed in 0.7.4
Matters: two BatchAttentionWithAttentionSinkWrapper plans at different head_dim in one process (the second
    runs the first's module)
Expected: every row is float32 softmax attention over the keys its mask allows (reference() below), within
    swabench's gate: rel-L2 at most 0.01 overall and 0.05 in every row and head
Observed on flashinfer 0.7.4, NVIDIA H200 (132 SMs): NOT REPRODUCED: right (rel-L2 0.00262, worst row 0.00431;
    tolerances 0.01, 0.05)
Observed on flashinfer 0.7.2.post1, NVIDIA H200 (132 SMs): REPRODUCED: requests 0-3: rows 0-7 wrong (rel-L2
    1.8, worst row 14.3; tolerances 0.01, 0.05)
Fault: FlashInfer before 0.7.4, fixed there: the sink wrapper's JIT module is named without its head_dim.
    flashinfer#1679 is the pull request that added the wrapper, not a bug report: this script is a regression
    test, nothing to file.
Upstream: https://github.com/flashinfer-ai/flashinfer/pull/1679
Control: none in one process; the same script on the release that fixed it is right
Made by: swabench repro --bug flashinfer#1679
Run: python3 with torch, flashinfer and a CUDA GPU (kernels build on first use: minutes). It prints REPRODUCED
    or NOT REPRODUCED, the control's verdict, the environment; exits 1 when reproduced.
"""

import sys

import torch

import flashinfer

CASE_first = dict(
    qo_lens=[8] * 4, kv_lens=[308] * 4, num_qo_heads=64, num_kv_heads=8, head_dim=128, page_size=16,
    window_left=127, sm_scale=0.08838834764831845, dtype='bfloat16', cache_dtype='bfloat16', seed=0)
CASE = dict(
    qo_lens=[8] * 4, kv_lens=[308] * 4, num_qo_heads=64, num_kv_heads=8, head_dim=64, page_size=16,
    window_left=127, sm_scale=0.125, dtype='bfloat16', cache_dtype='bfloat16', seed=0)
TOLERANCE = {'rel_l2': 0.01, 'row_rel_l2': 0.05}  # swabench's gate on random inputs, bfloat16
DEVICE = "cuda"


def main():
    dev = torch.device(DEVICE)
    env = environment()  # before any call: a crash can take the CUDA context with it
    # sink-window on flashinfer (fa2): BatchAttentionWithAttentionSinkWrapper (GPT-OSS), plan(causal=True,
    # window_left=W), run(q, kv, sinks, sm_scale)
    x_first = make_inputs(CASE_first, dev)
    q_first, k_cache_first, v_cache_first = x_first["q"], x_first["k_cache"], x_first["v_cache"]
    sinks_first, qo_indptr_first = x_first["sinks"], x_first["qo_indptr"]
    kv_indptr_first, kv_indices_first = x_first["kv_indptr"], x_first["kv_indices"]
    kv_last_page_len_first = x_first["kv_last_page_len"]
    out_first = torch.empty_like(x_first["q"])
    workspace_first = torch.empty((268435456,), dtype=torch.uint8, device=dev)
    sink_wrapper_first = flashinfer.BatchAttentionWithAttentionSinkWrapper(
        workspace_first, "NHD", backend="fa2", use_cuda_graph=True,
        qo_indptr_buf=torch.empty((5,), dtype=torch.int32, device=dev),
        paged_kv_indptr_buf=torch.empty((5,), dtype=torch.int32, device=dev),
        paged_kv_indices_buf=torch.empty((80,), dtype=torch.int32, device=dev),
        paged_kv_last_page_len_buf=torch.empty((4,), dtype=torch.int32, device=dev), q_data_type=torch.bfloat16,
        kv_data_type=torch.bfloat16, head_dim_qk=128, head_dim_vo=128, window_left=127)
    sink_wrapper_first.plan(
        qo_indptr_first, kv_indptr_first, kv_indices_first, kv_last_page_len_first, num_qo_heads=64,
        num_kv_heads=8, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, sm_scale=0.08838834764831845,
        causal=True, window_left=127, head_dim_qk=128, page_size=16,
        **taken_by(sink_wrapper_first.plan, uniform_q_len=8))

    def step_first():
        sink_wrapper_first.run(
            q_first, (k_cache_first, v_cache_first), sinks_first, 0.08838834764831845, out=out_first)

    step_first()  # run first, in this process, before the checked call
    x = make_inputs(CASE, dev)
    q, k_cache, v_cache, sinks, qo_indptr = x["q"], x["k_cache"], x["v_cache"], x["sinks"], x["qo_indptr"]
    kv_indptr, kv_indices, kv_last_page_len = x["kv_indptr"], x["kv_indices"], x["kv_last_page_len"]
    out = torch.empty_like(x["q"])
    workspace = torch.empty((268435456,), dtype=torch.uint8, device=dev)
    sink_wrapper = flashinfer.BatchAttentionWithAttentionSinkWrapper(
        workspace, "NHD", backend="fa2", use_cuda_graph=True,
        qo_indptr_buf=torch.empty((5,), dtype=torch.int32, device=dev),
        paged_kv_indptr_buf=torch.empty((5,), dtype=torch.int32, device=dev),
        paged_kv_indices_buf=torch.empty((80,), dtype=torch.int32, device=dev),
        paged_kv_last_page_len_buf=torch.empty((4,), dtype=torch.int32, device=dev), q_data_type=torch.bfloat16,
        kv_data_type=torch.bfloat16, head_dim_qk=64, head_dim_vo=64, window_left=127)
    sink_wrapper.plan(
        qo_indptr, kv_indptr, kv_indices, kv_last_page_len, num_qo_heads=64, num_kv_heads=8,
        q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, sm_scale=0.125, causal=True, window_left=127,
        head_dim_qk=64, page_size=16, **taken_by(sink_wrapper.plan, uniform_q_len=8))

    def step():
        sink_wrapper.run(q, (k_cache, v_cache), sinks, 0.125, out=out)

    wrong, what, detail = outcome(CASE, x, step, out, TOLERANCE)
    verdict = "NOT REPRODUCED" if not wrong else "REPRODUCED (crash)" if what.startswith("crash") else "REPRODUCED"
    print(f"{verdict}: {what}", *detail, sep="\n")
    print(*env, sep="\n")
    return 1 if wrong else 0


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
    gs = torch.Generator(device=device).manual_seed(case["seed"] + 7)
    x["sinks"] = 3.0 + 2.0 * torch.randn((case["num_qo_heads"],), generator=gs, device=device)
    return x


def taken_by(fn, **keywords):
    """The keywords ``fn`` takes: swabench passes these only where the installed release has them."""
    import inspect

    return {k: v for k, v in keywords.items() if k in inspect.signature(fn).parameters}


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
        # each head's sink logit joins the denominator
        s = torch.cat([s, x["sinks"].float()[:, None, None].expand(-1, qo, 1)], dim=-1)
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
