"""The validated attention spec: frozen dataclasses, every default filled in.

An `AttentionSpec` is what the language means, independent of any target: it is produced
by the frontend (attngen.frontend), printed back by `format_spec`, checked against a target
profile by attngen.check and lowered to a KernelPlan by attngen.plan. Source spans are kept
in `spans` (key -> Span), which takes no part in equality or hashing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import math

DTYPES = ("f16", "bf16", "f32")
ACC_DTYPES = ("f32", "f16")
MASK_KINDS = ("none", "causal", "window", "custom")
SCHEDULES = ("fused", "split_kv", "two_pass")
KV_CACHES = ("contiguous", "paged")
TARGETS = ("cuda", "wgsl")
SUBGROUP_MODES = ("auto", "on", "off")

DTYPE_BYTES = {"f16": 2, "bf16": 2, "f32": 4}
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@dataclass(frozen=True)
class Mask:
    """Which keys a query sees.

    kind "causal": query i sees key j iff j <= i (top-left aligned, torch's is_causal), or
    iff j <= i + (Lk - Lq) when bottom_right. kind "window": bottom-right aligned sliding
    window, i + (Lk - Lq) - left <= j <= i + (Lk - Lq) + right. kind "custom": a mask
    tensor given at run time.
    """

    kind: str = "none"
    bottom_right: bool = False
    left: int | None = None
    right: int | None = None


@dataclass(frozen=True)
class Schedule:
    kind: str = "fused"
    splits: int | None = None  # split_kv(N); None = auto


@dataclass(frozen=True)
class KVCache:
    kind: str = "contiguous"
    page: int | None = None  # paged(page=N)


@dataclass(frozen=True)
class Tile:
    """Rows of Q and of K/V per block, and the head-dim chunk; None = the profile's default."""

    q: int | None = None
    kv: int | None = None
    d: int | None = None


@dataclass(frozen=True)
class CudaOptions:
    warps: int | None = None
    stages: int | None = None


@dataclass(frozen=True)
class WgslOptions:
    workgroup: int | None = None
    subgroups: str = "auto"


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
    cuda: CudaOptions = CudaOptions()
    wgsl: WgslOptions = WgslOptions()
    spans: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

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


def format_number(x) -> str:
    """Shortest text that reads back to the same value (ints stay ints)."""
    if isinstance(x, int):
        return str(x)
    return repr(float(x))


def _auto(x) -> str:
    return "auto" if x is None else format_number(x)


def format_spec(spec: AttentionSpec) -> str:
    """Print a spec in the language, every default filled in; parse(format_spec(s)) == [s]."""
    s = spec
    if s.head_dim_qk == s.head_dim_v:
        head_dim = str(s.head_dim_qk)
    else:
        head_dim = f"qk={s.head_dim_qk} v={s.head_dim_v}"
    heads = "any" if s.heads_q is None else f"q={s.heads_q} kv={s.heads_kv}"
    m = s.mask
    if m.kind == "causal":
        mask = "causal(bottom_right)" if m.bottom_right else "causal"
    elif m.kind == "window":
        mask = f"window(left={m.left}, right={m.right})"
    else:
        mask = m.kind
    if s.schedule.kind == "split_kv":
        schedule = f"split_kv({_auto(s.schedule.splits)})"
    else:
        schedule = s.schedule.kind
    kv_cache = f"paged(page={s.kv_cache.page})" if s.kv_cache.kind == "paged" else s.kv_cache.kind
    rows = [
        ("head_dim", head_dim),
        ("heads", heads),
        ("dtype", s.dtype),
        ("accumulate", f"qk={s.acc_qk} pv={s.acc_pv}"),
        ("mask", mask),
        ("softcap", "none" if s.softcap is None else format_number(s.softcap)),
        ("scale", _auto(s.scale)),
        ("tile", f"q={_auto(s.tile.q)} kv={_auto(s.tile.kv)} d={_auto(s.tile.d)}"),
        ("schedule", schedule),
        ("kv_cache", kv_cache),
        ("target", f"cuda {{ warps={_auto(s.cuda.warps)} stages={_auto(s.cuda.stages)} }}"),
        ("target", f"wgsl {{ workgroup={_auto(s.wgsl.workgroup)} subgroups={s.wgsl.subgroups} }}"),
    ]
    body = "\n".join(f"    {k:<10} {v}".rstrip() for k, v in rows)
    return f"attention {s.name} {{\n{body}\n}}\n"
