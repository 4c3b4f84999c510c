"""The partial sums of `grad` inputs (issue 42; docs/backward.md): what both targets' deterministic
backwards decide alike about the gradient of an input whose entries many pairs read (a
relative-bias table at a function of k - q, slopes[h], a bias without b), summed without atomics.

Each block of the dK/dV step (the grid: x its key tile, y its KV head, z its batch entry; the
GQA group's query heads in turn) adds into its own *slice* of the input's partial sums, and a last
entry point writes each entry of the gradient once: the sum, in grid order, of the slices of the
blocks that can name it. A slice spans the input's axes, except an axis the block *owns*: one
indexed by its own name in every read of the input, of which the block names only

    k    its key tile:   `tile` keys  (the grid's x: entry index / tile; offset index % tile)
    b    its batch entry: 1           (z: the index; offset 0)
    hkv  its KV head:    1            (y: the index; offset 0)
    h    its GQA group:  `group` query heads (y: index / group; offset index % group), only where
         the input has no axis hkv (the block is named by hkv then, and h spans its axis)

    partials(spec, direct_at_hkv)          [Partials] of the inputs summed through partial sums
    Partials.extents(tile, group, one, x)  a slice's extents, per axis, as the caller's expressions
    Partials.formula(tile)                 the same as the formulas `attngen check` prints
    Partials.words(shape, tile, group)     a slice's words in a call

A renderer supplies its own syntax and its own key-tile size; what is summed, and over which
slices, is here.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..lang.expr import Var
from .backward import injective
from .expr_grad import grad_inputs, grad_reads

OWNED = ("k", "b", "hkv", "h")  # the axes a block can own
GRID = {"k": "x", "b": "z", "hkv": "y", "h": "y"}  # the grid dimension naming the block of an owned axis
_SPAN = {"k": "tile", "b": "one", "hkv": "one", "h": "group"}  # what a slice spans of an owned axis
SYMBOL = {"b": "B", "h": "Hq", "hkv": "Hkv", "q": "Lq", "k": "Lk"}  # a call's extents in the printed formulas


@dataclass(frozen=True)
class Partials:
    """One `grad` input summed through partial sums: `input` (attngen.lang.expr.Input) and, per
    axis of it, the name the block owns there ("k", "b", "hkv", "h") or None (its slice spans the
    axis)."""
    input: object
    owned: tuple

    def extents(self, tile: str, group: str, one: str, full) -> list:
        """The extents of one block's slice, per axis: `tile` (the block's keys), `one` or `group`
        (the GQA group's query heads) where the block owns the axis, else `full(axis)` (the axis's
        extent: a name of attngen.lang.expr.INDEX_NAMES or a fixed size)."""
        given = {"tile": tile, "one": one, "group": group}
        return [given[_SPAN[o]] if o else full(a) for a, o in zip(self.input.axes, self.owned)]

    def formula(self, tile: str) -> list:
        """extents() as printed formulas: G the GQA group, B, Hq, Hkv, Lq, Lk the call's extents."""
        return self.extents(tile, "G", "1", lambda a: SYMBOL[a] if isinstance(a, str) else str(a))

    def words(self, shape, tile: int, group: int) -> int:
        """The words of one block's slice in a call whose input has `shape`."""
        given = {"tile": tile, "one": 1, "group": group}
        n = 1
        for extent, own in zip(shape, self.owned):
            n *= given[_SPAN[own]] if own else int(extent)
        return n


def _owned(spec, inp) -> tuple:
    """Per axis of `inp`: the name a block's slice owns (module docstring) or None."""
    loads = [ld for i, _, ld, _ in grad_reads(spec) if i is inp]
    out = []
    for n, axis in enumerate(inp.axes):
        own = axis in OWNED and all(ld.indices[n] == Var(axis, ld.indices[n].type) for ld in loads)
        out.append(axis if own and not (axis == "h" and "hkv" in inp.axes) else None)
    return tuple(out)


def partials(spec, direct_at_hkv: bool) -> list:
    """[Partials] of the `grad` inputs summed through partial sums, in declaration order: those
    with a read that is not once per pair (attngen.plan.backward.injective), and, where the
    target does not add a read at hkv directly (`direct_at_hkv` False: the group's query heads
    may run in parallel into one entry), those with an axis hkv."""
    found = grad_reads(spec)
    out = []
    for inp in grad_inputs(spec):
        direct = all(injective(ld, inp) for i, _, ld, _ in found if i is inp)
        if not direct or ("hkv" in inp.axes and not direct_at_hkv):
            out.append(Partials(inp, _owned(spec, inp)))
    return out
