"""The child of scripts/fa4_cold_crash.py: one hypothesis in one process, torch and flash_attn.cute (and FlashInfer,
the cuDNN frontend, nvtx or NVML where a condition asks for them).  It calls FA4's varlen forward as swabench's
Fa4Runner does, checks each output against a float32 reference, says when each cute.compile, each export to FA4's disk
cache and each first call starts and ends, and ends with a RESULT line:

    python scripts/fa4_cold_child.py warmup-thread,graph        # conditions: scripts/fa4_cold_crash.py --list

Set FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 and FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=<an empty folder> for a cold run
(scripts/fa4_cold_crash.py does).  Nothing of swabench is imported.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor

MARK = "[fa4cold]"
TOLERANCE = 3e-2  # max abs error of a bf16 output against the float32 reference
REAL = dict(storage="ragged", batch=4, q_len=64, prefix=512, heads=32, kv_heads=8, head_dim=128, window=127,
            sinks=False, softcap=0.0, page_size=16)
TINY = dict(REAL, batch=1, q_len=4, prefix=64, window=8)  # the suite's warm-up case (run.sweep.tiny_case) of REAL
CONCURRENT = [REAL, dict(REAL, head_dim=64, sinks=True), dict(REAL, softcap=50.0), dict(REAL, window=None)]


def say(message: str) -> None:
    """One line on the process's stderr itself: the CuTe DSL swaps sys.stderr for a buffer while it compiles."""
    import os
    import threading
    os.write(2, f"{MARK} {time.monotonic() - T0:7.1f}s [{threading.current_thread().name}] {message}\n".encode())


def inputs(spec: dict, device) -> tuple[dict, tuple]:
    """flash_attn_varlen_func's arguments for spec (the suite's Fa4Runner call), and (q, k, v, sinks) per request."""
    import torch

    g = torch.Generator().manual_seed(0)
    b, ql, kl, h, hk, d = (spec[k] for k in ("batch", "q_len", "prefix", "heads", "kv_heads", "head_dim"))
    kl += ql
    q, k, v = (torch.randn(b * n, heads, d, generator=g).to(device, torch.bfloat16)
               for n, heads in ((ql, h), (kl, hk), (kl, hk)))
    sinks = torch.randn(h, generator=g).to(device) + 2.0 if spec["sinks"] else None
    ends = torch.arange(b + 1, dtype=torch.int32, device=device)
    args = dict(q=q, cu_seqlens_q=ends * ql, max_seqlen_q=ql, softmax_scale=d ** -0.5, causal=True,
                window_size=(spec["window"], None), learnable_sink=sinks, softcap=spec["softcap"], num_splits=1)
    if spec["storage"] == "ragged":
        args.update(k=k, v=v, cu_seqlens_k=ends * kl, max_seqlen_k=kl)
    else:  # pages of page_size tokens, each request's in a shuffled order, as the suite's scattered page tables
        ps = spec["page_size"]
        pages = -(-kl // ps)
        order = torch.randperm(b * pages, generator=g)
        stores = []
        for t in (k, v):
            padded = torch.zeros(b, pages * ps, hk, d, dtype=t.dtype, device=device)
            padded[:, :kl] = t.view(b, kl, hk, d)
            store = torch.empty(b * pages, ps, hk, d, dtype=t.dtype, device=device)
            store[order.to(device)] = padded.view(b * pages, ps, hk, d)
            stores.append(store)
        args.update(k=stores[0], v=stores[1], page_table=order.view(b, pages).to(device, torch.int32),
                    seqused_k=torch.full((b,), kl, dtype=torch.int32, device=device))
    return args, (q, k, v, sinks)


def reference(spec: dict, q, k, v, sinks):
    """float32 attention: query i of a request at position kl - ql + i sees keys p - W .. p (W + 1, FA4's window)."""
    import torch

    b, ql, h, hk, d = (spec[k] for k in ("batch", "q_len", "heads", "kv_heads", "head_dim"))
    kl = spec["prefix"] + ql
    qf = q.float().view(b, ql, h, d)
    kf, vf = (t.float().view(b, kl, hk, d).repeat_interleave(h // hk, dim=2) for t in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", qf, kf) * d ** -0.5
    if spec["softcap"]:
        s = spec["softcap"] * torch.tanh(s / spec["softcap"])
    position = torch.arange(ql, device=q.device)[:, None] + (kl - ql)
    key = torch.arange(kl, device=q.device)[None, :]
    keep = (key <= position) & ((key >= position - spec["window"]) if spec["window"] is not None else True)
    s = s.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.float().view(1, h, 1, 1).expand(b, h, ql, 1)], dim=-1)
    p = torch.softmax(s, dim=-1)[..., :kl]
    return torch.einsum("bhqk,bkhd->bqhd", p, vf).reshape(b * ql, h, d)


def instrument() -> None:
    """Say when each cute.compile and each disk-cache export starts and ends (FA4 looks both up at call time)."""
    import cutlass.cute as cute
    from flash_attn.cute import cache_utils

    compile_, export = cute.compile, cache_utils.JITPersistentCache._try_export_to_storage

    class Said:
        def __call__(self, fn, *args, **kwargs):
            name = getattr(fn, "__name__", type(fn).__name__)
            say(f"cute.compile {name} ...")
            compiled = compile_(fn, *args, **kwargs)
            say(f"cute.compile {name} done")
            return compiled

        def __getitem__(self, options):
            return compile_[options]

    def exported(self, key, fn):
        say("export to the disk cache ...")
        export(self, key, fn)
        say("export done")
    cute.compile, cache_utils.JITPersistentCache._try_export_to_storage = Said(), exported


def step(name: str, spec: dict, conds: tuple[str, ...], device, barrier=None) -> float:
    """One FA4 call of spec (built in the calling thread, as the suite's warm-up builds its workload), checked."""
    import torch
    from flash_attn.cute import flash_attn_varlen_func

    args, data = inputs(spec, device)
    call = lambda: flash_attn_varlen_func(**args)[0]  # noqa: E731
    if barrier is not None:
        barrier.wait()
    if "nvtx" in conds:
        import nvtx
        nvtx.push_range(message=f"warm-up {name}", domain="swabench")
    say(f"{name}: first call ...")
    if "capture-first" in conds and name == "point":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = call()
        graph.replay()
    else:
        out = call()
    torch.cuda.synchronize()
    say(f"{name}: first call done")
    if "graph" in conds and name == "point":  # swabench.measure.timing.capture, then replays
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            call()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(2):
                out = call()
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        say(f"{name}: captured and replayed")
    if "nvtx" in conds:
        nvtx.pop_range(domain="swabench")
    error = (out.float() - reference(spec, *data)).abs().max().item()
    say(f"{name}: max abs error {error:.3g}")
    return error


def child(conds: tuple[str, ...]) -> int:
    """Run the steps the conditions ask for, the point last; 0 when every output matched the reference, 4 when not."""
    import faulthandler
    import threading

    faulthandler.enable(all_threads=True)
    if "bigstack" in conds:
        threading.stack_size(512 << 20)
    say(f"conditions: {'+'.join(conds) or 'none'}")
    import torch

    if "flashinfer" in conds:
        import flashinfer
        say(f"flashinfer {flashinfer.__version__} imported; the CuTe DSL (cutlass) loaded: {'cutlass' in sys.modules}")
    if "cudnn" in conds:
        import cudnn
        say(f"cudnn frontend {getattr(cudnn, '__version__', '?')} over cuDNN {cudnn.backend_version()}")
    if "nvml" in conds:
        import pynvml
        pynvml.nvmlInit()
        say(f"NVML: SM clock {pynvml.nvmlDeviceGetClockInfo(pynvml.nvmlDeviceGetHandleByIndex(0), 1)} MHz")
    device = torch.device("cuda")
    if "peaks" in conds:
        a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        for _ in range(5):
            a @ a
        big = torch.empty(1 << 28, device=device)
        big.copy_(torch.randn_like(big))
        torch.cuda.synchronize()
        del a, big
        say("peaks done")
    import flash_attn.cute  # noqa: F401
    instrument()
    errors = {}

    def threads(jobs: list[tuple[str, dict]], workers: int, together: bool = False) -> None:
        barrier = threading.Barrier(len(jobs)) if together else None
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="warm-up") as pool:
            done = [pool.submit(step, name, spec, conds, device, barrier) for name, spec in jobs]
            errors.update({name: f.result() for (name, _), f in zip(jobs, done)})

    point = dict(REAL, storage="paged" if "paged" in conds else "ragged")
    if "paged-first" in conds:
        errors["paged-first"] = step("paged-first", dict(REAL, storage="paged"), conds, device)
    if "warmup-main" in conds:
        errors["tiny"] = step("tiny", TINY, conds, device)
    if "warmup-thread" in conds:
        threads([("tiny", TINY)], 8)
    if "concurrent" in conds:
        threads([(f"kernel{i}", spec) for i, spec in enumerate(CONCURRENT)], 4, together=True)
    if "same-key" in conds:
        threads([("window127", REAL), ("window128", dict(REAL, window=128))], 2, together=True)
    if "real-thread" in conds:
        threads([("point", point)], 8)
    else:
        errors["point"] = step("point", point, conds, device)
    wrong = {name: e for name, e in errors.items() if not e <= TOLERANCE}
    say(f"RESULT {'wrong ' + str(wrong) if wrong else 'ok'}")
    return 4 if wrong else 0


T0 = time.monotonic()

if __name__ == "__main__":
    sys.exit(child(tuple(c for c in (sys.argv[1] if len(sys.argv) > 1 else "").split(",") if c)))
