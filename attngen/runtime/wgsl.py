"""The WGSL runtime: compile generated kernels with wgpu (wgpu-py 0.32) and launch them.

    kernel = compile_kernel(spec)            # profile of the live adapter
    out = kernel(q, k, v)                    # numpy arrays (B, L, H, D) in, numpy out
    out, lse = kernel(q, k, v, return_lse=True)
    q_gpu = WgslTensor.from_numpy(q)         # inputs resident on the GPU ...
    out = kernel(q_gpu, k_gpu, v_gpu)        # ... give a WgslTensor; out.numpy() reads it back

One wgpu device is created lazily per process (`device()`), with the adapter's limits and the
optional features attngen uses ("shader-f16", and "subgroup", wgpu-py's name for WebGPU's
"subgroups") when the adapter has them.

Profiles. `adapter_profile()` matches the live adapter against the [match] tables of
targets/*.toml (keys of adapter.info: vendor_id, backend_type, adapter_type, ...; webgpu-core when none matches) and
narrows the profile to the device: its limits, the features it really has, and its subgroup
sizes as the adapter reports them (never assumed). Once per device a probe shader checks that
subgroups are consecutive runs of local_invocation_index (which the kernels' row reductions
rely on) and that subgroupShuffleXor works; if it does not, subgroups are treated as
unavailable and kernels use the workgroup-memory reduction instead (the kernel's repr says so).
Kernels are compiled by naga whatever profile they are planned for, so the runtime plans with
naga's dialect (no `enable subgroups;`, which naga rejects); a named profile whose dialect
differs is renamed NAME@wgpu so that its source is not mistaken for the browser one.

Software adapters. Mesa's llvmpipe (lavapipe) silently ends all loops of a shader after 65535
iterations in total, which rows with very many keys exceed; on that adapter every launch is
checked and refused with a LaunchError rather than answered wrongly (see LLVMPIPE_LOOP_BUDGET).

Caching. Pipelines are cached in this process by (spec, profile, generator version). The
generated source and manifest are also written to the on-disk cache (runtime/cache.py) keyed
by (spec, generator version, target, adapter, profile), for inspection and for runtimes outside
Python. wgpu offers no portable way to serialise a compiled pipeline, so every new process
compiles the shader again (naga + the driver; some drivers, e.g. Mesa, keep their own shader
cache); the on-disk entries are a record, not a shortcut: the source is always emitted afresh.

Nothing in attngen imports this module except the API layer (data flows one way).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, replace

import numpy as np

from ..emit import Emitted, emit_plan, generator_version
from ..errors import CompileError, LaunchError
from ..plan import plan as make_plan
from ..profiles import Profile, ProfileError, get_profile, profiles_for
from ..spec import AttentionSpec
from .cache import cache_key, cached
from .common import Kernel

try:
    import wgpu
except ImportError:  # pragma: no cover - reported when a device is asked for
    wgpu = None

# numpy dtype <-> attngen storage dtype
_NP_DTYPES = {"f16": np.float16, "f32": np.float32}
_DTYPE_BYTES = {"f16": 2, "f32": 4}
# WebGPU feature names in plans and manifests -> wgpu-py's names for them.
_WGPU_FEATURE = {"shader-f16": "shader-f16", "subgroups": "subgroup"}
# Profile limits <- the device limits they are read from (several: the smallest).
_LIMITS = {
    "workgroup_storage_bytes": ("max-compute-workgroup-storage-size",),
    "invocations_per_workgroup": ("max-compute-invocations-per-workgroup", "max-compute-workgroup-size-x"),
    "storage_buffers_per_stage": ("max-storage-buffers-per-shader-stage",),
    "workgroups_per_dimension": ("max-compute-workgroups-per-dimension",),
    "storage_buffer_binding_bytes": ("max-storage-buffer-binding-size", "max-buffer-size"),
}
# Device limits raised from the WebGPU defaults to what the adapter offers.
_RAISED_LIMITS = ("max-compute-workgroup-storage-size", "max-compute-invocations-per-workgroup",
                  "max-compute-workgroup-size-x", "max-storage-buffer-binding-size", "max-buffer-size",
                  "max-storage-buffers-per-shader-stage")
# Mesa's llvmpipe (the CPU driver behind lavapipe, what CI runs WGSL on) ends every loop of a
# shader invocation, silently, once the invocation's loops have run this many iterations in
# total (gallivm's LP_MAX_TGSI_LOOP_ITERATIONS, "shared between every loop"; seen on Mesa
# 22.3). Loops the driver unrolls do not count. A kernel's loop over K/V tiles runs about
# 70 (head dim 64) to 260 (head dim 256), ~700 at 1024 (d-chunks), counted iterations per
# tile there, so rows that see more than roughly 1.5k-15k keys would come out wrong. The kernels
# detect it (their main loop ends with an empty pass that a cut-short loop never reaches, and
# then they store nothing);
# on such an adapter the runtime fills `out` with a sentinel NaN before the dispatch, checks
# afterwards that every element was written, and refuses with a LaunchError otherwise.
LLVMPIPE_LOOP_BUDGET = 65535
_SENTINEL = {"f16": (np.uint16, 0x7E5A), "f32": (np.uint32, 0x7FC0DEAD)}  # quiet NaNs, odd payloads

_PROBE_SIZE = 256  # invocations of the subgroup probe's workgroup
_PROBE_WGSL = """
// Per invocation: [0] 1 if subgroup_invocation_id != local_invocation_index % subgroup_size,
// [1] 1 if subgroupShuffleXor(lid, 1) != lid ^ 1, [2] subgroup_size.
@group(0) @binding(0) var<storage, read_write> result: array<u32>;

@compute @workgroup_size(256, 1, 1)
fn probe(@builtin(local_invocation_index) lid: u32, @builtin(subgroup_invocation_id) sid: u32,
         @builtin(subgroup_size) size: u32) {
    let other = subgroupShuffleXor(lid, 1u);
    result[3u * lid] = select(0u, 1u, sid != lid % size);
    result[3u * lid + 1u] = select(0u, 1u, size >= 2u && other != (lid ^ 1u));
    result[3u * lid + 2u] = size;
}
"""


@dataclass(frozen=True)
class WgslTensor:
    """A tensor already in a wgpu buffer of this module's `device()`: contiguous, row-major.

    dtype is "f16" or "f32"; the buffer needs STORAGE usage (and COPY_SRC to be read back
    with `numpy()`), and at least prod(shape) elements (f16 buffers padded to 4 bytes).
    """

    buffer: object  # wgpu.GPUBuffer
    shape: tuple
    dtype: str

    @classmethod
    def from_numpy(cls, array, usage=None) -> "WgslTensor":
        """Upload a float16 / float32 numpy array (any strides) to a new buffer on `device()`."""
        a = np.ascontiguousarray(array)
        dtype = _dtype_name(a)
        if dtype not in _NP_DTYPES:
            raise LaunchError(f"WgslTensor holds f16 or f32, not {a.dtype}")
        raw = a.tobytes()
        raw += b"\0" * (_padded(len(raw)) - len(raw))  # f16: padded to 4 bytes
        if usage is None:
            usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        return cls(device().create_buffer_with_data(data=raw, usage=usage), tuple(a.shape), dtype)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * _DTYPE_BYTES[self.dtype]

    def numpy(self) -> np.ndarray:
        data = device().queue.read_buffer(self.buffer, size=_padded(self.nbytes)) if self.nbytes else b""
        return np.frombuffer(data, dtype=_NP_DTYPES[self.dtype], count=self.nbytes // _DTYPE_BYTES[self.dtype]
                             ).reshape(self.shape).copy()


# ---- the device ---------------------------------------------------------------------------------

class _DeviceState:
    def __init__(self):
        if wgpu is None:
            raise LaunchError("the WGSL runtime needs wgpu-py: pip install 'attngen[wgpu]' (wgpu>=0.32,<0.33)")
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        if adapter is None:
            raise LaunchError("no WebGPU adapter found (on a machine without a GPU, install a software "
                              "Vulkan driver such as Mesa's lavapipe)")
        self.adapter = adapter
        self.info = dict(adapter.info)
        wanted = [f for f in ("shader-f16", "subgroup") if f in adapter.features]
        limits = {name: adapter.limits[name] for name in _RAISED_LIMITS if name in adapter.limits}
        self.device = adapter.request_device_sync(required_features=wanted, required_limits=limits)
        self.features = set(self.device.features)
        # wgpu-py 0.32 misspells the subgroup sizes in adapter.info as "stackgroup_*".
        self.subgroup_min = self.info.get("subgroup_min_size", self.info.get("stackgroup_min_size"))
        self.subgroup_max = self.info.get("subgroup_max_size", self.info.get("stackgroup_max_size"))
        self.subgroup_problem = None  # why subgroups are not used, when the device has them
        self.subgroup_seen = ()
        who = f"{self.info.get('vendor', '')} {self.info.get('device', '')}".lower()
        self.loop_budget = LLVMPIPE_LOOP_BUDGET if "llvmpipe" in who else None
        if "subgroup" in self.features:
            self._probe_subgroups()

    def _probe_subgroups(self) -> None:
        """Check once that subgroups are what the kernels assume; else do not use them."""
        dev = self.device
        try:
            module = dev.create_shader_module(code=_PROBE_WGSL)
            pipeline = dev.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "probe"})
            buf = dev.create_buffer(size=3 * 4 * _PROBE_SIZE,
                                    usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
            group = dev.create_bind_group(layout=pipeline.get_bind_group_layout(0),
                                          entries=[{"binding": 0, "resource": {"buffer": buf}}])
            enc = dev.create_command_encoder()
            cp = enc.begin_compute_pass()
            cp.set_pipeline(pipeline)
            cp.set_bind_group(0, group)
            cp.dispatch_workgroups(1, 1, 1)
            cp.end()
            dev.queue.submit([enc.finish()])
            res = np.frombuffer(dev.queue.read_buffer(buf), dtype=np.uint32).reshape(_PROBE_SIZE, 3)
        except Exception as e:  # a driver that cannot even run the probe
            self.subgroup_problem = f"the subgroup probe failed to run ({type(e).__name__}: {e})"
            return
        sizes = sorted(set(int(x) for x in res[:, 2]))
        self.subgroup_seen = tuple(sizes)
        if res[:, 0].any():
            self.subgroup_problem = ("subgroups are not consecutive runs of local_invocation_index "
                                     "(probe), so rows cannot be reduced with subgroup shuffles")
        elif res[:, 1].any():
            self.subgroup_problem = "subgroupShuffleXor returned wrong lanes (probe)"
        elif any(s & (s - 1) or s < 1 for s in sizes):
            self.subgroup_problem = f"subgroup sizes {sizes} are not powers of two (probe)"
        elif self.subgroup_min and sizes[0] < self.subgroup_min:
            # a subgroup smaller than the reported minimum ran: trust what ran
            self.subgroup_min = sizes[0]

    @property
    def has_subgroups(self) -> bool:
        return "subgroup" in self.features and self.subgroup_problem is None

    def description(self) -> str:
        i = self.info
        return (f"{i.get('vendor', '')}/{i.get('device', '')}/{i.get('description', '')}/"
                f"{i.get('backend_type', '')}/{i.get('adapter_type', '')}/wgpu-py {wgpu.__version__}")

    def device_limit(self, profile_key: str) -> int:
        return min(int(self.device.limits[n]) for n in _LIMITS[profile_key] if n in self.device.limits)


_STATE: _DeviceState | None = None
_STATE_LOCK = threading.Lock()


def _state() -> _DeviceState:
    global _STATE
    with _STATE_LOCK:
        if _STATE is None:
            _STATE = _DeviceState()
        return _STATE


def device():
    """The process's shared wgpu device (created on first use)."""
    return _state().device


def _matches(profile: Profile, info: dict) -> bool:
    if not profile.match:
        return False
    for key, want in profile.match.items():
        have = info.get(key)
        if isinstance(want, str) and isinstance(have, str):
            if want.lower() != have.lower():
                return False
        elif have != want:
            return False
    return True


def _naga_dialect(profile: Profile) -> Profile:
    """The profile as wgpu compiles it: naga rejects `enable subgroups;` (wgpu 0.32)."""
    if not profile.dialect.get("subgroups_directive", False):
        return profile
    return replace(profile, name=f"{profile.name}@wgpu",
                   dialect={**profile.dialect, "subgroups_directive": False})


_PROFILE: Profile | None = None


def adapter_profile() -> Profile:
    """The profile of the live adapter: the matching targets/*.toml profile, narrowed to it."""
    global _PROFILE
    if _PROFILE is not None:
        return _PROFILE
    st = _state()
    matching = [p for p in profiles_for("wgsl") if _matches(p, st.info)]
    # the most specific match wins (most [match] keys), then the first by name
    base = max(matching, key=lambda p: len(p.match)) if matching else get_profile("webgpu-core", "wgsl")
    guaranteed = [f for f in ("shader-f16",) if f in st.features]
    if st.has_subgroups:
        guaranteed.append("subgroups")
    features = {"guaranteed": guaranteed, "optional": []}
    # adapters without subgroups may report sizes of 0: keep the base profile's then
    if st.subgroup_min:
        features["subgroup_min_size"] = int(st.subgroup_min)
    if st.subgroup_max:
        features["subgroup_max_size"] = int(st.subgroup_max)
    limits = {key: st.device_limit(key) for key in _LIMITS}
    name = f"{base.name}@{st.info.get('device') or st.info.get('vendor') or 'adapter'}"
    prof = base.narrowed(name=name, limits=limits, features=features)
    _PROFILE = replace(prof, dialect={**prof.dialect, "subgroups_directive": False})
    return _PROFILE


def _profile_key(p: Profile) -> str:
    return json.dumps({"name": p.name, "limits": p.limits, "features": p.features, "dialect": p.dialect,
                       "defaults": list(p.defaults), "dtypes": list(p.storage_dtypes)}, sort_keys=True)


# ---- compiling ----------------------------------------------------------------------------------

def _check_device(plan, st: _DeviceState) -> None:
    """Refuse a plan this device cannot run, naming what is missing."""
    who = f"this device ({st.info.get('device') or st.info.get('vendor')})"
    for feat in plan.features:
        if _WGPU_FEATURE[feat] not in st.features:
            raise LaunchError(f"kernel '{plan.spec.name}' needs the WebGPU feature '{feat}', which {who} "
                              "does not have")
    if plan.config.subgroups:
        if st.subgroup_problem is not None:
            raise LaunchError(f"kernel '{plan.spec.name}' uses subgroups, but on {who} {st.subgroup_problem}; "
                              "build it with target wgsl { subgroups=off } or for the adapter's profile")
        if st.subgroup_min and plan.config.threads_per_row > st.subgroup_min:
            raise LaunchError(f"kernel '{plan.spec.name}' reduces {plan.config.threads_per_row} invocations "
                              f"per row with subgroup shuffles, but {who} guarantees subgroups of only "
                              f"{st.subgroup_min}")
    for value, key, what in ((plan.smem_bytes, "workgroup_storage_bytes", "bytes of workgroup memory"),
                             (plan.threads, "invocations_per_workgroup", "invocations per workgroup")):
        limit = st.device_limit(key)
        if value > limit:
            raise LaunchError(f"kernel '{plan.spec.name}' needs {value} {what}, but {who} allows {limit}")


def _layout(params, dev):
    """The bind group layout of one entry point: exactly its bindings (docs: wgsl_plan.py)."""
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


def compile_kernel(spec: AttentionSpec, profile: Profile | str | None = None) -> "WgslKernel":
    """Plan, emit and compile `spec` for the live device (profile None = the adapter's profile)."""
    st = _state()
    if profile is None:
        prof = adapter_profile()
    else:
        prof = profile if isinstance(profile, Profile) else get_profile(profile, "wgsl")
        if prof.target != "wgsl":
            raise ProfileError(f"profile '{prof.name}' is for target {prof.target}, not wgsl")
        prof = _naga_dialect(prof)
    plan = make_plan(spec, "wgsl", prof)
    _check_device(plan, st)
    key = (plan.spec_text, _profile_key(prof), generator_version())
    with _PIPELINES_LOCK:
        hit = _PIPELINES.get(key)
    if hit is not None:
        return WgslKernel(*hit, st)

    # The source is always emitted afresh (it is cheap, and a disk copy could go stale behind
    # the template digest); the disk cache keeps a record of it and its manifest once it compiles.
    em = emit_plan(plan)
    source = em.source
    disk_key = cache_key(spec=plan.spec_text, generator=generator_version(), target="wgsl",
                         adapter=st.description(), profile=_profile_key(prof))

    dev = st.device
    try:
        module = dev.create_shader_module(label=plan.entry, code=source)
        # one pipeline per entry point, in dispatch order, each with a layout of its own bindings
        pipeline = []
        for role, entry, params, grid in [("attention", plan.entry, plan.params, plan.grid)] + [
                (e.name, e.entry, e.params, e.grid) for e in plan.entries]:
            bgl = _layout(params, dev)
            pipeline.append((role, dev.create_compute_pipeline(
                label=entry, layout=dev.create_pipeline_layout(bind_group_layouts=[bgl]),
                compute={"module": module, "entry_point": entry}), bgl, params, grid))
        pipeline = tuple(pipeline)
        layout = pipeline[0][2]
    except wgpu.GPUError as e:
        raise CompileError(f"wgpu rejected the generated WGSL of kernel '{spec.name}' (profile {prof.name}); "
                           f"this is a bug in attngen, please report it with the spec:\n{e}") from None
    cached(disk_key, ".wgsl", lambda: source.encode())
    cached(disk_key, ".json", lambda: json.dumps(em.manifest, indent=2, sort_keys=True).encode())
    with _PIPELINES_LOCK:
        _PIPELINES[key] = (em, pipeline, layout, prof)
    return WgslKernel(em, pipeline, layout, prof, st)


# ---- launching ----------------------------------------------------------------------------------

def _padded(nbytes: int) -> int:
    """WebGPU buffer and binding sizes: a multiple of 4 bytes, at least 4."""
    return max(4, -(-nbytes // 4) * 4)


def _sentinel_bytes(dtype: str, nbytes: int) -> bytes:
    """A buffer of `nbytes` (padded) filled with the dtype's sentinel NaN."""
    bits_type, sentinel = _SENTINEL[dtype]
    n = _padded(nbytes) // np.dtype(bits_type).itemsize
    return np.full(n, sentinel, dtype=bits_type).tobytes()


def _as_input(name: str, x):
    """A numpy array (contiguous) or a WgslTensor; anything else is a LaunchError."""
    if isinstance(x, WgslTensor):
        if x.dtype not in _NP_DTYPES:
            raise LaunchError(f"{name} is a WgslTensor of dtype {x.dtype!r}; WGSL kernels take f16 or f32")
        shape = tuple(x.shape) if isinstance(x.shape, (tuple, list)) else None
        if shape is None or not all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 0
                                    for n in shape):
            raise LaunchError(f"{name} is a WgslTensor whose shape {x.shape!r} is not a tuple of "
                              "non-negative integers")
        return x
    if wgpu is not None and isinstance(x, wgpu.GPUBuffer):
        raise LaunchError(f"{name} is a bare wgpu buffer: wrap it as WgslTensor(buffer, shape, dtype) so its "
                          "shape and dtype are known")
    if not isinstance(x, np.ndarray):
        if not hasattr(x, "__array__"):
            raise LaunchError(f"{name} must be a numpy array or a WgslTensor, not {type(x).__name__}")
        x = np.asarray(x)
    return x


def _dtype_name(x) -> str:
    if isinstance(x, WgslTensor):
        return x.dtype
    for name, np_dtype in _NP_DTYPES.items():
        if x.dtype == np_dtype:
            return name
    return str(x.dtype)


class WgslKernel(Kernel):
    """A compiled WGSL kernel: call it with q, k, v (numpy arrays or WgslTensor)."""

    target = "wgsl"

    def __init__(self, emitted: Emitted, pipeline, layout, profile: Profile, state: _DeviceState):
        super().__init__(emitted)
        self.profile = profile  # what the kernel was planned for
        # (role, pipeline, bind group layout, params, grid) of each entry point, in dispatch order
        self._pipes = pipeline
        self._layout = layout
        self._state = state

    def __repr__(self) -> str:
        text = super().__repr__()
        st = self._state
        if "subgroup" in st.features and st.subgroup_problem is not None:
            text = text[:-1] + f"; subgroups not used: {st.subgroup_problem}>"
        return text

    # -- inputs -------------------------------------------------------------------------------
    def _buffer(self, name: str, x, limit: int):
        st = self._state
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
        raw += b"\0" * (_padded(len(raw)) - len(raw))  # f16 buffers: padded to 4 bytes
        return st.device.create_buffer_with_data(data=raw, usage=wgpu.BufferUsage.STORAGE)

    def _check_out(self, out, shape, dtype: str):
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
        if out.shape != shape or out.dtype != _NP_DTYPES[dtype]:
            raise LaunchError(f"out has shape {out.shape} and dtype {out.dtype}, but this call writes "
                              f"{shape} {np.dtype(_NP_DTYPES[dtype])}")
        if not out.flags.writeable:
            raise LaunchError("out is read-only")

    # -- the call ---------------------------------------------------------------------------------
    def __call__(self, q, k, v, *, mask=None, kv_lens=None, cu_seqlens_q=None, cu_seqlens_k=None,
                 block_table=None, k_new=None, v_new=None, return_lse: bool = False, out=None):
        """out in the spec's dtype, and lse f32 with return_lse; layouts and options as in
        docs/variants.md (runtime/wgsl_launch.py does the work).

        Results are numpy arrays, or WgslTensor when q, k and v are all WgslTensor (nothing is
        read back then); `out=` (numpy array or WgslTensor of the right shape and dtype) is
        written into and returned. k_new / v_new are appended to k and v in place.
        """
        from .wgsl_launch import call
        return call(self, q, k, v, mask=mask, kv_lens=kv_lens, cu_seqlens_q=cu_seqlens_q,
                    cu_seqlens_k=cu_seqlens_k, block_table=block_table, k_new=k_new, v_new=v_new,
                    return_lse=return_lse, out=out)

    def block_mask(self, mask):
        """A BlockMask of `mask` (numpy bool or additive float) for this kernel, built on the GPU."""
        from .wgsl_blockmask import build_block_mask
        return build_block_mask(self, mask)

    def _sentinel_of(self):
        return _SENTINEL[self.plan.dtype]

    def _budget_error(self, len_k: int, what: str) -> LaunchError:
        name = self._state.info.get("device") or "llvmpipe"
        return LaunchError(
            f"kernel '{self.spec.name}' with Lk={len_k}: the software adapter {name} (Mesa's "
            f"llvmpipe) stops all loops of a shader after {self._state.loop_budget} iterations in total, "
            f"and this launch needed more ({what}); nothing was returned. Use shorter key sequences "
            "on this adapter, or a hardware one")

    def _limit(self, key: str) -> int:
        """The smaller of the profile's and the device's limit."""
        return min(self.profile.limit(key), self._state.device_limit(key))

    def _binding_limit(self) -> int:
        return self._limit("storage_buffer_binding_bytes")
