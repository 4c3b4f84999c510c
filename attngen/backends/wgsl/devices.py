"""The WGSL runtime's device: the process's wgpu device, the live adapter's profile, and
WgslTensor, a tensor already in a GPU buffer (wgpu-py 0.32).

    from attngen.backends.wgsl import WgslTensor, device
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
Kernels are compiled by the runtime's compiler whatever profile they are planned for, so the
runtime plans with its dialect: wgpu-py's naga rejects `enable subgroups;`, Dawn's Tint
(ATTNGEN_WGPU=wgpudawn) requires it; a named profile whose dialect differs is renamed
NAME@wgpu / NAME@dawn so that its source is not mistaken for the other one. On Dawn the
runtime sets the toggles of DAWN_TOGGLES before its first adapter (shader-f16 on NVIDIA's Vulkan,
the experimental subgroup-matrix feature), and the adapter's profile lists its subgroup-matrix
configs (matrix.py); a profile's [match] may name the runtime (`runtime = "wgpudawn"`).

Software adapters. Mesa's llvmpipe (lavapipe) silently ends all loops of a shader after 65535
iterations in total, which rows with very many keys exceed; on that adapter every launch is
checked and refused with a LaunchError rather than answered wrongly (see LLVMPIPE_LOOP_BUDGET).

XDG_RUNTIME_DIR. Mesa's Vulkan device-selection layer (VK_LAYER_MESA_device_select, loaded by
the Vulkan loader for every instance wgpu creates) asks the Wayland compositor for the default
GPU with wl_display_connect(), and libwayland-client prints "error: XDG_RUNTIME_DIR is invalid
or not set in the environment." when that variable is unset or not an absolute path -- once
per instance, twice per run. The device needs no compositor, so when XDG_RUNTIME_DIR is not an
existing absolute directory, `quiet_wayland()` points it at a private temporary directory (mode
0700, removed at exit) before the adapter is requested: the connection then fails quietly
(no socket) and nothing else changes. A valid XDG_RUNTIME_DIR is left as it is.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, replace

import numpy as np

from ...errors import LaunchError
from ...plan.profiles import Profile
from .matrix import FEATURE as MATRIX_FEATURE

# The WebGPU implementation the runtime drives, chosen by $ATTNGEN_WGPU: "wgpu" (wgpu-py: naga
# compiles the WGSL; the default) or "wgpudawn" (Dawn, the WebGPU of Chrome: Tint compiles it,
# with the same Python API). The equivalence suite runs the WGSL tests on both (scripts/test.sh).
RUNTIMES = ("wgpu", "wgpudawn")
RUNTIME = os.environ.get("ATTNGEN_WGPU", "").strip() or "wgpu"
_RUNTIME_PROBLEM = None
wgpu = None
if RUNTIME not in RUNTIMES:
    _RUNTIME_PROBLEM = f"ATTNGEN_WGPU={RUNTIME!r} is not a WGSL runtime attngen drives (one of: {', '.join(RUNTIMES)})"
else:
    try:
        wgpu = __import__(RUNTIME)
    except ImportError:  # reported when a device is asked for
        pass
DAWN = RUNTIME == "wgpudawn"


def _missing_runtime() -> str:
    """Why there is no WebGPU runtime, and the command that installs it."""
    if _RUNTIME_PROBLEM:
        return _RUNTIME_PROBLEM
    if RUNTIME == "wgpudawn":
        return "ATTNGEN_WGPU=wgpudawn needs Dawn for Python: pip install 'wgpudawn>=0.32,<0.33'"
    return "the WGSL runtime needs wgpu-py: pip install 'wgpu>=0.32,<0.33'"


# numpy dtype <-> attngen storage dtype
NP_DTYPES = {"f16": np.float16, "f32": np.float32}
DTYPE_BYTES = {"f16": 2, "f32": 4}
# What a WgslTensor may hold: the storage dtypes, and a quantized cache's stored bytes (`kv_dtype`,
# issue 44: uint8 FP8 patterns, int8), named as numpy names them (the names resolve() checks k and v by)
TENSOR_DTYPES = {**NP_DTYPES, "uint8": np.uint8, "int8": np.int8}
# WebGPU feature names in plans and manifests -> the runtime's names for them (wgpu-py 0.32 says
# "subgroup", Dawn "subgroups").
WGPU_FEATURE = {"shader-f16": "shader-f16", "subgroups": "subgroups" if DAWN else "subgroup",
                MATRIX_FEATURE: MATRIX_FEATURE}
_SUBGROUP = WGPU_FEATURE["subgroups"]
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
# on such an adapter the runtime fills `out` and `lse` with sentinel NaNs before the dispatch,
# checks afterwards that every row was written, and refuses with a LaunchError otherwise
# (launch.py, _check_written; docs/wgsl-variants.md "Software adapters" says why both).
LLVMPIPE_LOOP_BUDGET = 65535
# out's "not written" marker: quiet NaNs with odd payloads. An input NaN can carry the same bits
# to out (a NaN in V reaches it through P V with its payload), so a marker left in out is only
# a suspect: RECHECK_SENTINEL, a second payload, tells the two apart (launch.py).
SENTINEL = {"f16": (np.uint16, 0x7E5A), "f32": (np.uint32, 0x7FC0DEAD)}
RECHECK_SENTINEL = {"f16": (np.uint16, 0x7E3C), "f32": (np.uint32, 0x7FC0BEEF)}
# lse's marker (f32 bits; the split workspaces' WORKSPACE_FILL, for the same reason): the kernels
# store in lse only a finite value, -inf, or their own NaN (NAN_BITS, 0x7fc00000, selected for a
# row that saw a NaN or +inf score, whose bits never come from an input); lse depends on the
# scores only, never on V. So no input can leave these bits in a row's lse that was written.
LSE_SENTINEL = 0x7FC0DEAD

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

    dtype is "f16" or "f32", or "uint8" / "int8" for a quantized KV cache's stored bytes (`kv_dtype`:
    the cache stays on the GPU across calls like an f16 one; its f32 scales are "f32" tensors); the
    buffer needs STORAGE usage (and COPY_SRC to be read back with `numpy()`), and at least
    prod(shape) elements (buffers padded to 4 bytes).
    """

    buffer: object  # wgpu.GPUBuffer
    shape: tuple
    dtype: str

    def __post_init__(self):
        if not (hasattr(self.buffer, "size") and hasattr(self.buffer, "usage")):
            raise LaunchError(f"WgslTensor's buffer must be a wgpu buffer (GPUBuffer), not "
                              f"{type(self.buffer).__name__}; WgslTensor.from_numpy(array) uploads an array")
        try:
            shape = tuple(int(n) for n in self.shape)
            ok = all(n >= 0 for n in shape) and all(int(n) == n for n in self.shape)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise LaunchError(f"WgslTensor's shape must be a tuple of non-negative integers, got {self.shape!r}")
        if self.dtype not in TENSOR_DTYPES:
            raise LaunchError(f"WgslTensor's dtype must be one of {', '.join(TENSOR_DTYPES)}, got {self.dtype!r}")
        object.__setattr__(self, "shape", shape)

    @classmethod
    def from_numpy(cls, array, usage=None) -> "WgslTensor":
        """Upload a float16 / float32 numpy array, or a quantized cache's uint8 / int8 bytes (any
        strides), to a new buffer on `device()`."""
        a = np.ascontiguousarray(array)
        dtype = dtype_name(a)
        if dtype not in TENSOR_DTYPES:
            raise LaunchError(f"WgslTensor holds f16 or f32 (or a quantized cache's uint8 / int8 bytes), not {a.dtype}")
        raw = a.tobytes()
        raw += b"\0" * (padded(len(raw)) - len(raw))  # f16 and bytes: padded to 4 bytes
        if usage is None:
            usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        return cls(device().create_buffer_with_data(data=raw, usage=usage), tuple(a.shape), dtype)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(TENSOR_DTYPES[self.dtype]).itemsize

    def numpy(self) -> np.ndarray:
        data = device().queue.read_buffer(self.buffer, size=padded(self.nbytes)) if self.nbytes else b""
        np_dtype = np.dtype(TENSOR_DTYPES[self.dtype])
        return np.frombuffer(data, dtype=np_dtype, count=self.nbytes // np_dtype.itemsize).reshape(self.shape).copy()


# ---- the device ---------------------------------------------------------------------------------

def quiet_wayland() -> None:
    """Give the process a valid XDG_RUNTIME_DIR (a private temporary directory) when it has
    none, so that libwayland-client, called by Mesa's device-selection layer, does not print
    its complaint (module docstring)."""
    current = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(current) and os.path.isdir(current):
        return
    try:
        path = tempfile.mkdtemp(prefix="attngen-xdg-runtime-")  # mode 0700
    except OSError:
        return  # no temporary directory: the complaint is only noise
    os.environ["XDG_RUNTIME_DIR"] = path
    atexit.register(shutil.rmtree, path, True)


# Dawn's toggles the runtime sets before its first adapter (wgpudawn only): `allow_unsafe_apis`
# exposes the experimental `chromium-experimental-subgroup-matrix` feature, and
# `vulkan_enable_f16_on_nvidia` shader-f16 on NVIDIA's Vulkan driver, which Dawn hides by default
# (with it, the H100 offers f16 subgroup matrices: targets/dawn-vulkan-nvidia.toml). On other
# adapters the f16 toggle changes nothing.
DAWN_TOGGLES = ("allow_unsafe_apis", "vulkan_enable_f16_on_nvidia")


def dawn_toggles() -> str | None:
    """Set DAWN_TOGGLES on wgpudawn's instance; None, or why they could not be set (an instance
    created before this process's first device: the adapter then keeps Dawn's defaults)."""
    try:
        from wgpudawn.backends.dawn import extras
        extras.set_instance_extras(enable_toggles=list(DAWN_TOGGLES))
    except Exception as e:  # an instance already made by the caller, or another wgpudawn
        return f"Dawn's toggles {', '.join(DAWN_TOGGLES)} were not set ({type(e).__name__}: {e})"
    return None


class _DeviceState:
    def __init__(self):
        if wgpu is None:
            raise LaunchError(_missing_runtime())
        quiet_wayland()
        problem = dawn_toggles() if DAWN else None
        if problem:
            import warnings
            warnings.warn(problem, RuntimeWarning, stacklevel=3)
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        if adapter is None:
            raise LaunchError("no WebGPU adapter found (on a machine without a GPU, install a software "
                              "Vulkan driver such as Mesa's lavapipe)")
        self.adapter = adapter
        self.info = dict(adapter.info)
        # the subgroup-matrix configs of a Dawn adapter (matrix.py; [] elsewhere)
        self.matrix_configs = self._matrix_configs(adapter)
        # timestamp-query: GPU time of the dispatches (launch.gpu_timer), where the adapter has it;
        # subgroup matrices where the adapter has configs for them
        wanted = [f for f in ("shader-f16", _SUBGROUP, "timestamp-query") if f in adapter.features]
        if self.matrix_configs:
            wanted.append(MATRIX_FEATURE)
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
        if _SUBGROUP in self.features:
            self._probe_subgroups()

    @staticmethod
    def _matrix_configs(adapter) -> list:
        """The adapter's subgroup-matrix configs as profile entries (matrix.from_adapter); [] where
        the runtime is not Dawn or the adapter lacks the feature."""
        if not DAWN or MATRIX_FEATURE not in adapter.features:
            return []
        from wgpudawn.backends.dawn import extras
        from .matrix import from_adapter
        return from_adapter(extras.get_adapter_properties(adapter).get("subgroup_matrix_configs") or [])

    def _probe_subgroups(self) -> None:
        """Check once that subgroups are what the kernels assume; else do not use them."""
        dev = self.device
        try:
            module = dev.create_shader_module(code=("enable subgroups;\n" if DAWN else "") + _PROBE_WGSL)
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
        return _SUBGROUP in self.features and self.subgroup_problem is None

    def description(self) -> str:
        i = self.info
        return (f"{i.get('vendor', '')}/{i.get('device', '')}/{i.get('description', '')}/"
                f"{i.get('backend_type', '')}/{i.get('adapter_type', '')}/"
                f"{'wgpudawn' if DAWN else 'wgpu-py'} {getattr(wgpu, '__version__', '?')}")

    def device_limit(self, profile_key: str) -> int:
        return min(int(self.device.limits[n]) for n in _LIMITS[profile_key] if n in self.device.limits)


_STATE: _DeviceState | None = None
_STATE_LOCK = threading.Lock()


def device_state() -> _DeviceState:
    """The process's device and what attngen learned of it (created on first use)."""
    global _STATE
    with _STATE_LOCK:
        if _STATE is None:
            _STATE = _DeviceState()
        return _STATE


def device():
    """The process's shared wgpu device (created on first use)."""
    return device_state().device


def _matches(profile: Profile, info: dict, runtime: str = RUNTIME) -> bool:
    """Whether the adapter (its info, and `runtime`: the runtime's name) has every [match] value."""
    info = {**info, "runtime": runtime}
    match = profile.section("match")
    if not match:
        return False
    for key, want in match.items():
        have = info.get(key)
        if isinstance(want, str) and isinstance(have, str):
            if want.lower() != have.lower():
                return False
        elif have != want:
            return False
    return True


# wgpu-native's WGPUShaderRuntimeChecks bits (wgpu.h) for each `[dialect] runtime_checks` mode
# (lower.RUNTIME_CHECKS); "all" takes the plain create_shader_module.
_CHECK_BITS = {"bounds": 0x1, "none": 0x0}  # BoundsChecks; ForceLoopBounding (0x2) is off in both


def record_source(code: str) -> None:
    """With ATTNGEN_WGSL_RECORD=DIR, a copy of every WGSL module the runtime compiles, as
    DIR/<sha256 of the text>.wgsl (each text once, whichever process compiles it): the sources a
    run used, to vendor them or to send them through another WGSL compiler (scripts/tint_check.py
    compiles them with Dawn's Tint; the test command does so after its first pass)."""
    folder = os.environ.get("ATTNGEN_WGSL_RECORD")
    if not folder:
        return
    import hashlib
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, hashlib.sha256(code.encode()).hexdigest()[:24] + ".wgsl")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(code)
        os.replace(tmp, path)


def create_module(dev, label: str, code: str, runtime_checks: str = "all"):
    """The shader module of `code`, keeping the runtime checks the plan asks for (its profile's
    `[dialect] runtime_checks`). wgpu-native takes the choice through
    wgpuDeviceCreateShaderModuleTrusted, which wgpu-py 0.32 does not wrap: it is called through
    wgpu-py's own cffi handles, with the same error handling as create_shader_module. Dawn
    (wgpudawn, browsers) offers no such choice and keeps its checks. Where wgpu-py lacks the
    handles (another version), the module keeps every check, with a warning: the results are
    the same, only slower. Every kernel module of the runtime is made here: once the compiler has
    taken it, it is recorded (record_source)."""
    module = _create_module(dev, label, code, runtime_checks)
    record_source(code)
    return module


def _create_module(dev, label: str, code: str, runtime_checks: str):
    if runtime_checks == "all" or DAWN:
        return dev.create_shader_module(label=label, code=code)
    try:
        return trusted_module(dev, label, code, _CHECK_BITS[runtime_checks])
    except (ImportError, AttributeError):
        import warnings
        warnings.warn(f"this wgpu-py ({getattr(wgpu, '__version__', '?')}) does not expose "
                      "wgpuDeviceCreateShaderModuleTrusted: the kernel keeps wgpu's runtime checks "
                      f"(asked: {runtime_checks})", RuntimeWarning, stacklevel=3)
        return dev.create_shader_module(label=label, code=code)


def trusted_module(dev, label: str, code: str, check_bits: int):
    """wgpuDeviceCreateShaderModuleTrusted with these WGPUShaderRuntimeChecks bits, through
    wgpu-py's cffi handles (ImportError / AttributeError where this wgpu-py has none)."""
    from wgpu.backends.wgpu_native import _api
    create = _api.libf.wgpuDeviceCreateShaderModuleTrusted
    src = _api.new_struct_p("WGPUShaderSourceWGSL *", code=_api.to_c_string_view(code))
    src[0].chain.next = _api.ffi.NULL
    src[0].chain.sType = _api.lib.WGPUSType_ShaderSourceWGSL
    desc = _api.new_struct_p("WGPUShaderModuleDescriptor *", nextInChain=_api.ffi.cast("WGPUChainedStruct *", src),
                             label=_api.to_c_string_view(label))
    handle = create(dev._internal, desc, check_bits)
    if handle == _api.ffi.NULL:
        raise RuntimeError("Shader module creation failed")
    return _api.GPUShaderModule(label, handle, dev)


def naga_dialect(profile: Profile) -> Profile:
    """The profile as the runtime's compiler takes it: naga (wgpu) rejects `enable subgroups;`
    (wgpu 0.32), Tint (Dawn) requires it before subgroup built-ins. A profile whose dialect
    differs is renamed NAME@wgpu / NAME@dawn, so that its source is not mistaken for the other."""
    want = DAWN
    if bool(profile.section("dialect").get("subgroups_directive", False)) == want:
        return profile
    return profile.narrowed(name=f"{profile.name}@{'dawn' if DAWN else 'wgpu'}",
                            sections={"dialect": {"subgroups_directive": want}})


_PROFILE: Profile | None = None
# What WebGPU guarantees of any adapter's subgroups; wgpu-py reports exactly these for every
# adapter until the native API gives the real sizes (pygfx/wgpu-py#699): they say nothing.
SPEC_SUBGROUP_RANGE = (4, 128)


def subgroup_range(reported, profile_range, matched: bool, seen=()):
    """The subgroup sizes a live adapter's plans may assume, as (min, max), or None to keep the
    profile's: what the adapter reports; but where that is only the spec's range and a profile
    matched the adapter by its [match] keys (its vendor's hardware: NVIDIA's subgroups are always
    32 wide), the profile's range; widened by any size the subgroup probe saw run."""
    mn, mx = (int(x) if x else 0 for x in reported)
    if matched and (mn, mx) == SPEC_SUBGROUP_RANGE and all(profile_range):
        mn, mx = (int(x) for x in profile_range)
    if not mn or not mx:  # adapters without subgroups may report sizes of 0: keep the profile's
        return None
    if seen:
        mn, mx = min(mn, min(seen)), max(mx, max(seen))
    return mn, mx


def adapter_profile(backend) -> Profile:
    """The profile of the live adapter: the matching targets/*.toml profile, narrowed to it
    (`backend`: the WGSL backend, which looks profiles up)."""
    global _PROFILE
    if _PROFILE is not None:
        return _PROFILE
    st = device_state()
    matching = [p for p in backend.profiles() if _matches(p, st.info)]
    # the most specific match wins (most [match] keys), then the first by name
    base = max(matching, key=lambda p: len(p.section("match"))) if matching else backend.profile("webgpu-core")
    guaranteed = [f for f in ("shader-f16",) if f in st.features]
    if st.has_subgroups:
        guaranteed.append("subgroups")
    features = {"guaranteed": guaranteed, "optional": []}
    if MATRIX_FEATURE in st.features and st.has_subgroups:
        guaranteed.append(MATRIX_FEATURE)
        features["subgroup_matrix_configs"] = st.matrix_configs  # the adapter's own, not the profile's
    rng = subgroup_range((st.subgroup_min, st.subgroup_max),
                         (base.features.get("subgroup_min_size"), base.features.get("subgroup_max_size")),
                         bool(matching), st.subgroup_seen)
    if rng is not None:
        features["subgroup_min_size"], features["subgroup_max_size"] = rng
    limits = {key: st.device_limit(key) for key in _LIMITS}
    name = f"{base.name}@{st.info.get('device') or st.info.get('vendor') or 'adapter'}"
    _PROFILE = base.narrowed(name=name, limits=limits, features=features,
                             sections={"dialect": {"subgroups_directive": DAWN}})
    return _PROFILE


# ---- buffers and inputs ----------------------------------------------------------------------------------

def padded(nbytes: int) -> int:
    """WebGPU buffer and binding sizes: a multiple of 4 bytes, at least 16 (q, k and v are bound as
    arrays of 16-byte vec4<f32> items, so even an empty tensor's binding needs one item)."""
    return max(16, -(-nbytes // 4) * 4)


def sentinel_bytes(dtype: str, nbytes: int, table: dict = SENTINEL) -> bytes:
    """A buffer of `nbytes` (padded) filled with the dtype's sentinel NaN from `table`
    (SENTINEL or RECHECK_SENTINEL)."""
    bits_type, sentinel = table[dtype]
    n = padded(nbytes) // np.dtype(bits_type).itemsize
    return np.full(n, sentinel, dtype=bits_type).tobytes()


def as_input(name: str, x):
    """A numpy array (contiguous) or a WgslTensor; anything else is a LaunchError."""
    if isinstance(x, WgslTensor):
        if x.dtype not in TENSOR_DTYPES:
            raise LaunchError(f"{name} is a WgslTensor of dtype {x.dtype!r}; WGSL kernels take f16 or f32 (and a "
                              "quantized cache's uint8 / int8 bytes)")
        shape = tuple(x.shape) if isinstance(x.shape, (tuple, list)) else None
        if shape is None or not all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 0
                                    for n in shape):
            raise LaunchError(f"{name} is a WgslTensor whose shape {x.shape!r} is not a tuple of "
                              "non-negative integers")
        return x
    if wgpu is not None and isinstance(x, getattr(wgpu, "GPUBuffer", ())):
        raise LaunchError(f"{name} is a bare wgpu buffer: wrap it as WgslTensor(buffer, shape, dtype) so its "
                          "shape and dtype are known")
    if not isinstance(x, np.ndarray):
        if not hasattr(x, "__array__"):
            raise LaunchError(f"{name} must be a numpy array or a WgslTensor, not {type(x).__name__}")
        x = np.asarray(x)
    return x


def dtype_name(x) -> str:
    if isinstance(x, WgslTensor):
        return x.dtype
    for name, np_dtype in NP_DTYPES.items():
        if x.dtype == np_dtype:
            return name
    return str(x.dtype)
