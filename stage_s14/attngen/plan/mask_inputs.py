"""Masks over inputs (issue 42): the plan of a spec whose mask expression reads an input.

Interval analysis (expr_blocks.py) cannot classify such a mask (a load is unknown: every tile
it may touch is PARTIAL), so a target that has a block-mask builder lowers it in two parts:

- the *builder*: a generated kernel that evaluates the mask expression, with its inputs, on
  every (row, key) of each (batch, head) slice the expression depends on (`slices`) and writes
  the mask as bytes into a BlockMask buffer (attngen/runtime/blockmask.py), whose tile lists
  are then made as for `mask custom`;
- the *attention kernel*: the spec with `mask custom` in place of the expression (`custom_spec`),
  which visits only the live tiles and reads the bytes in the partial ones. The inputs only the
  mask reads leave the attention kernel; those the score reads stay.

A target runs the builder once per call signature (the lengths, kv_lens and the inputs the mask
reads) and keeps the BlockMask for the next call (docs/variants.md, "Masks over inputs").
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from ..lang.expr import Load, Var, inputs_read, walk
from ..lang.spec import AttentionSpec, Mask


def reads_inputs(spec: AttentionSpec) -> bool:
    """Whether `spec`'s mask is an expression that reads an input."""
    return spec.mask.kind == "expr" and bool(inputs_read(spec.mask.expr))


def mask_inputs(spec: AttentionSpec) -> list:
    """The declarations (attngen.lang.expr.Input) the mask expression reads, in declaration order."""
    names = inputs_read(spec.mask.expr) if spec.mask.kind == "expr" else set()
    return [i for i in spec.inputs if i.name in names]


def custom_spec(spec: AttentionSpec) -> AttentionSpec:
    """The attention kernel's spec: `mask custom` for the expression, and only the inputs the
    score reads."""
    keep = inputs_read(spec.score)
    return dataclasses.replace(spec, mask=Mask("custom"), inputs=tuple(i for i in spec.inputs if i.name in keep))


def slices(spec: AttentionSpec, batch: int, heads_q: int, per_sequence_lk: bool) -> tuple[int, int]:
    """(Bm, Hm) of the BlockMask the builder writes: the batch when the expression names `b` (in
    an index of an input, too) or the keys differ per sequence (kv_lens: `Lk` is each one's),
    else 1; the query heads when it names `h` or `hkv`, else 1."""
    names = {n.name for n in walk(spec.mask.expr) if isinstance(n, Var)}
    by_batch = "b" in names or per_sequence_lk
    return (batch if by_batch else 1), (heads_q if names & {"h", "hkv"} else 1)


def signature(launch, arrays: dict, spec: AttentionSpec, identity=None) -> tuple:
    """What a built BlockMask depends on, for a cache: the call's extents (b, h, hkv, q, k), the
    keys of each sequence (kv_lens, with the rows appended) and, for each input the mask reads,
    its dtype, shape and a digest of its bytes, or what `identity` says of it (a target's arrays on
    a device: their address and version). Equal signatures give equal masks."""
    def digest(a) -> tuple:
        a = np.ascontiguousarray(a)
        return (str(a.dtype), a.shape, hashlib.blake2b(a.tobytes(), digest_size=16).hexdigest())

    lens = None if launch.kv_lens is None else digest(np.asarray(launch.seq_lens_k(), np.int64))
    return ((launch.batch, launch.heads_q, launch.heads_kv, launch.len_q, launch.len_k), lens,
            tuple((i.name, (identity or digest)(arrays[i.name])) for i in mask_inputs(spec)))
