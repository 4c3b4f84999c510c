"""The WGSL kernel object: compile a spec for the live wgpu device, and call it.

    kernel = compile_kernel(spec)            # profile of the live adapter (devices.py)
    out = kernel(q, k, v)                    # numpy arrays (B, L, H, D) in, numpy out
    out, lse = kernel(q, k, v, return_lse=True)

Caching. Pipelines are cached in this process by (spec, profile, generator version). The
generated source and manifest are also written to the on-disk cache (attngen.runtime.cache)
keyed by (spec, generator version, target, adapter, profile), for inspection and for runtimes
outside Python. wgpu offers no portable way to serialise a compiled pipeline, so every new
process compiles the shader again (naga + the driver; some drivers, e.g. Mesa, keep their own
shader cache); the on-disk entries are a record, not a shortcut: the source is always emitted
afresh.
"""

from __future__ import annotations

import json
import threading

import numpy as np

from ...errors import CompileError, LaunchError
from ...lang.spec import AttentionSpec
from ...plan.kernel_plan import Emitted
from ...plan.lower import lower
from ...plan.mask_inputs import reads_inputs
from ...plan.profiles import Profile
from ...resources import generator_version
from ...runtime.cache import cache_key, cached
from ...runtime.kernel import Kernel
from . import expr_blockmask
from .blockmask import build_block_mask
from .devices import (
    NP_DTYPES, RECHECK_SENTINEL, SENTINEL, WGPU_FEATURE, WgslTensor, _DeviceState, adapter_profile, create_module,
    device_state, naga_dialect, padded, wgpu,
)
from .launch import backward_call, call
from .lower import append_params
from .manifest import append_entry


def _profile_key(p: Profile) -> str:
    key = {"name": p.name, "limits": p.limits, "features": p.features, "sections": p.sections,
           "defaults": list(p.defaults), "dtypes": list(p.storage_dtypes)}
    if p.overrides:  # the tile table's overrides (wgsl/tiles.py): they change the plan
        key["overrides"] = p.overrides
    return json.dumps(key, sort_keys=True)


# ---- compiling ----------------------------------------------------------------------------------

def _check_device(plan, st: _DeviceState, adapter: Profile) -> None:
    """Refuse a plan this device cannot run, naming what is missing (`adapter`: the live
    adapter's profile, whose subgroup range is what plans on this device may assume)."""
    who = f"this device ({st.info.get('device') or st.info.get('vendor')})"
    for feat in plan.features:
        if WGPU_FEATURE[feat] not in st.features:
            raise LaunchError(f"kernel '{plan.spec.name}' needs the WebGPU feature '{feat}', which {who} "
                              "does not have")
    if plan.config.subgroups:
        if st.subgroup_problem is not None:
            raise LaunchError(f"kernel '{plan.spec.name}' uses subgroups, but on {who} {st.subgroup_problem}; "
                              "build it with target wgsl { subgroups=off } or for the adapter's profile")
        guaranteed = adapter.features.get("subgroup_min_size") or st.subgroup_min
        decode = getattr(plan.config, "decode", None)
        if decode is not None and guaranteed and decode.subgroup > guaranteed:
            raise LaunchError(f"kernel '{plan.spec.name}' (the decode kernel) sums over subgroups of {decode.subgroup} "
                              f"invocations, but {who} guarantees subgroups of only {guaranteed}")
        if decode is None and guaranteed and plan.config.threads_per_row > guaranteed:
            raise LaunchError(f"kernel '{plan.spec.name}' reduces {plan.config.threads_per_row} invocations "
                              f"per row with subgroup shuffles, but {who} guarantees subgroups of only "
                              f"{guaranteed}")
    why = _matrix_problem(plan, adapter, who)
    if why is not None:
        raise LaunchError(f"kernel '{plan.spec.name}' {why}")
    if st.loop_budget is not None and plan.details.runtime_checks != "all":
        # llvmpipe ends all loops of a shader after LLVMPIPE_LOOP_BUDGET iterations; only with wgpu's
        # loop bounding does that cut end the main loop where the epilogue sees it (measured: long
        # rows came back wrong, not refused, with runtime_checks "bounds" or "none")
        raise LaunchError(f"kernel '{plan.spec.name}' is planned with wgpu's runtime checks "
                          f"'{plan.details.runtime_checks}' (profile {plan.profile}), but on {who} (Mesa's "
                          "llvmpipe, which cuts long loops short) the kernels need wgpu's loop bounding to "
                          "detect the cut: use a profile with [dialect] runtime_checks = \"all\"")
    for value, key, what in ((plan.smem_bytes, "workgroup_storage_bytes", "bytes of workgroup memory"),
                             (plan.threads, "invocations_per_workgroup", "invocations per workgroup")):
        limit = st.device_limit(key)
        if value > limit:
            raise LaunchError(f"kernel '{plan.spec.name}' needs {value} {what}, but {who} allows {limit}")


def _matrix_problem(plan, adapter: Profile, who: str = "this device") -> str | None:
    """Why the live adapter (its profile `adapter`; `who` names it) cannot run `plan`'s
    subgroup-matrix kernel, as the end of a sentence after the kernel's name; None where it can or
    the plan is of the scalar family."""
    from .matrix import matrix_configs
    mc = plan.config.matrix
    if mc is None:
        return None
    if mc not in matrix_configs(adapter):
        return (f"uses {mc.m}x{mc.n}x{mc.k} {mc.component} -> {mc.result} subgroup matrices at subgroup size "
                f"{mc.max_subgroup_size}, which {who} does not offer: build it for the adapter's profile, or "
                "with target wgsl { matrix=auto } or { matrix=off }")
    sizes = (adapter.features.get("subgroup_min_size"), adapter.features.get("subgroup_max_size"))
    if sizes != (mc.max_subgroup_size, mc.max_subgroup_size):
        return (f"places its rows by subgroups of exactly {mc.max_subgroup_size} invocations, but {who} runs "
                f"subgroups of {sizes[0]} to {sizes[1]}: use target wgsl {{ matrix=auto }} or {{ matrix=off }}")
    return None


def _plan(spec: AttentionSpec, backend, prof: Profile, live: Profile):
    """The plan of `spec` on `prof` for the live adapter (profile `live`). Under `matrix=auto`, a plan
    on the subgroup-matrix family that the adapter cannot run (a named profile with configs the
    adapter lacks) is planned again on the scalar family: the profile without the family's feature
    and configs, under its own name (what `matrix=off` builds for it). `matrix=on` keeps the plan,
    and _check_device refuses it."""
    from .matrix import requested, without_family
    plan = lower(spec, backend, prof)
    if plan.config.matrix is None or requested(spec) != "auto" or _matrix_problem(plan, live) is None:
        return plan, prof
    scalar = without_family(prof)
    return lower(spec, backend, scalar), scalar


def _layout(params, dev):
    """The bind group layout of one entry point: exactly its bindings (lower.py)."""
    entries = []
    for p in sorted(params, key=lambda p: p.binding):
        if p.kind == "uniform":
            kind = wgpu.BufferBindingType.uniform
        elif p.access == "read":
            kind = wgpu.BufferBindingType.read_only_storage
        else:
            kind = wgpu.BufferBindingType.storage
        entries.append({"binding": p.binding, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": kind}})
    return dev.create_bind_group_layout(entries=entries)


_PIPELINES: dict = {}
_PIPELINES_LOCK = threading.Lock()


def compile_kernel(backend, spec: AttentionSpec, profile: Profile | str | None = None) -> "WgslKernel":
    """Plan, emit and compile `spec` with `backend` (the WGSL backend) for the live device
    (profile None = the adapter's profile)."""
    st = device_state()
    live = adapter_profile(backend)
    prof = live if profile is None else naga_dialect(backend.profile(profile))
    plan, prof = _plan(spec, backend, prof, live)
    _check_device(plan, st, live)
    key = (plan.spec_text, _profile_key(prof), generator_version())
    with _PIPELINES_LOCK:
        hit = _PIPELINES.get(key)
    if hit is not None:
        return WgslKernel(*hit, st, backend)

    # The source is always emitted afresh (it is cheap, and a disk copy could go stale behind
    # the template digest); the disk cache keeps a record of it and its manifest once it compiles.
    source = backend.render(plan)
    em = Emitted(source, backend.manifest(plan), plan)
    disk_key = cache_key(spec=plan.spec_text, generator=generator_version(), target="wgsl",
                         adapter=st.description(), profile=_profile_key(prof))

    dev = st.device
    try:
        module = create_module(dev, plan.entry, source, plan.details.runtime_checks)
        # one pipeline per entry point, in dispatch order, each with a layout of its own bindings
        pipeline = []
        for role, entry, params, grid in [("attention", plan.entry, plan.params, plan.grid)] + [
                (e.name, e.entry, e.params, e.grid) for e in plan.entries]:
            bgl = _layout(params, dev)
            pipeline.append((role, dev.create_compute_pipeline(
                label=entry, layout=dev.create_pipeline_layout(bind_group_layouts=[bgl]),
                compute={"module": module, "entry_point": entry}), bgl, params, grid))
        if append_entry(plan):  # the decode kernel's twin for calls that append (launch.dispatch picks it)
            role, _, bgl, params, grid = pipeline[0]
            if params != append_params(plan.spec, params):  # i8: its scales bound read_write (k_scale_w)
                params = append_params(plan.spec, params)
                bgl = _layout(params, dev)
            pipeline.append(("attention_append", dev.create_compute_pipeline(
                label=append_entry(plan), layout=dev.create_pipeline_layout(bind_group_layouts=[bgl]),
                compute={"module": module, "entry_point": append_entry(plan)}), bgl, params, grid))
        pipeline = tuple(pipeline)
        layout = pipeline[0][2]
    except wgpu.GPUError as e:
        raise CompileError(f"wgpu rejected the generated WGSL of kernel '{spec.name}' (profile {prof.name}); "
                           f"this is a bug in attngen, please report it with the spec:\n{e}") from None
    cached(disk_key, ".wgsl", lambda: source.encode())
    cached(disk_key, ".json", lambda: json.dumps(em.manifest, indent=2, sort_keys=True).encode())
    with _PIPELINES_LOCK:
        _PIPELINES[key] = (em, pipeline, layout, prof)
    return WgslKernel(em, pipeline, layout, prof, st, backend)


class WgslKernel(Kernel):
    """A compiled WGSL kernel: call it with q, k, v (numpy arrays or WgslTensor)."""

    target = "wgsl"

    def __init__(self, emitted: Emitted, pipeline, layout, profile: Profile, state: _DeviceState, backend=None):
        super().__init__(emitted)
        self.backend = backend  # the WGSL backend (a mask over inputs compiles its `mask custom` kernel with it)
        # a mask over inputs (expr_blockmask.py): its `mask custom` kernel (False: refused by the
        # profile), the (signature, BlockMask) of the last build, and how many builds ran
        self._companion = None
        self._last_mask = None
        self.mask_builds = 0
        self.profile = profile  # what the kernel was planned for
        # (role, pipeline, bind group layout, params, grid) of each entry point, in dispatch order
        self.pipelines = pipeline
        self.layout = layout
        self.state = state  # the device it runs on (adapter.device_state())

    def __repr__(self) -> str:
        text = super().__repr__()
        st = self.state
        if "subgroup" in st.features and st.subgroup_problem is not None:
            text = text[:-1] + f"; subgroups not used: {st.subgroup_problem}>"
        return text

    # -- inputs -------------------------------------------------------------------------------
    def buffer(self, name: str, x, limit: int):
        """A storage buffer holding input `x` (a WgslTensor's own, or a new upload)."""
        st = self.state
        if isinstance(x, WgslTensor):
            if x.nbytes > limit:
                raise LaunchError(f"{name} is {x.nbytes} bytes, above the {limit}-byte storage binding limit")
            size = getattr(x.buffer, "size", None)
            if size is not None and size < x.nbytes:
                raise LaunchError(f"{name}'s buffer holds {size} bytes, but shape {tuple(x.shape)} {x.dtype} "
                                  f"needs {x.nbytes}")
            usage = getattr(x.buffer, "usage", None)
            if usage is not None and not usage & wgpu.BufferUsage.STORAGE:
                raise LaunchError(f"{name}'s buffer was not created with STORAGE usage")
            return x.buffer
        data = np.ascontiguousarray(x)
        if data.nbytes > limit:
            raise LaunchError(f"{name} is {data.nbytes} bytes, above the {limit}-byte storage binding limit "
                              "of this device/profile")
        raw = data.tobytes()
        raw += b"\0" * (padded(len(raw)) - len(raw))  # f16 buffers: padded to 4 bytes
        return st.device.create_buffer_with_data(data=raw, usage=wgpu.BufferUsage.STORAGE)

    def check_out(self, out, shape, dtype: str):
        """A LaunchError unless `out` can take this call's output."""
        if isinstance(out, WgslTensor):
            if tuple(out.shape) != shape or out.dtype != dtype:
                raise LaunchError(f"out is a WgslTensor of shape {tuple(out.shape)} {out.dtype}, but this call "
                                  f"writes {shape} {dtype}")
            size, usage = getattr(out.buffer, "size", None), getattr(out.buffer, "usage", None)
            if size is not None and size < out.nbytes:
                raise LaunchError(f"out's buffer holds {size} bytes, but {shape} {dtype} needs {out.nbytes}")
            if usage is not None and not usage & wgpu.BufferUsage.STORAGE:
                raise LaunchError("out's buffer was not created with STORAGE usage")
            return
        if not isinstance(out, np.ndarray):
            raise LaunchError(f"out must be a numpy array or a WgslTensor, not {type(out).__name__}")
        if out.shape != shape or out.dtype != NP_DTYPES[dtype]:
            raise LaunchError(f"out has shape {out.shape} and dtype {out.dtype}, but this call writes "
                              f"{shape} {np.dtype(NP_DTYPES[dtype])}")
        if not out.flags.writeable:
            raise LaunchError("out is read-only")

    # -- the call ---------------------------------------------------------------------------------
    def __call__(self, q, k, v, *, mask=None, kv_lens=None, cu_seqlens_q=None, cu_seqlens_k=None,
                 block_table=None, k_new=None, v_new=None, return_lse: bool = False, out=None, max_seqlen_q=None,
                 max_seqlen_k=None, check=False, **inputs):
        """out in the spec's dtype, and lse f32 with return_lse; layouts and options as in
        docs/variants.md (launch.py does the work). Integer inputs are read on the host and
        checked before the launch (`check` is accepted for the CUDA target's signature: there
        is nothing left for the GPU to report). `**inputs`: the spec's expression inputs by name,
        numpy arrays of their declared dtype and shape (attngen.runtime.inputs; docs/language.md);
        a keyword that is not one is a LaunchError.

        Results are numpy arrays, or WgslTensor when q, k and v are all WgslTensor (nothing is
        read back then); `out=` (numpy array or WgslTensor of the right shape and dtype) is
        written into and returned. k_new / v_new are appended to k and v in place.
        """
        by_builder = reads_inputs(self.spec) and expr_blockmask.companion(self) is not None
        run = expr_blockmask.call if by_builder else call
        return run(self, q, k, v, mask=mask, kv_lens=kv_lens, cu_seqlens_q=cu_seqlens_q,
                   cu_seqlens_k=cu_seqlens_k, block_table=block_table, k_new=k_new, v_new=v_new,
                   return_lse=return_lse, out=out, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                   inputs=inputs)

    def backward(self, q, k, v, out, lse, dout, *, mask=None, kv_lens=None, cu_seqlens_q=None, cu_seqlens_k=None,
                 max_seqlen_q=None, max_seqlen_k=None, **inputs):
        """(dq, dk, dv) in q's, k's and v's shapes and dtype (docs/backward.md): q, k, v and the options
        as the forward call took them, that call's out and lse (return_lse=True), and dout (out's
        shape). numpy arrays, or WgslTensor when q, k and v are all WgslTensor. `**inputs`: the
        expression inputs, as the call took them; a mask over inputs reuses the call's BlockMask
        (the builder runs again only where the signature changed; expr_blockmask.backward). A spec
        with `grad` inputs returns a fourth value, {name: f32 gradient of the input's shape}
        (issue 42; expr_grads.py: read once per pair directly, the others through partial sums)."""
        by_builder = reads_inputs(self.spec) and expr_blockmask.companion(self) is not None
        run = expr_blockmask.backward if by_builder else backward_call
        return run(self, q, k, v, out, lse, dout, mask=mask, kv_lens=kv_lens, cu_seqlens_q=cu_seqlens_q,
                   cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, inputs=inputs)

    def backward_pipelines(self):
        """(role, pipeline, bind group layout, params, grid) of the backward's three entry points,
        compiled once per process (a LaunchError for a spec without a backward)."""
        from .expr_grads import backward_problems
        from .emit import backward_plan, backward_source
        plan = self.plan
        found = backward_problems(plan.spec)
        if found:
            raise LaunchError(f"kernel '{plan.spec.name}' has no backward: " + "; ".join(p.message for p in found))
        made = backward_plan(plan)
        if made is None:
            raise LaunchError(f"kernel '{plan.spec.name}' has no WGSL backward: head dims qk={plan.d_qk} v={plan.d_v} "
                              "do not fit the backward's blocks (one query row and one key of Q, dO, K and V in "
                              "16384 bytes of workgroup memory)")
        key = ("backward", plan.spec_text, _profile_key(self.profile), generator_version(), id(self.state.device))
        with _PIPELINES_LOCK:
            hit = _PIPELINES.get(key)
        if hit is not None:
            return hit
        dev = self.state.device
        source = backward_source(plan)
        try:
            module = create_module(dev, plan.entry + "_backward", source, plan.details.runtime_checks)
            pipes = []
            for e in made[1]:  # emit.backward_plan: (config, entry points in dispatch order)
                bgl = _layout(e.params, dev)
                pipes.append((e.name, dev.create_compute_pipeline(
                    label=e.entry, layout=dev.create_pipeline_layout(bind_group_layouts=[bgl]),
                    compute={"module": module, "entry_point": e.entry}), bgl, e.params, e.grid))
        except wgpu.GPUError as err:
            raise CompileError(f"wgpu rejected the generated backward WGSL of kernel '{plan.spec.name}'; this is a "
                               f"bug in attngen, please report it with the spec:\n{err}") from None
        pipes = tuple(pipes)
        with _PIPELINES_LOCK:
            _PIPELINES[key] = pipes
        return pipes

    def block_mask(self, *args, **kwargs):
        """A BlockMask for this kernel, built on the GPU: `block_mask(mask)` of a mask tensor (numpy bool
        or additive float) for a `mask custom` kernel; `block_mask(q, k, kv_lens=None, **inputs)` of
        a mask expression over inputs, for a call with these shapes and inputs (expr_blockmask.py:
        the kernel's own cache, or pass it as mask= to calls with the same signature)."""
        if reads_inputs(self.spec):
            if expr_blockmask.companion(self) is None:
                raise LaunchError(f"kernel '{self.spec.name}': its mask is tested per element (the kernel with "
                                  "mask custom and the score's inputs does not fit this profile's storage buffers): "
                                  "it takes no BlockMask")
            return expr_blockmask.block_mask(self, *args, **kwargs)
        return build_block_mask(self, *args, **kwargs)

    def sentinel(self, recheck: bool = False):
        """(bits dtype, bits) of the NaN that marks unwritten output on loop-budget adapters
        (`recheck`: the second marker, which tells an unwritten element from an input NaN with
        the first one's bits; launch.py)."""
        return (RECHECK_SENTINEL if recheck else SENTINEL)[self.plan.dtype]

    def budget_error(self, len_k: int, what: str) -> LaunchError:
        name = self.state.info.get("device") or "llvmpipe"
        return LaunchError(
            f"kernel '{self.spec.name}' with Lk={len_k}: the software adapter {name} (Mesa's "
            f"llvmpipe) stops all loops of a shader after {self.state.loop_budget} iterations in total, "
            f"and this launch needed more ({what}); nothing was returned. Use shorter key sequences "
            "on this adapter, or a hardware one")

    def compute_units(self) -> int:
        """The profile's compute units (8 where it names none): what a call's splits are planned with."""
        return int(self.profile.limits.get("compute_units", 8))

    def limit(self, key: str) -> int:
        """The smaller of the profile's and the device's limit."""
        return min(self.profile.limit(key), self.state.device_limit(key))

    def binding_limit(self) -> int:
        return self.limit("storage_buffer_binding_bytes")
