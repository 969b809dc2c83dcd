"""The sink wrapper at two head_dims in one process.  FlashInfer 0.7.2 names its JIT module
``batch_prefill_attention_sink_{q dtype}_swa_{window}_{backend}`` (attention/_core.py): the head_dim
and the cache dtype are not in the name.  Gate sink-window at head_dim 64 and then 128 (and the
reverse order in a second process): does the second shape get its own module?
Usage on the GPU node: python scripts/sink_head_dims.py 64 128"""

import argparse
import importlib.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("head_dims", nargs="+", type=int, metavar="HEAD_DIM", help="gated in this order")
    args = parser.parse_args(argv)
    from swabench.errors import UserError
    from swabench.inputs import axes

    try:
        cases = [axes.make_case(dict(mode="verify", draft_tokens=8, prefix_len=2000, sliding_window=128, batch_size=4,
                                     num_qo_heads=16, num_kv_heads=8, head_dim=d, sinks=True)) for d in args.head_dims]
    except UserError as e:
        parser.error(f"HEAD_DIM: {e}")
    import torch

    if not torch.cuda.is_available() or importlib.util.find_spec("flashinfer") is None:
        parser.error("runs on a GPU node: needs a CUDA device and flashinfer")
    from swabench.core import gate, workloads
    from swabench.impls import registry

    for c in cases:
        w = workloads.build(c, "cuda")
        try:
            runner = registry.get("sink-window").make(w, "fa2")
            runner.plan()
            result = gate.check(runner, w)
            print(f"head_dim {c.head_dim}: passed={result.passed} rel_l2={result.rel_l2:.3g} {result.reason[:160]}")
        except Exception as e:  # what the library does with the second shape is the question
            print(f"head_dim {c.head_dim}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
