"""attngen.transformers: Hugging Face transformers models on attngen's kernels (docs/transformers.md).

    import attngen.transformers as at
    print(at.from_hf("path/to/config.json"))          # the .attn specs the model needs
    at.register()                                     # attn_implementation="attngen"
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="attngen")

`from_hf` (and `attngen spec --from-hf CONFIG`) needs neither transformers nor PyTorch;
`register` needs both (the optional extra `attngen[transformers]`).
"""

from __future__ import annotations

from .config import FAMILIES, ConfigError, LayerAttention, ModelAttention, model_attention, specs_text


def from_hf(config, dtype: str | None = None, name: str | None = None) -> str:
    """The .attn text of a model's attention kernels: per layer type, prefill and decode.
    config: a config.json path (or its directory), its dict, or a transformers config object;
    dtype overrides the config's (f16 for WGSL); name prefixes the kernels' names."""
    return specs_text(model_attention(config, dtype=dtype, name=name))


def specs_from_hf(config, dtype: str | None = None, name: str | None = None) -> list:
    """from_hf's specs, parsed: a list of AttentionSpec."""
    from ..api import parse
    return parse(from_hf(config, dtype=dtype, name=name), filename="<from-hf>")


def register(name: str = "attngen", target: str | None = None) -> str:
    """Register attngen with transformers' AttentionInterface (and its mask interface) as `name`
    (attngen.transformers.attention.register)."""
    from .attention import register as _register
    return _register(name, target)


__all__ = ["FAMILIES", "ConfigError", "LayerAttention", "ModelAttention", "from_hf", "model_attention", "register",
           "specs_from_hf"]
