"""The CUDA kernels' launches with no Python work that can be done once (docs/cuda-calls.md).

A call is checked once per *signature* (the shapes, strides, dtypes, devices and alignment of
its tensors, the shapes of its device integer inputs, its options); what the checks produce is
a `Recipe`: the entry points with their grids and their parameter buffers packed as the CUDA
ABI lays them out, every scalar filled in, the tensors' addresses left as slots. Every later
call with the same signature takes its tensors' addresses, allocates the output (and one
workspace buffer), writes the slots and launches through the driver (cuLaunchKernel).

Integer inputs on the device are never read here (no device-to-host copy, no synchronisation):
the kernels check them and write what they find into `ErrorFlags`, page-locked host memory
the GPU writes directly; every attngen call reads it first and raises what an earlier launch
found as a LaunchError, and `check=True` synchronises and raises at once. Expression inputs'
reads out of bounds (issue 42) are reported the same way, in word EXPR_WORD.
"""

from __future__ import annotations

import ctypes
import struct
import threading

import numpy as np

from ...errors import LaunchError
from .expr import ERROR_WORD as EXPR_WORD  # the word of expressions' reads out of an input's bounds
from .tensor_maps import MAP_ALIGN, MAP_BYTES

ERROR_WORDS = 10  # the kernels' `errors` parameter (lower.py): one int32 word per kind of input (4: expressions)
_ERROR_KINDS = (
    ("cu_seqlens_q", "cu_seqlens_q[{b}] .. [{b1}] is not a sequence inside q (entries must start at 0 or more, "
                     "not decrease, end within q's rows and, with cu_seqlens_k absent, within k's), or it is "
                     "longer than max_seqlen_q / max_seqlen_k"),
    ("cu_seqlens_k", "cu_seqlens_k[{b}] .. [{b1}] is not a sequence inside k and v (entries must start at 0 or "
                     "more, not decrease and end within k's rows), or it is longer than max_seqlen_k"),
    ("kv_lens", "kv_lens[{b}] is negative or, with the rows appended in the call, more than the cache holds "
                "(its rows: k.shape[1], or block_table columns x page)"),
    ("block_table", "block_table row {b} names a page outside k and v, or (with k_new / v_new) a page that the "
                    "append writes and the row also reads elsewhere"),
)
# words 8 and 9: a quantized cache's (kv_dtype, kvquant.py): a scale on the device that is not finite
# and >= 0, and inf or NaN appended to an i8 cache; the sequence's index + 1 (lower.py's _bounds)
_KV_WORDS = (
    (8, "k_scale or v_scale holds a value that is not finite and >= 0 for sequence {b} (a quantized cache's "
        "scales on the GPU are checked by the kernels; that call's output is not to be used)"),
    (9, "k_new / v_new of sequence {b} hold inf or NaN, which an i8 cache cannot store (their blocks of 32 were "
        "stored with scale NaN)"),
)
# words 5-7: FP8's descales on the device, checked by the _prepare_v entry (fp8.py, DESCALE_WORDS):
# the flat index + 1 of a bad one
_DESCALE_WORDS = ((5, "q_descale"), (6, "k_descale"), (7, "v_descale"))
_FLAGS: dict = {}  # device -> ErrorFlags
_FLAGS_LOCK = threading.Lock()
# What a value of word EXPR_WORD means: kernels of this process pass expr_site0 (register_sites), so
# that whichever call reads the flag names the kernel and the read.
_EXPR_SITES: list = [""]


def register_sites(messages: list) -> int:
    """The expr_site0 of a kernel whose expressions' input reads (site 1, 2, ...) report `messages`."""
    with _FLAGS_LOCK:
        base = len(_EXPR_SITES) - 1
        _EXPR_SITES.extend(messages)
    return base


class ErrorFlags:
    """ERROR_WORDS int32 in page-locked host memory that the kernels of one GPU write (a word is
    the index + 1 of a sequence with bad inputs of that kind; 0: none)."""

    def __init__(self, cupy, device: int):
        with cupy.cuda.Device(device):
            self._mem = cupy.cuda.alloc_pinned_memory(4 * ERROR_WORDS)
        self.words = np.frombuffer(self._mem, np.int32, ERROR_WORDS)
        self.words[:] = 0
        self._bytes = memoryview(self.words).cast("B")  # read without numpy's per-call cost
        self.ptr = self._mem.ptr  # with unified addressing the GPU uses the host address
        self.device = device

    def found(self) -> bool:
        return self._bytes.tobytes() != _CLEAR

    def raise_found(self, when: str):
        """Raise (and clear) what the kernels reported; nothing when the words are zero."""
        if not self.found():
            return
        found = [text.format(b=int(w) - 1, b1=int(w)) for (_, text), w in zip(_ERROR_KINDS, self.words) if w > 0]
        found += [f"{name}.ravel()[{int(self.words[at]) - 1}] (flat over (B, Hkv)) is 0, negative, inf or NaN: descales "
                  "are finite and > 0" for at, name in _DESCALE_WORDS if self.words[at] > 0]
        found += [text.format(b=int(self.words[at]) - 1) for at, text in _KV_WORDS if self.words[at] > 0]
        site = int(self.words[EXPR_WORD])
        what = "inputs" if self.words[5:].any() else "integer inputs"
        self.words[:] = 0
        if site > 0:
            read = _EXPR_SITES[site] if site < len(_EXPR_SITES) else f"an expression read an input out of its bounds " \
                                                                       f"(site {site})"
            if not found:
                raise LaunchError(f"GPU {self.device}: {when} found that {read}")
            found.append(read)
        raise LaunchError(f"GPU {self.device}: {when} found bad {what} "
                          "(checked on the device): " + "; ".join(found))


_CLEAR = bytes(4 * ERROR_WORDS)


def error_flags(cupy, device: int) -> ErrorFlags:
    flags = _FLAGS.get(device)
    if flags is None:
        with _FLAGS_LOCK:
            flags = _FLAGS.get(device)
            if flags is None:
                flags = _FLAGS[device] = ErrorFlags(cupy, device)
                _FLAG_LIST.append(flags)
    return flags


_FLAG_LIST: list = []  # the ErrorFlags of every GPU, for pending()


def pending() -> bool:
    """Whether a kernel reported bad inputs that no call has raised yet (cheap: every call asks)."""
    for flags in _FLAG_LIST:
        if flags.found():
            return True
    return False


def raise_pending():
    """Raise what a kernel launched by an earlier call reported (every GPU attngen used)."""
    for flags in list(_FLAG_LIST):
        flags.raise_found("a kernel launched by an earlier attngen call")


_FORMATS = {"i64": "q", "i32": "i"}


class Packed:
    """One entry point's launch: its grid and its parameter buffer (native C layout, as the CUDA
    ABI passes kernel parameters) with the tensors' addresses as slots. A tensor-map parameter
    (the Hopper family's tensor copy engine: backends/cuda/tensor_maps.py) takes its value from a
    TensorMapEncoder in `values` (its 128 bytes re-encoded when its tensor's address changes), or
    128 zero bytes where the entry point does not read it."""

    def __init__(self, fn, grid: tuple, threads: int, smem: int, params, values: dict, slots: frozenset):
        self.fn = fn  # keeps the loaded function (and its module) alive
        self.fn_ptr = fn.ptr
        self.grid, self.threads, self.smem = tuple(int(g) for g in grid), int(threads), int(smem)
        fmt, template, self.slots = "@", [], []
        where = []  # per parameter: ("s", index of its struct field) or ("m", index of its tensor map)
        maps = []  # TensorMapEncoder or None, per tensor-map parameter
        for p in params:
            if p.kind == "tensor_map":
                where.append(("m", len(maps)))
                maps.append(values.get(p.name))
                continue
            where.append(("s", len(template)))
            if p.kind == "scalar":
                fmt += _FORMATS[p.dtype]
                template.append(int(values[p.name]))
                continue
            fmt += "Q"
            if p.name in slots:
                self.slots.append((len(template), p.name))
                template.append(0)
                continue
            x = values.get(p.name)
            if x is None and not p.optional:
                raise AssertionError(f"kernel parameter {p.name} may not be null")  # a bug in attngen
            template.append(0 if x is None else int(x))
        self.struct = struct.Struct(fmt)
        offsets, off = [], 0
        for c in fmt[1:]:  # each parameter at the next multiple of its size, as in a C struct
            size = struct.calcsize(c)
            off = -(-off // size) * size
            offsets.append(off)
            off += size
        assert off == self.struct.size
        map_at = []  # the tensor maps after the struct (which pack_into rewrites), 64-byte aligned
        for _ in maps:
            off = -(-off // MAP_ALIGN) * MAP_ALIGN
            map_at.append(off)
            off += MAP_BYTES
        self.buffer = np.zeros(max(off, 8) + MAP_ALIGN, np.uint8)
        base = self.buffer.ctypes.data
        base += -base % MAP_ALIGN
        self.params = np.array([base + (offsets[i] if k == "s" else map_at[i]) for k, i in where], np.uint64)
        # the fixed values are packed once; a launch writes only the slots (addresses: 8-byte
        # words at 8-byte aligned offsets) through a ctypes view of the parameter words
        self.struct.pack_into(self.buffer, base - self.buffer.ctypes.data, *template)
        self.words = (ctypes.c_uint64 * (-(-self.struct.size // 8))).from_address(base)  # in self.buffer
        self.slot_words = tuple((offsets[i] // 8, name) for i, name in self.slots)
        assert all(offsets[i] % 8 == 0 for i, _ in self.slots)
        self.params_ptr = self.params.ctypes.data
        self.start = base - self.buffer.ctypes.data  # where the parameters start in the buffer (64-byte aligned)
        # (destination, encoder, the address its bytes there were encoded for)
        self.maps = [[base + at, enc, None] for at, enc in zip(map_at, maps) if enc is not None]
        self.lock = threading.Lock()

    def launch(self, driver, ptrs: dict, stream: int):
        get, words = ptrs.get, self.words
        gx, gy, gz = self.grid
        with self.lock:  # the buffer is copied by the driver at the launch
            for at, name in self.slot_words:
                words[at] = get(name) or 0
            for m in self.maps:
                ptr = ptrs.get(m[1].source) or 0
                if ptr != m[2]:
                    ctypes.memmove(m[0], m[1].encode(ptr), MAP_BYTES)
                    m[2] = ptr
            driver.launchKernel(self.fn_ptr, gx, gy, gz, self.threads, 1, 1, self.smem, stream, self.params_ptr, 0)


class Recipe:
    """What a call of one signature launches (see the module docstring)."""

    def __init__(self, launches: list, workspaces: list, ws_bytes: int, *, device: int, kind: str, cacheable: bool,
                 extents: dict, out_extent: tuple, alloc_out, alloc_lse, alloc_ws, stream, persistent=None,
                 zeros=None):
        self.launches = launches
        self.workspaces, self.ws_bytes = workspaces, ws_bytes  # [(name, byte offset)], total
        self.persistent = persistent or {}  # {name: 32-bit words}: zeroed buffers kept per stream (ZEROED)
        self.zeros = zeros  # makes such a buffer in the caller's framework
        self.device, self.kind = device, kind  # the GPU, and the framework outputs come from
        self.cacheable = cacheable  # False: the call copied inputs or read host arrays (not kept)
        self.extents, self.out_extent = extents, out_extent  # bytes [lo, hi) around each address
        # allocate out / lse / the workspace buffer; the handle of the caller's current stream
        self.alloc_out, self.alloc_lse, self.alloc_ws, self.stream = alloc_out, alloc_lse, alloc_ws, stream

    def check_out_overlap(self, out_ptr: int, ptrs: dict):
        """A given out= must not overlap an input (the kernel would read what it writes)."""
        o0, o1 = out_ptr + self.out_extent[0], out_ptr + self.out_extent[1]
        for name, (lo, hi) in self.extents.items():
            p = ptrs[name]
            if o0 < p + hi and p + lo < o1:
                raise LaunchError(f"out overlaps {name} in memory: the kernel reads {name} while it writes "
                                  "out, so the result would be wrong; pass a separate out=")


class ZeroedBuffers:
    """The persistent workspaces (the fused combine's tile counters): one zeroed buffer of 32-bit
    words per (GPU, stream, framework), grown when a call needs more. Every launch leaves its
    words at zero (the last split block of a row tile resets its counter), and launches on one
    stream run in order, so a stream's eager calls share its buffer.

    A call captured into a CUDA graph never shares it: it gets a buffer of its own, zeroed by a
    fill that is part of the graph (so it runs at each replay), kept for as long as the process
    runs (a graph may be replayed at any time, on any stream; the caller cannot tell attngen when
    it is gone). Sharing the stream's buffer was wrong twice over: a replay on another stream would
    race the eager calls for the counters, and a buffer made after a capture could be carved from
    memory the graph still writes (the graph-replay flake: benchmarks/NOTES.md, 2026-11-27, fourth
    session)."""

    def __init__(self):
        self._by_stream: dict = {}
        self._captured: list = []
        self._lock = threading.Lock()

    def get(self, kind: str, device: int, stream: int, words: int, zeros, captured: bool = False) -> int:
        """The address of at least `words` zeroed words for launches on `stream`; `zeros(n)` makes
        a zeroed array of n int32 in the caller's framework, on the caller's current stream;
        `captured`: the call is being captured into a CUDA graph (capturing())."""
        key = (kind, device, stream)
        buf = None if captured else self._by_stream.get(key)
        if buf is not None and buf[1] >= words:
            return buf[0]
        with self._lock:
            arr = zeros(max(words, 2 * buf[1] if buf is not None else 0))
            n = int(arr.numel() if hasattr(arr, "numel") else arr.size)
            ptr = int(arr.data_ptr() if hasattr(arr, "data_ptr") else arr.data.ptr)
            if captured:
                self._captured.append(arr)
            else:
                # the old buffer's launches ran on this stream, before anything allocated later
                # (no graph holds it: captures never share a stream's buffer)
                self._by_stream[key] = (ptr, n, arr)
            return ptr


# What captured calls took from CuPy's pool (workspaces, copies of inputs): their graphs' replays
# use it for as long as the process runs (runtime.CudaKernel._run; docs/cuda-calls.md, "CUDA graphs").
KEPT_FOR_GRAPHS: list = []


def capturing(stream: int) -> bool:
    """Whether `stream` is being captured into a CUDA graph (the driver's cuStreamIsCapturing). A
    query that fails (e.g. the legacy stream while another thread captures in global mode) counts
    as capturing: the call's buffers are then its own and kept, which costs memory, where the
    other answer could let a graph write into memory handed on."""
    if not _DRIVER:
        try:
            _DRIVER.append(ctypes.CDLL("libcuda.so.1"))
        except OSError:
            _DRIVER.append(None)
    if _DRIVER[0] is None:
        return False
    status = ctypes.c_int(0)
    err = _DRIVER[0].cuStreamIsCapturing(ctypes.c_void_p(stream), ctypes.byref(status))
    return err != 0 or status.value != 0


_DRIVER: list = []
ZEROED = ZeroedBuffers()


def workspace_layout(sizes: dict) -> tuple[list, int]:
    """One f32 buffer for the split workspaces ({name: bytes}, args.workspace_bytes): [(name,
    byte offset)] (256-byte aligned), bytes."""
    out, off = [], 0
    for name, n in sizes.items():
        out.append((name, off))
        off += -(-max(n, 4) // 256) * 256
    return out, off


__all__ = ["ERROR_WORDS", "ErrorFlags", "KEPT_FOR_GRAPHS", "Packed", "Recipe", "ZEROED", "ZeroedBuffers", "capturing",
           "error_flags", "pending", "raise_pending", "workspace_layout"]
