"""A Hugging Face model config -> the attention its layers compute -> .attn specs.

Reads a config.json (a path or its dict) or a transformers config object, without importing
transformers: the rules by which each family's config becomes its layers' attention are written
out here, the same rules transformers' modeling code applies (docs/transformers.md lists them):

    heads        num_attention_heads; num_key_value_heads (default: the same)
    head dims    head_dim, else hidden_size // num_attention_heads; DeepSeek's multi-head latent
                 attention: qk = qk_nope_head_dim + qk_rope_head_dim, v = v_head_dim, with every
                 query head's own key/value head (transformers expands the latent cache per layer)
    dtype        dtype / torch_dtype (bfloat16 -> bf16, float16 -> f16, float32 -> f32)
    mask         causal, bottom-right aligned (a query is the last of the keys it sees: prefill
                 and decode against a cache alike); sliding layers: window(left = sliding_window
                 - 1), transformers' `kv_idx > q_idx - sliding_window`
    layer types  layer_types when the config has it; else Gemma-2 alternates sliding / full
                 (layer 0 sliding), Gemma-3 is sliding except every sliding_window_pattern-th
                 layer (6), Qwen2 slides from max_window_layers on when use_sliding_window, and
                 Mistral / Phi-3 slide on every layer when sliding_window is set
    softcap      attn_logit_softcapping (Gemma-2)
    scale        query_pre_attn_scalar ** -0.5 (Gemma-2 / Gemma-3); DeepSeek: qk ** -0.5 times
                 YaRN's mscale(factor, mscale_all_dim) squared; else auto (1 / sqrt(head dim qk))

Each layer type gets a prefill kernel (schedule fused) and a decode kernel (split_kv(auto)): the
same function, one for many queries, one for a few against a long cache.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import dataclass

from ..errors import ConfigError, clip

# The families whose rules are written here (and tested against their published configs).
FAMILIES = ("llama", "mistral", "qwen2", "phi3", "gemma2", "gemma3_text", "deepseek_v2", "deepseek_v3")
# Multimodal configs whose attention is that of their text model.
_TEXT_OF = {"gemma3": "gemma3_text"}
_DTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32", "bf16": "bf16", "f16": "f16", "fp16": "f16",
           "fp32": "f32", "f32": "f32", "half": "f16", "float": "f32"}
# Layer types of transformers' configs that attngen computes, and those it does not.
_LAYER_TYPES = ("full_attention", "sliding_attention")
# A config.json is a few KB (published ones: under 100 KB); reading stops past this.
MAX_CONFIG_BYTES = 16 * 2**20
# More layers than any model has (building a tuple of 10**7 layers took minutes).
MAX_LAYERS = 2**16
# The longest name prefix: a kernel name is at most 64 characters, and "_global_prefill" follows it.
MAX_NAME = 64 - len("_global_prefill")


@dataclass(frozen=True)
class LayerAttention:
    """What one type of layer computes: everything a spec needs except the phase."""

    heads_q: int
    heads_kv: int
    head_dim_qk: int
    head_dim_v: int
    dtype: str
    window: int | None  # keys a query sees including itself (sliding_window); None = causal over all
    softcap: float | None
    scale: float | None  # None = auto (1 / sqrt(head_dim_qk))
    causal: bool = True


@dataclass(frozen=True)
class ModelAttention:
    """A model's attention: its name, family, and per layer the type of attention it computes."""

    name: str
    model_type: str
    known: bool  # one of FAMILIES
    layers: tuple  # LayerAttention per layer

    def types(self) -> dict:
        """{layer type name: (LayerAttention, [layer indices])}, in order of first use."""
        out: dict = {}
        for i, la in enumerate(self.layers):
            key = type_name(la)
            out.setdefault(key, (la, []))[1].append(i)
        return out


def type_name(la: LayerAttention) -> str:
    return "global" if la.window is None else "local"


def read_config(config) -> dict:
    """The config as a dict: a path to config.json (or its directory), a dict, or a transformers
    config object (its to_dict(), with the attributes its __init__ computed)."""
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        try:
            raw = _read_bounded(path)
            data = json.loads(raw.decode("utf-8"))
        except ConfigError:
            raise
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such file (give a model's config.json or its directory)") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: cannot read it ({e.__class__.__name__}: {e})") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}:{e.lineno}:{e.colno}: not JSON: {e.msg}") from None
        except RecursionError:
            raise ConfigError(f"{path}: not a config: JSON nested too deeply to read") from None
        except ValueError as e:  # an integer of more than 4300 digits
            raise ConfigError(f"{path}: not a config: {clip(str(e))}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: a config.json holds one JSON object, not a {type(data).__name__}")
        return data
    if isinstance(config, dict):
        return dict(config)
    if hasattr(config, "to_dict"):
        data = dict(config.to_dict())
        for attr in ("layer_types", "model_type", "name_or_path"):
            if getattr(config, attr, None) is not None:
                data[attr] = getattr(config, attr)
        text = getattr(config, "text_config", None)
        if text is not None and hasattr(text, "to_dict"):
            data["text_config"] = read_config(text)
        return data
    raise ConfigError(f"a config is a config.json path, a dict or a transformers config object, not "
                      f"{type(config).__name__}")


def _read_bounded(path: str) -> bytes:
    """The bytes of a regular file, at most MAX_CONFIG_BYTES (a FIFO, a device or a socket is
    refused without waiting on it: opened non-blocking, checked on the open file)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ConfigError(f"{path}: not a regular file (give a model's config.json or its directory)")
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: longer than {MAX_CONFIG_BYTES >> 20} MiB: not a model's config.json")
    return data


def _field(cfg: dict, key: str, kind, model_type: str, default=None, required: bool = False):
    value = cfg.get(key, default)
    if value is None:
        if required:
            raise ConfigError(f"the config (model_type {clip(model_type)!r}) has no {key!r}, which attngen needs to "
                              f"build its attention")
        return None
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ConfigError(f"the config's {key!r} is {clip(repr(value))}: an integer is needed")
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"the config's {key!r} is {clip(repr(value))}: a finite number is needed")
        value = float(value)
    if kind is int and value <= 0:
        raise ConfigError(f"the config's {key!r} is {value}: it must be positive")
    return value


def _dtype(cfg: dict, override: str | None) -> str:
    if override is not None:
        if override not in ("f16", "bf16", "f32"):
            raise ConfigError(f"dtype {override!r}: expected f16, bf16 or f32")
        return override
    raw = cfg.get("dtype") if cfg.get("dtype") is not None else cfg.get("torch_dtype")
    if raw is None:
        return "f32"  # what transformers loads a config without a dtype as
    name = str(raw).replace("torch.", "")
    if name not in _DTYPES:
        raise ConfigError(f"the config's dtype {clip(repr(raw))} is not one attngen computes in (bfloat16, float16, float32)")
    return _DTYPES[name]


def _rope(cfg: dict) -> dict:
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    return rope if isinstance(rope, dict) else {}


def _scale(cfg: dict, model_type: str, head_dim_qk: int) -> float | None:
    if model_type in ("gemma2", "gemma3_text") or cfg.get("query_pre_attn_scalar") is not None:
        q = _field(cfg, "query_pre_attn_scalar", float, model_type, required=True)
        if q <= 0:
            raise ConfigError(f"the config's 'query_pre_attn_scalar' is {q}: it must be positive")
        return q ** -0.5
    if model_type in ("deepseek_v2", "deepseek_v3"):
        scale = head_dim_qk ** -0.5
        rope = _rope(cfg)
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind != "default" and rope.get("mscale_all_dim"):
            factor = _field(rope, "factor", float, model_type, required=True)
            mscale_all_dim = _field(rope, "mscale_all_dim", float, model_type)
            mscale = 1.0 if factor <= 1 else 0.1 * mscale_all_dim * math.log(factor) + 1.0
            scale = scale * mscale * mscale
        return scale
    return None


def _layer_types(cfg: dict, model_type: str, n_layers: int, window: int | None) -> list:
    given = cfg.get("layer_types")
    if given is not None:
        if not isinstance(given, list) or len(given) != n_layers:
            raise ConfigError(f"the config's 'layer_types' must list one type per layer ({n_layers}), "
                              f"got {str(given)[:80]}")
        bad = list(dict.fromkeys(clip(repr(t)) for t in given if not isinstance(t, str) or t not in _LAYER_TYPES))
        if bad:
            raise ConfigError(f"the config's 'layer_types' has {', '.join(bad[:4])}: attngen builds "
                              f"{' and '.join(_LAYER_TYPES)} layers only")
        return list(given)
    if model_type == "gemma2":
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n_layers)]
    if model_type == "gemma3_text":
        pattern = _field(cfg, "sliding_window_pattern", int, model_type, default=6)
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layers)]
    if model_type == "qwen2":
        start = _field(cfg, "max_window_layers", int, model_type, default=28) if window is not None else n_layers
        return ["sliding_attention" if i >= start else "full_attention" for i in range(n_layers)]
    kind = "sliding_attention" if window is not None else "full_attention"
    return [kind] * n_layers


def model_attention(config, dtype: str | None = None, name: str | None = None) -> ModelAttention:
    """The attention of every layer of the model a config describes (ConfigError when the config
    lacks a field attngen needs, or asks for attention attngen does not compute)."""
    if name is not None and not (isinstance(name, str) and name.isascii() and name.isidentifier()
                                 and len(name) <= MAX_NAME):
        raise ConfigError(f"name {clip(repr(name))}: a kernel name prefix is ASCII letters, digits and '_', not "
                          f"starting with a digit, at most {MAX_NAME} characters")
    cfg = read_config(config)
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ConfigError("the config has no 'model_type': attngen needs it to know the family's rules "
                          f"({', '.join(FAMILIES)})")
    if model_type in _TEXT_OF:
        text = cfg.get("text_config") or {}
        if not isinstance(text, dict):
            raise ConfigError(f"the config's 'text_config' is {clip(repr(text))}: an object of the text model's "
                              "fields is needed")
        cfg = {**text, "model_type": _TEXT_OF[model_type],
               "dtype": (text.get("dtype") or text.get("torch_dtype") or cfg.get("dtype") or cfg.get("torch_dtype")),
               "_name_or_path": cfg.get("_name_or_path", cfg.get("name_or_path"))}
        model_type = cfg["model_type"]
    for key in ("attention_chunk_size", "use_sinks"):
        if cfg.get(key):
            raise ConfigError(f"the config sets {key!r} ({clip(repr(cfg[key]))}): attngen does not build that attention")
    for key in ("use_bidirectional_attention", "use_sliding_window"):
        if not isinstance(cfg.get(key, False), (bool, type(None))):
            raise ConfigError(f"the config's {key!r} is {clip(repr(cfg[key]))}: true or false is needed")
    if cfg.get("use_bidirectional_attention"):
        raise ConfigError("the config sets 'use_bidirectional_attention': attngen builds the causal attention of "
                          "decoders here")
    heads_q = _field(cfg, "num_attention_heads", int, model_type, required=True)
    heads_kv = _field(cfg, "num_key_value_heads", int, model_type, default=heads_q)
    n_layers = _field(cfg, "num_hidden_layers", int, model_type, required=True)
    if n_layers > MAX_LAYERS:
        raise ConfigError(f"the config's 'num_hidden_layers' is {clip(str(n_layers))}: more than {MAX_LAYERS}, "
                          "which no model has")
    if model_type in ("deepseek_v2", "deepseek_v3"):
        nope = _field(cfg, "qk_nope_head_dim", int, model_type, required=True)
        rope = _field(cfg, "qk_rope_head_dim", int, model_type, required=True)
        d_qk, d_v = nope + rope, _field(cfg, "v_head_dim", int, model_type, required=True)
        heads_kv = heads_q  # the latent is expanded to one key / value head per query head
    else:
        d = _field(cfg, "head_dim", int, model_type)
        if d is None:
            hidden = _field(cfg, "hidden_size", int, model_type, required=True)
            if hidden % heads_q:
                raise ConfigError(f"the config has no 'head_dim', and hidden_size {hidden} is not a multiple of "
                                  f"num_attention_heads {heads_q}")
            d = hidden // heads_q
        d_qk = d_v = d
    if heads_q % heads_kv:
        raise ConfigError(f"num_attention_heads {heads_q} is not a multiple of num_key_value_heads {heads_kv}")
    window = _field(cfg, "sliding_window", int, model_type)
    if model_type == "qwen2" and not cfg.get("use_sliding_window", False):
        window = None
    types = _layer_types(cfg, model_type, n_layers, window)
    if window is None and "sliding_attention" in types:
        raise ConfigError("the config has sliding_attention layers but no 'sliding_window'")
    softcap = _field(cfg, "attn_logit_softcapping", float, model_type)
    if softcap is not None and softcap <= 0:
        raise ConfigError(f"the config's 'attn_logit_softcapping' is {softcap}: it must be positive")
    scale = _scale(cfg, model_type, d_qk)
    dt = _dtype(cfg, dtype)
    layers = tuple(LayerAttention(heads_q, heads_kv, d_qk, d_v, dt, window if t == "sliding_attention" else None,
                                  softcap, scale) for t in types)
    return ModelAttention(_model_name(cfg, model_type) if name is None else name, model_type, model_type in FAMILIES, layers)


def _model_name(cfg: dict, model_type: str) -> str:
    raw = cfg.get("_name_or_path") or cfg.get("name_or_path") or model_type
    base = os.path.basename(str(raw).rstrip("/")) or model_type
    name = re.sub(r"\W+", "_", base.lower(), flags=re.ASCII).strip("_") or re.sub(
        r"\W+", "_", model_type.lower(), flags=re.ASCII).strip("_") or "model"
    name = name if not name[0].isdigit() else f"m_{name}"
    return name[:MAX_NAME].rstrip("_")


def auto_scale(scale: float | None, head_dim_qk: int) -> float | None:
    """None (auto) where the scale is 1 / sqrt(head_dim_qk), the number otherwise."""
    if scale is None or math.isclose(scale, head_dim_qk ** -0.5, rel_tol=1e-12):
        return None
    return float(scale)


def spec_text(name: str, la: LayerAttention, phase: str, custom_mask: bool = False) -> str:
    """One `attention` block of a layer type's kernel: phase "prefill" (fused) or "decode"
    (split_kv(auto)); custom_mask: the mask is a run-time tensor (padding, static caches)."""
    dims = str(la.head_dim_qk) if la.head_dim_qk == la.head_dim_v else f"qk={la.head_dim_qk} v={la.head_dim_v}"
    if custom_mask:
        mask = "custom"
    elif not la.causal:
        mask = "none"
    elif la.window is None:
        mask = "causal(bottom_right)"
    else:
        mask = f"window(left={la.window - 1})"
    lines = [f"attention {name} {{", f"    head_dim   {dims}", f"    heads      q={la.heads_q} kv={la.heads_kv}",
             f"    dtype      {la.dtype}", f"    mask       {mask}"]
    if la.softcap is not None:
        lines.append(f"    softcap    {la.softcap!r}")
    scale = auto_scale(la.scale, la.head_dim_qk)
    if scale is not None:
        lines.append(f"    scale      {scale!r}")
    if phase == "decode":
        lines.append("    schedule   split_kv(auto)")
    lines.append("}")
    return "\n".join(lines) + "\n"


def specs_text(model: ModelAttention) -> str:
    """The .attn file of a model: per layer type a prefill and a decode kernel, with comments that
    say where each number came from."""
    types = model.types()
    kind = model.model_type if re.fullmatch(r"[\w.-]{1,64}", model.model_type, flags=re.ASCII) \
        else clip(repr(model.model_type))
    out = [f"# {model.name}: the attention of a {kind} model, written by "
           "`attngen spec --from-hf` from its config."]
    if not model.known:
        out.append(f"# model_type {clip(model.model_type)!r} is not one of the families attngen's rules were checked "
                   f"against ({', '.join(FAMILIES)}): it was read by the fields they share; check it.")
    first = next(iter(types.values()))[0]
    out.append(f"# {len(model.layers)} layers; heads q={first.heads_q} kv={first.heads_kv}; head dims "
               f"qk={first.head_dim_qk} v={first.head_dim_v}; {first.dtype}"
               + (f"; softcap {first.softcap!r}" if first.softcap is not None else "")
               + (f"; scale {first.scale!r}" if auto_scale(first.scale, first.head_dim_qk) is not None else "")
               + ".")
    for key, (la, idx) in types.items():
        what = "causal over every key" if la.window is None else \
            f"a sliding window of {la.window} keys (sliding_window {la.window}: left={la.window - 1})"
        out.append(f"# {key} layers ({len(idx)}: {_ranges(idx)}): {what}.")
    for key, (la, _) in types.items():
        for phase in ("prefill", "decode"):
            out.append("")
            out.append(spec_text(f"{model.name}_{key}_{phase}", la, phase).rstrip("\n"))
    return "\n".join(out) + "\n"


def _ranges(idx: list) -> str:
    parts, start = [], idx[0]
    for a, b in zip(idx, idx[1:] + [None]):
        if b != a + 1:
            parts.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ", ".join(parts) if len(parts) <= 6 else ", ".join(parts[:6]) + ", ..."
