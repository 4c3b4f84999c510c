"""The KernelPlan: everything an emitter needs to print a kernel, and a runtime to launch it.

A KernelPlan is made by the lowering driver (attngen.plan.lower) from a checked spec, a target
profile and the target's backend. Its fields are target-neutral; what only one target needs
lives in `config` (the backend's tile configuration) and `details` (the backend's own lowering
record). Emitters turn a plan into source text plus a manifest (an `Emitted`); they add no
decisions of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..lang.spec import DTYPE_BYTES, KV_DTYPES, AttentionSpec, Mask
from .formulas import evaluate_all

# The kernels keep scores in the log2 domain (exp2 does the softmax) and report lse in natural
# log: these are the factors, printed into every kernel from here.
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
# With accumulate qk=f16 the scores are f16 sums; their rounding stays within the f16-accumulator
# tolerance (1e-2) while a row's largest score |t| (log2 domain) is at most this. Rows beyond it
# come out NaN rather than wrong (docs/language.md, Numerics).
F16_SCORE_BOUND = 16.0


def element_bytes(dtype: str) -> int:
    """Bytes of one element of a buffer or workspace: the dtype's (DTYPE_BYTES), one for a quantized
    cache's stored values (KV_DTYPES), 4 for the 32-bit words (u32 flags and counters) it leaves out."""
    return 1 if dtype in KV_DTYPES else DTYPE_BYTES.get(dtype, 4)


class Problem(Exception):
    """A configuration that cannot work on a target; `key` names the spec key to point at.

    Raised by a backend's configure() and returned by its check(); the checker turns it into a
    Diagnostic at the key's position, prefixed with the target and profile."""

    def __init__(self, message, key="tile", hint=None):
        super().__init__(message)
        self.message, self.key, self.hint = message, key, hint


@dataclass(frozen=True)
class Param:
    """One kernel parameter (positional targets, in order) or binding (by number)."""

    name: str
    kind: str  # "tensor" (a pointer / storage buffer), "scalar", or "uniform" (a struct of scalars)
    dtype: str  # f16 bf16 f32 i32 i64 u32 u8, or "struct" for the uniform
    shape: tuple | None = None  # symbolic: ("B", "Lq", "Hq", "Dqk")
    access: str = "read"  # read | write | readwrite
    optional: bool = False  # may be absent (null pointer / a small dummy buffer)
    binding: int | None = None  # binding number, for targets that bind by number
    doc: str = ""


@dataclass(frozen=True)
class Entry:
    """A further entry point of the same source, launched after the main one (in order), or
    before it (`before`): the split_kv / two_pass combine, two_pass's second pass, FP8's
    preparation of V. Same fields as the main kernel's."""

    name: str  # role: "combine", "pv", ...
    entry: str  # function / entry-point name
    doc: str
    params: tuple  # Param, in launch order / by binding
    grid: tuple  # three formulas (attngen.plan.formulas)
    threads: int
    smem_bytes: int = 0
    before: bool = False  # launched before the main entry point (the entries before it in order)


@dataclass(frozen=True)
class Workspace:
    """A scratch buffer the launcher allocates for one call (the split schedules' partial
    results): its dtype, its shape as formulas of the run-time sizes, and what its words must
    hold before the launch (None: anything)."""

    name: str
    dtype: str
    shape: tuple  # formulas, e.g. ("S", "B * Hq * Lq", "Dv")
    fill: int | None = None  # a 32-bit word written to every word before the launch
    # Held by the runtime between calls (one per GPU and stream, grown as needed) instead of
    # allocated per call: `fill` is written once, and every launch leaves it so (the CUDA fused
    # combine's tile counters).
    persistent: bool = False

    @property
    def element_bytes(self) -> int:
        return element_bytes(self.dtype)

    def nbytes(self, sizes: dict) -> int:
        """The size in bytes for one launch: the shape's formulas evaluated with the run-time
        `sizes` (symbol -> int, e.g. Launch.sizes()) times the element size; the value of
        bytes_formula for the same sizes. Every runtime sizes its workspaces here."""
        n = self.element_bytes
        for dim in evaluate_all(self.shape, **sizes):
            n *= dim
        return n

    @property
    def bytes_formula(self) -> str:
        """The size in bytes as a formula (manifests): the element size times the numeric dims,
        then the symbolic ones ("4 * S * B * Hq * Lq * Dv"); nbytes evaluates the same."""
        factor, names = self.element_bytes, []
        for dim in self.shape:
            if str(dim).isdigit():
                factor *= int(dim)
            else:
                names.append(str(dim))
        return " * ".join([str(factor)] + names)


@dataclass(frozen=True)
class Buffer:
    """One array in on-chip memory (shared / workgroup memory)."""

    name: str
    dtype: str
    copies: int  # pipeline stages
    rows: int
    cols: int  # elements per row, padding included
    offset: int  # bytes from the start of the on-chip memory
    doc: str

    @property
    def bytes(self) -> int:
        return self.copies * self.rows * self.cols * element_bytes(self.dtype)


def place_buffers(entries) -> tuple[tuple[Buffer, ...], int]:
    """Place buffers (name, dtype, copies, rows, cols, doc) one after another, each 16-byte
    aligned; returns them and the total bytes."""
    out, offset = [], 0
    for name, dtype, copies, rows, cols, doc in entries:
        buf = Buffer(name, dtype, copies, rows, cols, offset, doc)
        out.append(buf)
        offset += -(-buf.bytes // 16) * 16
    return tuple(out), offset


def describe_buffers(buffers) -> str:
    parts = []
    for b in buffers:
        n = f"{b.copies}x" if b.copies > 1 else ""
        parts.append(f"{b.name} {n}{b.rows}x{b.cols} {b.dtype}")
    return " + ".join(parts)


@dataclass(frozen=True)
class KernelPlan:
    target: str  # the backend's name
    profile: str
    spec: AttentionSpec
    spec_text: str  # the normalised spec (format_spec)
    entry: str  # kernel / entry-point name
    config: object  # the backend's tile configuration: tile_q, tile_kv, buffers, smem_bytes, summary()
    dtype: str
    acc_qk: str
    acc_pv: str
    d_qk: int
    d_v: int
    scale: float
    softcap: float | None
    mask: Mask  # with window sizes clamped (attngen.plan.masks.clamp)
    threads: int  # per block / workgroup
    grid: tuple  # three formulas over B, Lq, Hq, ... (attngen.plan.formulas)
    params: tuple  # Param, in launch order / by binding
    features: tuple  # device features the source needs (empty when none)
    smem_bytes: int
    # With f16 accumulators for Q K^T, Q is multiplied by the scale as it is staged, so the
    # f16 sums are sqrt(head_dim) times smaller; the score transform then leaves out the scale.
    prescale_q: bool = False
    # Launched after the main kernel, in order (split_kv: the combine; two_pass: P V, combine), those
    # with `before` before it (FP8: the preparation of V).
    entries: tuple = ()
    workspaces: tuple = ()  # Workspace, allocated per call by the launcher
    details: object = None  # what only the target needs (the backend's own record)
    # split_kv(auto) / two_pass: blocks (workgroups) of the main kernel one core runs at once, by
    # the backend's reckoning (shared memory); 0: the schedule's default (attngen.plan.schedule).
    resident_blocks: int = 0
    # What the planner read differently from the spec's text (attngen.plan.check.planned_as: a
    # score expression that is a soft-cap, a mask expression that is a named mask), for `attngen check`;
    # not compared: plans that differ only there are the same kernels.
    notes: tuple = field(default=(), compare=False)

    @property
    def tile_q(self) -> int:
        return self.config.tile_q

    @property
    def out_dtype(self) -> str:
        """The output's dtype: the spec's `out=` of an FP8 dtype, else its dtype."""
        return self.spec.output_dtype

    @property
    def tile_kv(self) -> int:
        return self.config.tile_kv

    def summary(self) -> str:
        """One line a person reads in `attngen check` and in source headers."""
        return self.config.summary()


@dataclass(frozen=True)
class Emitted:
    """Generated source and the manifest a foreign runtime needs to launch it."""

    source: str
    manifest: dict
    plan: KernelPlan

    def __str__(self) -> str:
        return self.source


@dataclass(frozen=True)
class Lowered:
    """What a backend's lower() adds to the neutral fields of a KernelPlan."""

    threads: int
    grid: tuple
    params: tuple
    smem_bytes: int
    entries: tuple = ()
    features: tuple = ()
    workspaces: tuple = ()
    details: object = None
    resident_blocks: int = 0
