"""Expression inputs at a call (issue 42): each `input NAME[AXES] DTYPE` of a spec checked against
the array passed by keyword, the same for every target.

    kernel(q, k, v, slopes=np.array([...], np.float32))

`check_declared` (also attngen.reference's) refuses unknown keywords, missing inputs and wrong
shapes: each axis is an index name whose extent comes from the call (b: batch, h: query heads,
hkv: KV heads, q: query rows, k: keys, i.e. q.shape[0], q.shape[2], k.shape[2], q.shape[1],
k.shape[1] of padded (B, L, H, D) tensors) or a literal integer. `declared_for_call` is every
kernel's (any target): those checks over a padded batch (packed sequences and paged caches are
refused: the extent of b, q and k is not defined there yet). `check_call_inputs` adds the wgsl
target's: numpy arrays only, each of exactly its declared dtype (NUMPY_DTYPES; no conversion is
made, so nothing is rounded or wrapped behind the caller's back); the cuda target adds its own
for device arrays (backends/cuda/args.py: device_inputs).
"""

from __future__ import annotations

import numpy as np

from ..errors import LaunchError

# The numpy dtype a kernel takes for each input dtype (bf16 has none: no target takes it yet).
NUMPY_DTYPES = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "i32": np.dtype(np.int32),
                "u8": np.dtype(np.uint8), "bool": np.dtype(np.bool_)}


def input_shape(inp, extents: dict) -> tuple:
    """The shape the declaration `inp` (attngen.lang.expr.Input) takes with the call's extents."""
    return tuple(extents[x] if isinstance(x, str) else x for x in inp.axes)


def check_declared(spec, given: dict, extents: dict, who: str) -> dict:
    """{name: numpy array} of the spec's inputs from `given` (the call's keywords), after checking
    that none is unknown or missing and each has its declared shape (`extents`: b, h, hkv, q, k
    of the call); `who` starts each message ("attngen.reference", "kernel 'alibi' (wgsl)")."""
    declared = {i.name: i for i in spec.inputs}
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise LaunchError(f"{who}: unknown input{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(unknown)} (spec {spec.name} declares: {', '.join(declared) or 'none'})")
    out = {}
    for name, inp in declared.items():
        if given.get(name) is None:
            raise LaunchError(f"{who}: spec {spec.name} reads input '{name}' "
                              f"({inp.dtype}, axes [{', '.join(map(str, inp.axes))}]): pass {name}=...")
        a = given[name] if hasattr(given[name], "shape") else np.asarray(given[name])  # (device arrays: as they are)
        shape = input_shape(inp, extents)
        if tuple(a.shape) != shape:
            axes = ", ".join(f"{x}={n}" if isinstance(x, str) else str(x) for x, n in zip(inp.axes, shape))
            raise LaunchError(f"{who}: input '{name}' has shape {tuple(a.shape)}; its axes [{axes}] need {shape}")
        out[name] = a
    return out


def call_extents(launch) -> dict:
    """b, h, hkv, q, k of a checked Launch (attngen.runtime.launch) with a padded layout."""
    return {"b": launch.batch, "h": launch.heads_q, "hkv": launch.heads_kv, "q": launch.len_q,
            "k": launch.capacity}


def declared_for_call(spec, given: dict, launch, who: str) -> dict:
    """{name: the array given} of a kernel call's inputs after check_declared's checks with the
    call's extents, over a padded batch (a LaunchError for packed sequences and paged caches)."""
    if spec.inputs and launch.layout != "padded":
        what = "packed sequences (cu_seqlens)" if launch.layout == "packed" else "a paged cache (block_table)"
        raise LaunchError(f"{who}: spec {spec.name} reads inputs ({', '.join(i.name for i in spec.inputs)}), "
                          f"which take a padded batch (B, L, H, D), not {what}: the extents of their axes b, q "
                          "and k are not defined there yet (issue 42)")
    return check_declared(spec, given, call_extents(launch), who)


def check_call_inputs(spec, given: dict, launch, who: str) -> dict:
    """{name: contiguous numpy array} of a kernel call's inputs, each checked against its
    declaration: numpy arrays of exactly NUMPY_DTYPES[dtype] and the declared shape, over a padded
    batch. Every problem is a LaunchError naming the input and what was expected."""
    for name, x in given.items():
        if x is not None and not isinstance(x, np.ndarray):
            raise LaunchError(f"{who}: input '{name}' is a {type(x).__name__}; inputs are numpy arrays")
    arrays = declared_for_call(spec, given, launch, who)
    out = {}
    for inp in spec.inputs:
        a = arrays[inp.name]
        want = NUMPY_DTYPES.get(inp.dtype)
        if want is None:
            raise LaunchError(f"{who}: input '{inp.name}' is declared {inp.dtype}, which this target does not take")
        if a.dtype != want:
            raise LaunchError(f"{who}: input '{inp.name}' is {a.dtype}; it is declared {inp.dtype}: pass a numpy "
                              f"array of dtype {want} (no conversion is made), e.g. "
                              f"np.asarray({inp.name}, np.{want.name})")
        out[inp.name] = np.ascontiguousarray(a)
    return out
