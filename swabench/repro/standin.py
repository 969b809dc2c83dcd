"""A stand-in for the ``flashinfer`` module: its wrapper classes and ``merge_state_in_place`` hand every
call to a callback and compute nothing.  Running a suite path against it on the CPU shows the exact
construction, ``plan()`` and ``run()`` arguments the path makes; running a rendered script against it
shows the arguments the script makes.  The two must agree.
"""

from __future__ import annotations

import sys
import types
from contextlib import contextmanager
from typing import Callable

WRAPPERS = {  # class -> the variable a script names its object
    "BatchPrefillWithPagedKVCacheWrapper": "paged_wrapper",
    "BatchPrefillWithRaggedKVCacheWrapper": "ragged_wrapper",
    "BatchDecodeWithPagedKVCacheWrapper": "decode_wrapper",
    "BatchAttentionWithAttentionSinkWrapper": "sink_wrapper",
    "BatchDecodeWithAttentionSinkWrapper": "sink_decode_wrapper",
    "BatchPrefillWithCausalBidirectionalRangesWrapper": "ranges_wrapper",
    "BatchAttention": "holistic",
    "BatchPODWithPagedKVCacheWrapper": "pod_wrapper",
}
RETURNS = {"BatchPODWithPagedKVCacheWrapper": (0, 2)}  # run() returns new outputs shaped as these arguments
FUNCTIONS = ("xqa", "decode.xqa_batch_decode_with_kv_cache", "trtllm_fmha_v2_prefill",
             "prefill.cudnn_batch_prefill_with_kv_cache", "decode.cudnn_batch_decode_with_kv_cache")
# plan() keywords the suite passes only where the installed release takes them (FlashInferRunner's hint)
OPTIONAL_PLAN_KEYWORDS = ("uniform_q_len",)

# on_call(wrapper or None, class name, method, args, kwargs) -> what the call returns
OnCall = Callable[..., object]


def module(on_call: OnCall) -> types.ModuleType:
    """A ``flashinfer`` whose wrappers report each call to ``on_call``."""
    fake = types.ModuleType("flashinfer")
    fake.__version__ = "stand-in"

    def wrapper_class(cls_name: str):
        def __init__(self, *args, **kwargs):
            on_call(self, cls_name, "__init__", args, kwargs)

        def plan(self, *args, uniform_q_len=None, **kwargs):
            if uniform_q_len is not None:
                kwargs["uniform_q_len"] = uniform_q_len
            return on_call(self, cls_name, "plan", args, kwargs)

        def method(name):
            return lambda self, *args, **kwargs: on_call(self, cls_name, name, args, kwargs)

        def run(self, *args, **kwargs):
            said = on_call(self, cls_name, "run", args, kwargs)
            if said is None and cls_name in RETURNS:  # a run() that returns its outputs: empty ones, shaped
                import torch

                return tuple(torch.empty_like(args[i]) for i in RETURNS[cls_name])
            return said

        def __setattr__(self, name, value):
            on_call(self, cls_name, "__setattr__", (name, value), {})
            object.__setattr__(self, name, value)

        return type(cls_name, (), {"__init__": __init__, "plan": plan, "run": run,
                                   "forward": method("forward"), "__setattr__": __setattr__})

    for cls_name in WRAPPERS:
        setattr(fake, cls_name, wrapper_class(cls_name))
    fake.merge_state_in_place = lambda *args, **kwargs: on_call(None, None, "merge_state_in_place", args, kwargs)
    for name in FUNCTIONS:  # module functions: flashinfer.xqa, flashinfer.decode.xqa_batch_decode_with_kv_cache
        where, _, leaf = name.rpartition(".")
        owner = fake if not where else getattr(fake, where, None) or types.SimpleNamespace()
        setattr(owner, leaf, lambda *args, _name=name, **kwargs: on_call(None, None, _name, args, kwargs))
        if where:
            setattr(fake, where, owner)
    return fake


@contextmanager
def installed(on_call: OnCall):
    """``import flashinfer`` gives the stand-in inside the block."""
    saved = sys.modules.get("flashinfer")
    sys.modules["flashinfer"] = module(on_call)
    try:
        yield
    finally:
        if saved is None:
            sys.modules.pop("flashinfer", None)
        else:
            sys.modules["flashinfer"] = saved
