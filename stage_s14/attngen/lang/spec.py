"""The validated attention spec: frozen dataclasses, every default filled in.

An `AttentionSpec` is what the language means, independent of any target: it is produced
by the reader (attngen.lang.reader), printed back by `format_spec`, checked against a target
profile and lowered to a KernelPlan by attngen.plan. Source spans are kept in `spans`
(key -> Span), which takes no part in equality or hashing.

Target options (`target NAME { key=value }`) are kept generically in `targets`: the
backends define which targets and options exist (attngen.lang.options).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
import math

from .expr import (expr_from_data, expr_to_data, format_expr, format_input, format_number, input_from_data,
                   input_to_data)
from .options import target_schemas

DTYPES = ("f16", "bf16", "f32", "e4m3", "e5m2")
ACC_DTYPES = ("f32", "f16")
# FP8 prefill (issue 44): q, k and v stored in 8 bits, descaled at the call; the output (and lse)
# in `out=` (docs/language.md, "FP8 prefill")
FP8_DTYPES = ("e4m3", "e5m2")
OUT_DTYPES = ("bf16", "f16")  # the output dtypes of an FP8 kernel
DEFAULT_FP8_OUT = "bf16"  # FlashAttention-3's and cuDNN's: a wider range than f16

DTYPE_BYTES = {"f16": 2, "bf16": 2, "f32": 4, "e4m3": 1, "e5m2": 1}
# `kv_dtype`: K and V stored quantized, one byte per value (docs/language.md, "Quantized KV caches")
KV_DTYPES = ("e4m3", "e5m2", "i8")


@dataclass(frozen=True)
class Mask:
    """Which keys a query sees.

    kind "causal": query i sees key j iff j <= i (top-left aligned, torch's is_causal), or
    iff j <= i + (Lk - Lq) when bottom_right. kind "window": bottom-right aligned sliding
    window, i + (Lk - Lq) - left <= j <= i + (Lk - Lq) + right. kind "custom": a mask
    tensor given at run time. kind "expr": the boolean expression `expr` (attngen.lang.expr IR)
    says which keys a query sees.
    """

    kind: str = "none"
    bottom_right: bool = False
    left: int | None = None
    right: int | None = None
    expr: object = None  # kind "expr" only

    @property
    def is_custom(self) -> bool:
        """A mask tensor given at run time (with per-tile lists), not a rule of positions."""
        return self.kind == "custom"


@dataclass(frozen=True)
class Schedule:
    kind: str = "fused"
    splits: int | None = None  # split_kv(N); None = auto

    @property
    def is_split(self) -> bool:
        """split_kv and two_pass: key tiles over S blocks, then a combine."""
        return self.kind != "fused"

    @property
    def is_two_pass(self) -> bool:
        return self.kind == "two_pass"


@dataclass(frozen=True)
class KVCache:
    kind: str = "contiguous"
    page: int | None = None  # paged(page=N)

    @property
    def is_paged(self) -> bool:
        return self.kind == "paged"


@dataclass(frozen=True)
class Tile:
    """Rows of Q and of K/V per block, and the head-dim chunk; None = the profile's default."""

    q: int | None = None
    kv: int | None = None
    d: int | None = None


def normalise_targets(targets) -> tuple:
    """Target options as stored: ((target, ((option, value), ...)), ...), sorted by name, with
    `auto` (None) values and empty targets left out. Takes that form or a mapping of mappings,
    e.g. {"cuda": {"warps": 4}}."""
    items = targets.items() if isinstance(targets, Mapping) else targets
    out = []
    for name, options in items:
        pairs = options.items() if isinstance(options, Mapping) else options
        kept = tuple(sorted((str(k), v) for k, v in pairs if v is not None))
        if kept:
            out.append((str(name), kept))
    return tuple(sorted(out))


@dataclass(frozen=True)
class AttentionSpec:
    name: str
    head_dim_qk: int
    head_dim_v: int
    dtype: str
    heads_q: int | None = None
    heads_kv: int | None = None
    acc_qk: str = "f32"
    acc_pv: str = "f32"
    mask: Mask = Mask()
    softcap: float | None = None
    scale: float | None = None  # None = auto = 1/sqrt(head_dim_qk)
    tile: Tile = Tile()
    schedule: Schedule = Schedule()
    kv_cache: KVCache = KVCache()
    targets: tuple = ()  # target options given (not auto): see normalise_targets
    inputs: tuple = ()  # attngen.lang.expr.Input, in the order declared
    score: object = None  # the score expression (attngen.lang.expr IR), or None: the scaled score s
    kv_dtype: str | None = None  # K and V stored quantized (KV_DTYPES), or None: in `dtype`
    # The output's dtype (OUT_DTYPES) of an FP8 dtype; None for the others (the output in `dtype`)
    out_dtype: str | None = None
    spans: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "targets", normalise_targets(self.targets))
        if self.dtype in FP8_DTYPES and self.out_dtype is None:  # (the language's default, as the reader fills it)
            object.__setattr__(self, "out_dtype", DEFAULT_FP8_OUT)

    @property
    def is_fp8(self) -> bool:
        """q, k and v in an FP8 dtype (FP8 prefill)."""
        return self.dtype in FP8_DTYPES

    @property
    def output_dtype(self) -> str:
        """The dtype of the output: `out=` of an FP8 dtype, else `dtype`."""
        return self.out_dtype or self.dtype

    def options(self, target: str) -> dict:
        """The options given for `target` (those left at auto are absent)."""
        return dict(dict(self.targets).get(target, ()))

    @property
    def group_size(self) -> int | None:
        """Query heads per KV head (GQA group), when the heads are fixed by the spec."""
        if self.heads_q is None or self.heads_kv is None:
            return None
        return self.heads_q // self.heads_kv

    @property
    def resolved_scale(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.head_dim_qk)

    def span(self, key: str):
        """Where `key` was written (falls back to the kernel's name)."""
        return self.spans.get(key) or self.spans.get("name")


def typed_key(value):
    """`value` with the type of every part: equal only where the values are equal and of the same
    types. Specs compare as their values (32 == 32.0, 1 == True, 3 == numpy.int64(3)): a memo of
    validated specs is keyed by this instead, so a spec of other types is validated itself.
    (Spans take no part, as in equality.)"""
    if is_dataclass(value) and not isinstance(value, type):
        return (type(value), tuple(typed_key(getattr(value, f.name)) for f in fields(value) if f.compare))
    if type(value) is tuple:
        return (tuple, tuple(typed_key(x) for x in value))
    return (type(value), value)


def _auto(x) -> str:
    if x is None:
        return "auto"
    return x if isinstance(x, str) else format_number(x)


def format_mask(m: Mask) -> str:
    """A mask as the language writes it after `mask` (causal(bottom_right), window(left=N, right=M), ...)."""
    if m.kind == "causal":
        return "causal(bottom_right)" if m.bottom_right else "causal"
    if m.kind == "window":
        return f"window(left={m.left}, right={m.right})"
    if m.kind == "expr":
        return format_expr(m.expr)
    return m.kind


def format_spec(spec: AttentionSpec) -> str:
    """Print a spec in the language, every default filled in; parse(format_spec(s)) == [s]."""
    s = spec
    if s.head_dim_qk == s.head_dim_v:
        head_dim = str(s.head_dim_qk)
    else:
        head_dim = f"qk={s.head_dim_qk} v={s.head_dim_v}"
    heads = "any" if s.heads_q is None else f"q={s.heads_q} kv={s.heads_kv}"
    mask = format_mask(s.mask)
    if s.schedule.kind == "split_kv":
        schedule = f"split_kv({_auto(s.schedule.splits)})"
    else:
        schedule = s.schedule.kind
    kv_cache = f"paged(page={s.kv_cache.page})" if s.kv_cache.kind == "paged" else s.kv_cache.kind
    rows = [
        ("head_dim", head_dim),
        ("heads", heads),
        ("dtype", f"{s.dtype} out={s.out_dtype}" if s.out_dtype is not None else s.dtype),
        ("accumulate", f"qk={s.acc_qk} pv={s.acc_pv}"),
        *(("input", format_input(i)) for i in s.inputs),
        ("mask", mask),
        *((("score", format_expr(s.score)),) if s.score is not None else ()),
        ("softcap", "none" if s.softcap is None else format_number(s.softcap)),
        ("scale", _auto(s.scale)),
        ("tile", f"q={_auto(s.tile.q)} kv={_auto(s.tile.kv)} d={_auto(s.tile.d)}"),
        ("schedule", schedule),
        ("kv_cache", kv_cache),
        *((("kv_dtype", s.kv_dtype),) if s.kv_dtype is not None else ()),
    ]
    # Every registered target's options, auto where the spec leaves them (those not printed at auto
    # left out: Option.printed_at_auto), in the schema's order.
    for schema in target_schemas():
        given = s.options(schema.name)
        if schema.options:
            opts = " ".join(f"{o.name}={_auto(given.get(o.name))}" for o in schema.options
                            if o.printed_at_auto or given.get(o.name) is not None)
            rows.append(("target", f"{schema.name} {{ {opts} }}"))
    body = "\n".join(f"    {k:<10} {v}".rstrip() for k, v in rows)
    return f"attention {s.name} {{\n{body}\n}}\n"


# ---- specs as JSON data (api.parse's disk cache) -----------------------------------------------

# The fields of each dataclass a stored spec holds, with the JSON types each may take: the cache
# of parsed text keeps data, never code (a pickle would run whatever its writer put in it).
_NUM = (int, float)
_FIELDS = {
    Mask: {"kind": str, "bottom_right": bool, "left": (int, type(None)), "right": (int, type(None)),
           "expr": (list, type(None))},
    Schedule: {"kind": str, "splits": (int, type(None))},
    KVCache: {"kind": str, "page": (int, type(None))},
    Tile: {"q": (int, type(None)), "kv": (int, type(None)), "d": (int, type(None))},
}
_SPEC_FIELDS = {"name": str, "head_dim_qk": int, "head_dim_v": int, "dtype": str, "heads_q": (int, type(None)),
                "heads_kv": (int, type(None)), "acc_qk": str, "acc_pv": str, "softcap": _NUM + (type(None),),
                "scale": _NUM + (type(None),), "kv_dtype": (str, type(None)), "out_dtype": (str, type(None))}
_PARTS = {"mask": Mask, "tile": Tile, "schedule": Schedule, "kv_cache": KVCache}


def specs_to_data(specs, source) -> list | None:
    """`specs` (parsed from `source`, an errors.Source) as JSON-able data, spans as [line,
    column, end_line, end_column]; None when a span points into another source (not storable
    as positions in this one)."""
    out = []
    for s in specs:
        d = {k: getattr(s, k) for k in _SPEC_FIELDS}
        d.update({k: {f: getattr(getattr(s, k), f) for f in _FIELDS[cls]} for k, cls in _PARTS.items()})
        if s.mask.expr is not None:
            d["mask"]["expr"] = expr_to_data(s.mask.expr)
        d["inputs"] = [input_to_data(i) for i in s.inputs]
        d["score"] = None if s.score is None else expr_to_data(s.score)
        d["targets"] = [[name, [list(kv) for kv in options]] for name, options in s.targets]
        spans = {}
        for key, span in s.spans.items():
            if span.source is not source:
                return None
            spans[key] = [span.line, span.column, span.end_line, span.end_column]
        d["spans"] = spans
        out.append(d)
    return out


def _typed(d, fields: dict, what: str) -> dict:
    if not isinstance(d, dict) or set(d) != set(fields):
        raise ValueError(f"stored {what}: fields {sorted(d) if isinstance(d, dict) else type(d).__name__}")
    for k, kinds in fields.items():
        if not isinstance(d[k], kinds) or (isinstance(d[k], bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,))):
            raise ValueError(f"stored {what}.{k}: {d[k]!r}")
    return d


def specs_from_data(data, source) -> list:
    """The specs specs_to_data stored, their spans pointing into `source`; ValueError for data
    of any other form (an entry of another attngen, or not written by attngen)."""
    from ..errors import Span
    if not isinstance(data, list):
        raise ValueError("stored specs: not a list")
    specs = []
    for d in data:
        _typed(d, {**{k: object for k in _SPEC_FIELDS}, **{k: object for k in _PARTS}, "targets": list,
                   "inputs": list, "score": (list, type(None)), "spans": dict}, "spec")
        _typed({k: d[k] for k in _SPEC_FIELDS}, _SPEC_FIELDS, "spec")
        parts = {k: cls(**_typed(d[k], _FIELDS[cls], k)) for k, cls in _PARTS.items()}
        if parts["mask"].expr is not None:
            parts["mask"] = Mask(**{**d["mask"], "expr": expr_from_data(d["mask"]["expr"])})
        inputs = tuple(input_from_data(i) for i in d["inputs"])
        score = None if d["score"] is None else expr_from_data(d["score"])
        targets = []
        for item in d["targets"]:
            name, options = item
            if not isinstance(name, str) or not all(isinstance(k, str) and isinstance(v, (str, int, float, bool))
                                                    for k, v in options):
                raise ValueError(f"stored target options: {item!r}")
            targets.append((name, tuple((k, v) for k, v in options)))
        spans = {}
        for key, pos in d["spans"].items():
            if not (isinstance(pos, list) and len(pos) == 4 and all(type(x) is int for x in pos)):
                raise ValueError(f"stored span {key}: {pos!r}")
            spans[key] = Span(source, *pos)
        specs.append(AttentionSpec(**{k: d[k] for k in _SPEC_FIELDS}, **parts, targets=tuple(targets), inputs=inputs,
                                   score=score, spans=spans))
    return specs
