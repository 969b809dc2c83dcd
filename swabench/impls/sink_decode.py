"""FlashInfer's decode wrapper for sink layers (GPT-OSS), new in 0.7.4: ``BatchDecodeWithAttentionSinkWrapper``
runs the sink kernel through the tensor-core decode wrapper, so a sink layer's decode step is built, planned and
captured like any decode wrapper's.  A release without it skips the path, naming itself."""

from __future__ import annotations

from . import flashinfer_impls as fi

fi.register_variant("sink-decode", "BatchDecodeWithAttentionSinkWrapper (0.7.4): the sink kernel through the tensor-core "
                    "decode wrapper, plan(window_left=W), run(q, kv, sinks, sm_scale)",
                    fi.Variant("paged", decode="tensor-core", sinks="apply"), wrapper="sink", module=__name__)
