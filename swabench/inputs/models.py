"""Model presets: the sliding-window layer of each served model, as the axes of a case.

One row per model, each field with the Hugging Face ``config.json`` key it came from and where the
value was read.  ``window_left = sliding_window - 1`` (SGLang's ``get_attention_sliding_window_size``
and vLLM both convert HF's inclusive count so); ``sm_scale`` is ``query_pre_attn_scalar ** -0.5``
where the config has one.  A model's own config is ``config.json`` in its repository on the hub (``hf_id``);
``gated`` names the licence its owner asks a reader to accept before the files can be read (Gemma, Llama 4,
Mistral), empty where the repository is public.  The hub was not reachable from the machine that wrote
the presets, so ``verified`` names the copies each row was checked against instead: duplicates and
derived models whose config keeps the hub's values, transformers' own defaults and the engines' code.
"""

from __future__ import annotations

from dataclasses import dataclass

from swabench.core import semantics
from swabench.errors import did_you_mean

KEYS = {  # axis -> the config.json key it comes from
    "num_qo_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim (else hidden_size / num_attention_heads)", "window_left": "sliding_window - 1",
    "sinks": "learned per-head sinks in the modeling code", "logits_soft_cap": "attn_logit_softcapping",
    "sm_scale": "query_pre_attn_scalar ** -0.5", "attention_chunk": "attention_chunk_size (text_config)",
    "num_layers": "num_hidden_layers", "global_every": "sliding_window_pattern (Gemma 3), the alternating "
    "layer_types (GPT-OSS, Gemma 2), no_rope_layer_interval (Llama 4)",
}


@dataclass(frozen=True)
class Model:
    name: str
    hf_id: str
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int  # HF's count of keys a query sees, itself included (-1: a chunked model)
    layers: str  # which layers slide (or are chunked)
    sinks: bool = False
    logits_soft_cap: float = 0.0
    query_pre_attn_scalar: int | None = None
    verified: str = ""
    attention_chunk: int = 0  # chunked local attention's C (Llama 4), in place of a sliding window
    num_layers: int = 0  # num_hidden_layers
    global_every: int = 0  # layer i attends globally where (i + 1) % global_every == 0; 0: every layer windowed
    gated: str = ""  # who the own repository opens to, where its owner gates it; "" = public

    @property
    def own(self) -> str:
        """The model's own config: config.json in its repository on the Hugging Face hub."""
        return f"https://huggingface.co/{self.hf_id}/blob/main/config.json"

    def source(self) -> str:
        """Which copy is the model's own, whether it is open to read, and what the preset was checked against."""
        access = f"gated: it opens only to {self.gated}" if self.gated else "public"
        return f"own config {self.own} ({access}), not read where the preset was written; checked instead against " \
               f"{self.verified}"

    def layer_types(self) -> list[str]:
        """Each layer's attention, in order, as its config's rule lays it out: "window" (sliding or chunked)
        or "global" (Gemma's sliding_window_pattern, GPT-OSS's and Gemma 2's alternating layer_types, Llama
        4's no_rope_layer_interval: every k-th layer global, counting from 1)."""
        return ["global" if self.global_every and (i + 1) % self.global_every == 0 else "window"
                for i in range(self.num_layers)]

    @property
    def windowed_layers(self) -> int:
        return self.layer_types().count("window")

    @property
    def window_left(self) -> int:
        return semantics.window_left_from(sliding_window=self.sliding_window)

    @property
    def sm_scale(self) -> float | None:
        """None where the model scales by head_dim ** -0.5 (the default)."""
        if self.query_pre_attn_scalar is None or self.query_pre_attn_scalar == self.head_dim:
            return None
        return self.query_pre_attn_scalar ** -0.5

    def features(self) -> bool:
        """Whether the layer has sinks or a soft-cap (what model_features = false takes away)."""
        return bool(self.sinks or self.logits_soft_cap)

    def axes(self) -> dict:
        """The case axes this model sets."""
        axes = dict(num_qo_heads=self.num_qo_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                    window_left=self.window_left, sinks=self.sinks, logits_soft_cap=self.logits_soft_cap)
        if self.sm_scale is not None:
            axes["sm_scale"] = self.sm_scale
        if self.attention_chunk:
            axes["attention_chunk"] = self.attention_chunk
        return axes


GPT_OSS = ("GitHub EchoCog/gpt-oss-20b config.json @52971a17 (a copy of the hub config); transformers "
           "configuration_gpt_oss.py @02b8f42b (defaults = the 120b values); sinks: modeling_gpt_oss.py @00d4b3d2 "
           "(GptOssAttention.sinks, one nn.Parameter per head)")
GEMMA2 = ("copies of google/gemma-2-*-it config.json (unsloth/gemma-2-it-GGUF @656b57f, thejaminator/gemma-hook-"
          "layer-0-step-2000 @33738e3, Saxo/Linkbricks-Horizon-AI-Korean-Superb-27B @468f547); transformers "
          "configuration_gemma2.py @008e5743")
LLAMA4 = ("transformers configuration_llama4.py @b17cfe48 (Llama4TextConfig defaults = Scout: 40/8 heads, head_dim 128, "
          "48 layers, attention_chunk_size 8192, no_rope_layer_interval 4) and modeling_llama4.py @63210d0e (RoPE "
          "layers take the chunked mask, NoPE layers the full causal one; scaling head_dim ** -0.5); vLLM "
          "models/llama4.py @0303cbd8 (ChunkedLocalAttention on RoPE layers); SGLang models/llama4.py @871da34d "
          "((layer_id + 1) % 4 != 0 uses RoPE); MaxText configs/models/llama4-17b-16e.yml @ab0fa7f0 and "
          "llama4-17b-128e.yml @48445cf0")
GEMMA_TERMS = "an account that has accepted Google's Gemma terms of use"
LLAMA4_TERMS = "an account that has accepted Meta's Llama 4 community license"
MISTRAL_TERMS = "an account that has shared its contact details with Mistral AI"
GEMMA3 = ("transformers configuration_gemma3.py @008f5c8c and convert_gemma3_weights_orbax_to_hf.py @0d914582; "
          "TensorRT-LLM test_modeling_gemma3.py @fe6fa01d (1b and 27b head shapes); HF OpenPipe/gemma-3-12b-it-"
          "text-only config.json (12b)")

MODELS = {m.name: m for m in (
    Model("gpt-oss-20b", "openai/gpt-oss-20b", 64, 8, 64, 128, "every other layer (layer_types alternate, "
          "sliding first): 12 of 24", sinks=True, verified=GPT_OSS, num_layers=24, global_every=2),
    Model("gpt-oss-120b", "openai/gpt-oss-120b", 64, 8, 64, 128, "every other layer: 18 of 36", sinks=True,
          verified=GPT_OSS + "; HF Fred808/helium_memory @9ce9198 (the 120b diff of that config)", num_layers=36, global_every=2),
    Model("gemma-2-2b", "google/gemma-2-2b", 8, 4, 256, 4096, "every other layer: 13 of 26", logits_soft_cap=50.0,
          query_pre_attn_scalar=256, verified=GEMMA2, num_layers=26, global_every=2, gated=GEMMA_TERMS),
    Model("gemma-2-9b", "google/gemma-2-9b", 16, 8, 256, 4096, "every other layer: 21 of 42", logits_soft_cap=50.0,
          query_pre_attn_scalar=256, verified=GEMMA2 + "; query_pre_attn_scalar 256 as the hub config has it "
          "(transformers' convert_gemma2_weights_to_hf.py @15ea02a2 says 224)", num_layers=42, global_every=2, gated=GEMMA_TERMS),
    Model("gemma-2-27b", "google/gemma-2-27b", 32, 16, 128, 4096, "every other layer: 23 of 46",
          logits_soft_cap=50.0, query_pre_attn_scalar=144, verified=GEMMA2, num_layers=46, global_every=2, gated=GEMMA_TERMS),
    Model("gemma-3-1b", "google/gemma-3-1b-pt", 4, 1, 256, 512, "5 of every 6 (sliding_window_pattern 6): 22 of 26",
          query_pre_attn_scalar=256, verified=GEMMA3, num_layers=26, global_every=6, gated=GEMMA_TERMS),
    Model("gemma-3-4b", "google/gemma-3-4b-pt", 8, 4, 256, 1024, "5 of every 6: 29 of 34 (text_config)",
          query_pre_attn_scalar=256, verified=GEMMA3 + "; text_config copies (head counts equal the defaults)", num_layers=34, global_every=6, gated=GEMMA_TERMS),
    Model("gemma-3-12b", "google/gemma-3-12b-pt", 16, 8, 256, 1024, "5 of every 6: 40 of 48 (text_config)",
          query_pre_attn_scalar=256, verified=GEMMA3, num_layers=48, global_every=6, gated=GEMMA_TERMS),
    Model("gemma-3-27b", "google/gemma-3-27b-pt", 32, 16, 128, 1024, "5 of every 6: 52 of 62 (text_config)",
          query_pre_attn_scalar=168, verified=GEMMA3, num_layers=62, global_every=6, gated=GEMMA_TERMS),
    Model("mistral-7b-v0.1", "mistralai/Mistral-7B-v0.1", 32, 8, 128, 4096, "every layer: 32 of 32",
          verified="copies with _name_or_path mistralai/Mistral-7B-v0.1 (Open-Orca/Mistral-7B-OpenOrca); "
                   "mlx-community/mistral-7B-v0.1 params.json (head_dim 128); transformers configuration_mistral.py "
                   "@001f85b3 (head_dim = hidden_size / num_attention_heads)", num_layers=32, gated=MISTRAL_TERMS),
    Model("llama-4-scout", "meta-llama/Llama-4-Scout-17B-16E", 40, 8, 128, -1, "chunked: 3 of every 4 (the RoPE "
          "layers; every 4th, NoPE, is global): 36 of 48", attention_chunk=8192, verified=LLAMA4, num_layers=48, global_every=4, gated=LLAMA4_TERMS),
    Model("llama-4-maverick", "meta-llama/Llama-4-Maverick-17B-128E", 40, 8, 128, -1, "chunked: 3 of every 4: 36 of "
          "48", attention_chunk=8192, verified=LLAMA4 + "; TensorRT-LLM test_modeling_llama_min_latency.py @b35ac1b6 "
          "(the Maverick config cut to 2 layers: 40/8, head_dim 128, chunk 8192)", num_layers=48, global_every=4, gated=LLAMA4_TERMS),
    Model("phi-3-mini", "microsoft/Phi-3-mini-4k-instruct", 32, 32, 96, 2047, "every layer: 32 of 32",
          verified="HF Alignment-Lab-AI/idfkphi4kiguess config.json (a duplicate of microsoft/Phi-3-mini-4k-"
                   "instruct); transformers modular_phi3.py @06053b84 (head_dim = 3072 / 32)", num_layers=32),
)}


def get(name: str) -> Model:
    """The preset, or ValueError naming the known ones."""
    if not isinstance(name, str) or name not in MODELS:
        raise ValueError(f"unknown model {name!r}{did_you_mean(name, MODELS)}; known: {', '.join(MODELS)}")
    return MODELS[name]


def serves(name: str, sinks, logits_soft_cap) -> bool:
    """Whether a result row with these features is the model as served rather than its plain twin
    (a preset this version does not know, or a table without these columns, counts as served)."""
    m = MODELS.get(name)
    if m is None or sinks != sinks or logits_soft_cap != logits_soft_cap:  # NaN: the column is missing
        return True
    return str(sinks).lower() == str(m.sinks).lower() and float(logits_soft_cap) == float(m.logits_soft_cap)


def listing() -> str:
    """What ``swabench models`` prints: each preset's layer shape, and where it was checked."""
    lines = [f"  {'model':16s} {'heads':7s} {'head_dim':8s} {'window':7s} {'W':5s} extras"]
    for m in MODELS.values():
        extras = ", ".join(x for x in (f"chunk {m.attention_chunk}" if m.attention_chunk else "",
                                       "sinks" if m.sinks else "",
                                       f"soft-cap {m.logits_soft_cap:g}" if m.logits_soft_cap else "",
                                       f"sm_scale {m.query_pre_attn_scalar}^-0.5" if m.sm_scale else "") if x)
        heads = f"{m.num_qo_heads}/{m.num_kv_heads}"
        lines.append(f"  {m.name:16s} {heads:7s} {m.head_dim:<8d} {m.sliding_window:<7d} "
                     f"{m.window_left:<5d} {extras or '-'}; layers: {m.layers}")
    lines.append("fields: " + "; ".join(f"{axis} = {key}" for axis, key in KEYS.items()))
    lines.append("sources: each model's own config is config.json in its repository on the Hugging Face hub; the hub "
                 "was not reachable from the machine that wrote these presets (and a gated repository opens only to "
                 "an account that accepted its license), so each preset was checked against the copies named here, "
                 "whose configs keep the hub's values, and against transformers' defaults and the engines' code")
    lines += [f"  {m.name}: {m.source()}" for m in MODELS.values()]
    return "\n".join(lines)
