"""The backward pass's neutral rules (issue 41; docs/backward.md): which specs have one, and the
work of the algorithm both targets implement.

Every spec whose forward is a differentiable function of q, k and v has a backward, derived
from the same spec: nothing in the language asks for it. The backward takes q, k, v, out, lse
(the forward's, natural log) and dout, and returns dq, dk, dv. Both targets compute it in three
steps, with no atomics, so the same inputs give the same bits on every run (deterministic):

    1. preprocess  D_i = rowsum(dO_i * O_i)                         per query row, f32
    2. dK, dV      per key tile j (of a batch entry and KV head), over the query tiles that can
                   see it and every query head of the GQA group:
                   P_ij = exp(S_ij - lse_i) (S: the scaled, soft-capped, masked scores),
                   dV_j += P_ij^T dO_i; dP_ij = dO_i V_j^T; dS_ij = P_ij (dP_ij - D_i)
                   (times 1 - tanh^2 through a soft-cap, times the scale); dK_j += dS_ij^T Q_i
    3. dQ          per query tile i (of a batch entry and query head), over the key tiles it sees:
                   the same P_ij and dS_ij, dQ_i += dS_ij K_j

Score and mask expressions (issue 42): a mask expression only chooses the visible pairs; a score
expression multiplies dS_ij by d score / d s at the pair (attngen.plan.expr_grad), and its `grad`
inputs take dS_ij (before that factor) times d score / d entry, summed over the pairs that read
each entry. attngen.reference_backward computes every such gradient. What a target's backward
kernels compile, its backend says (Backend.backward_expressions, `problems`' `expressions`):
"indices" (expressions of indices and s; a mask that reads inputs runs as the forward's
block-mask builder, then the backward of the `mask custom` kernel with that BlockMask,
attngen/plan/mask_inputs.py), "inputs" (also a score expression that reads inputs, taken as the
forward takes them) or "grads" (also the gradients of every `grad` input: a fourth value; both
targets' deterministic kernels add a read that names one entry per pair, `injective`, directly,
and the others through partial sums per dK/dV block, added up in a fixed order).

P is recomputed from lse in steps 2 and 3 (nothing L x L is stored: the workspace is D, B x Hq x Lq
floats). A row that saw no key (lse = -inf) has P = 0: no gradient flows through it; a key a row
does not see contributes nothing, whatever its values.
"""

from __future__ import annotations

from ..lang.spec import AttentionSpec
from .kernel_plan import Problem

# The section names of both targets' backward templates, in order (tests/plan checks them).
SECTIONS = ("inputs", "preprocess", "recompute P", "dK and dV", "dQ", "store")


def problems(spec: AttentionSpec, expressions: bool | str = False, target: str = "this target") -> list[Problem]:
    """Why `spec` has no backward (empty: it has one) on a target whose backward kernels compile
    `expressions` (Backend.backward_expressions): False, none; "indices" (or True), expressions of
    indices and s, and masks that read inputs (the builder's BlockMask + `mask custom`);
    "inputs", also score expressions that read inputs; "grads", also `grad` inputs. `target`
    names the target in the messages."""
    from ..lang.expr import inputs_read
    out = []
    if spec.kv_cache.kind == "paged":
        out.append(Problem("a paged KV cache is an inference cache: its kernels have no backward", key="kv_cache",
                           hint="train with kv_cache contiguous (the default); serve with paged"))
    if spec.is_fp8:
        out.append(Problem(f"dtype {spec.dtype}: FP8 prefill kernels are inference kernels: they have no backward "
                           "(issue 44)", key="dtype", hint="train with dtype f16 or bf16"))
    if spec.kv_dtype is not None:
        out.append(Problem(f"kv_dtype {spec.kv_dtype}: a quantized KV cache is an inference cache: its kernels have "
                           "no backward", key="kv_dtype", hint="train with K and V in the spec's dtype (no kv_dtype)"))
    exprs = [(w, e) for w, e in (("score", spec.score), ("mask", spec.mask.expr if spec.mask.kind == "expr" else None))
             if e is not None]
    if exprs and not expressions:
        which = " and ".join(w for w, _ in exprs)
        both = len(exprs) > 1
        out.append(Problem(f"the {which} expression{'s are' if both else ' is'} not compiled by this target's "
                           "backward kernels yet (issue 42)", key=f"{exprs[0][0]}.expr",
                           hint="attngen.reference_backward computes the gradients; see docs/backward.md for the "
                                "targets whose backward compiles expressions"))
        return out
    read = inputs_read(spec.score) if spec.score is not None else set()
    if read and expressions not in ("inputs", "grads"):
        out.append(Problem(f"the score expression reads inputs ({', '.join(sorted(read))}): this target's backward "
                           "kernels do not take inputs yet (issue 42)", key="score.expr",
                           hint="attngen.reference_backward computes the gradients, of `grad` inputs too"))
    grads = [i.name for i in spec.inputs if i.grad]
    if grads and not out and expressions != "grads":
        out.append(Problem(f"the gradient of `grad` input{'s' if len(grads) > 1 else ''} {', '.join(grads)} is not "
                           f"computed by {target}'s backward kernels yet (issue 42)", key="input",
                           hint="attngen.reference_backward returns it (a fourth value); drop `grad` to train the "
                                "rest with this target"))
    return out


GRAD_AXES = ("b", "h", "hkv", "q", "k")


def injective(load, inp) -> bool:
    """Whether read `load` of input `inp` names a distinct entry for each (batch, query head, row,
    key) pair: every axis named b, h, hkv, q or k is indexed by that bare name, every fixed axis by
    a constant in it, and the axes hold b, q, k and h or hkv (hkv: the query heads of one GQA group
    share the entry, which one workgroup visits in turn). Then a deterministic backward writes each
    entry from one place, with no atomics."""
    from ..lang.expr import Const, Var
    axes = inp.axes
    if not {"b", "q", "k"} <= set(axes) or not ({"h", "hkv"} & set(axes)):
        return False
    for axis, index in zip(axes, load.indices):
        if isinstance(axis, str):
            if axis not in GRAD_AXES or not (isinstance(index, Var) and index.name == axis):
                return False
        elif not (isinstance(index, Const) and 0 <= index.value < axis):
            return False
    return True


def workspace_bytes(batch: int, heads_q: int, len_q: int) -> int:
    """The backward's workspace: D (f32 per query row and head)."""
    return 4 * batch * heads_q * len_q
