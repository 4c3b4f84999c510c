"""The probes' shared helpers (benchmarks/probes/README.md), so that no probe defines them again
and no probe imports another for them:

- the timer, the error and the FLOP count every CUDA probe prints: `median_ms` (CUDA events
  around repeated calls, triton's do_bench), `rel_err`, `attention_flops`;
- random inputs on the GPU (`randn`) and the PyTorch peers (`sdpa`: SDPA held to one backend);
- the WGSL probes' cases (probe_wgsl_checks.py, probe_wgsl_plans.py, probe_wgsl_rewrite.py,
  probe_wgsl_occupancy.py): the shapes of run_gpu.py's WGSL section (B L = 16384 tokens, H 16,
  random f16 values), by head dim, storage dtype, length and mask, each uploaded once and freed
  after its rows (`add_arguments`, `spec_text`, `cases`, `Row`).

Importing it puts benchmarks/suite/ on sys.path: some probes reuse the maintained suite's
modules (decode_grid, host, variants, wgsl_peers). torch, triton and wgpu are imported where a
helper needs them, so that a WGSL probe runs without PyTorch and a CUDA probe without wgpu.
- the A/B helpers: `with_tiles` (a profile with fields of the CUDA tile table overridden, as
  data: attngen/backends/cuda/tiles.py) and `compile_with` (a kernel compiled with a rewrite made
  to its generated source, for timing what a step costs).
"""

from __future__ import annotations

import os
import sys

import numpy as np

BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(BENCHMARKS)
SUITE = os.path.join(BENCHMARKS, "suite")
if SUITE not in sys.path:
    sys.path.append(SUITE)  # appended: its module names (host, variants) shadow nothing


# -- CUDA probes: A/B helpers ------------------------------------------------------------------

def compile_with(spec, pairs, clean=True, strict=True, profile=None):
    """attngen.compile of `spec` with each (old, new) of `pairs` replaced in its generated source
    (a timing probe: NVRTC is patched meanwhile; a pair whose text is missing stops the probe, or
    with strict=False is reported and skipped); clean=False also drops the cleaning of hidden
    keys' values; profile: a profile name (None: the default). The probes' shared helper
    (probe_persistent.py, probe_custom.py, probe_plain_clean.py, probe_paged.py); give the spec a name of its own (its cache entry)."""
    import attngen
    from attngen.backends.cuda import nvrtc
    compile_cubin = nvrtc.compile_cubin

    def patched(source, *a, **k):
        for old, new in pairs:
            if old not in source:
                if strict:
                    raise SystemExit(f"{spec.name}: nothing to rewrite for {old[:60]!r}")
                print(f"  ({spec.name}: nothing to rewrite for {old[:60]!r})")
            source = source.replace(old, new)
        return compile_cubin(source, *a, **k)
    nvrtc.compile_cubin = patched
    if not clean:
        profile = with_tiles(profile, clean_values=False)
    try:
        return attngen.compile(spec, target="cuda", profile=profile)
    finally:
        nvrtc.compile_cubin = compile_cubin


def with_tiles(profile=None, **overrides):
    """The named profile (None: this GPU's, as attngen.compile takes it) with fields of the CUDA
    tile table replaced (attngen/backends/cuda/tiles.py, CudaTiles): a probe's A/B passes its
    choices as data; the plan, and so the cache entry, differs where the source does."""
    from attngen import backends
    from attngen.backends.cuda.devices import device_profile
    backend = backends.get("cuda")
    base = device_profile(backend) if profile is None else backend.profile(profile)
    return base.with_overrides(**overrides)


# -- CUDA probes: timing, error, FLOPs, inputs, peers -----------------------------------------

def median_ms(fn, warmup: int = 25, rep: int = 100) -> float:
    """fn's GPU time in ms: triton's do_bench (CUDA events around back-to-back calls after
    `warmup` ms of calls, the L2 flushed before each), the median over `rep` ms of calls."""
    from triton.testing import do_bench
    return do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def rel_err(out, ref) -> float:
    """Relative L2 error of `out` against `ref` (torch tensors of one shape, compared in f32)."""
    out, ref = out.float(), ref.float()
    return float((out - ref).norm() / ref.norm())


def attention_flops(batch: int, heads: int, len_q: int, len_k: int, d_qk: int, d_v: int | None = None,
                    causal: bool = False) -> float:
    """2 B H Lq Lk (D_qk + D_v): Q K^T and P V, that is 4 B H L^2 D for one head dim; halved for
    causal (benchmarks/ANCHORS.md's convention, as run_gpu.py counts)."""
    flops = 2.0 * batch * heads * len_q * len_k * (d_qk + (d_qk if d_v is None else d_v))
    return flops / 2 if causal else flops


def randn(shape, dtype=None, generator=None):
    """Standard normal values of `shape` on the GPU (f16 unless `dtype` says otherwise; give a
    seeded torch.Generator on "cuda" for inputs a second run must repeat)."""
    import torch
    return torch.randn(shape, device="cuda", dtype=dtype or torch.float16, generator=generator)


def sdpa(q, k, v, backend, **kwargs):
    """PyTorch's scaled_dot_product_attention held to one backend (an SDPBackend: FLASH_ATTENTION
    is FlashAttention-2, CUDNN_ATTENTION, EFFICIENT_ATTENTION) on (B, H, L, D) tensors."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


def profiled_once(runs, warmup: int = 0) -> None:
    """Each (name, fn) of `runs` once inside Nsight Compute's profiled range
    (torch.cuda.profiler.start / stop; ncu --profile-from-start off), its name printed before it:
    the ncu probes' last step, after `warmup` calls of each outside the range (or their own)."""
    import torch
    for _, fn in runs:
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    for name, fn in runs:
        print(f"-- {name}", flush=True)
        torch.cuda.profiler.start()
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


def decode_spec(layout: str, extra: str = "", schedule: str = "split_kv(auto)", name: str | None = None):
    """The decode case of benchmarks/suite/decode_grid.py (32 query heads over 8 KV heads, d128,
    f16) on `layout` ("contiguous" or "paged<page>", as decode_grid.LAYOUTS), with the spec line
    `extra` and `schedule`; `name` (default decode_<layout>) keys its cache entry."""
    import attngen
    import decode_grid
    cache = "" if layout == "contiguous" else f"\n kv_cache paged(page={layout[5:]})"
    text = (f"attention {name or 'decode_' + layout} {{\n head_dim {decode_grid.D}\n"
            f" heads q={decode_grid.HQ} kv={decode_grid.HKV}\n dtype f16\n schedule {schedule}{cache}\n {extra}\n}}")
    return attngen.parse(text)[0]


# -- WGSL probes: the cases of run_gpu.py's WGSL section ---------------------------------------

TOKENS, HEADS = 16384, 16


def add_arguments(ap, masks: str = "none,causal") -> None:
    """--lengths, --dims, --dtypes, --masks and --tokens."""
    ap.add_argument("--lengths", default="1024,4096")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--dtypes", default="f32,f16")
    ap.add_argument("--masks", default=masks)
    ap.add_argument("--tokens", type=int, default=TOKENS, help="B L (default %(default)s)")


def spec_text(dtype: str, d: int, mask: str, extra: str = "") -> str:
    lines = [f"head_dim {d}", f"heads q={HEADS} kv={HEADS}", f"dtype {dtype}"]
    if mask != "none":
        lines.append(f"mask {mask}")
    if extra:
        lines.append(extra)
    return "attention probe {\n " + "\n ".join(lines) + "\n}\n"


def cases(args):
    """(dtype, d, L, mask, the inputs q, k, v on the adapter, attention FLOPs) per case."""
    from attngen.backends import wgsl
    for d in (int(x) for x in args.dims.split(",")):
        rng = np.random.default_rng(d)
        host = [rng.standard_normal((args.tokens, HEADS, d), dtype=np.float32).astype(np.float16) for _ in range(3)]
        for dtype in args.dtypes.split(","):
            np_dt = np.float16 if dtype == "f16" else np.float32
            for L in (int(x) for x in args.lengths.split(",")):
                shape = (args.tokens // L, L, HEADS, d)
                dev = [wgsl.WgslTensor.from_numpy(a.reshape(shape).astype(np_dt)) for a in host]
                for mask in args.masks.split(","):
                    flops = attention_flops(shape[0], HEADS, L, L, d, causal=mask == "causal")
                    yield dtype, d, L, mask, dev, flops
                for t in dev:
                    t.buffer.destroy()


class Row:
    """One case's cells: each variant's kernel is checked against the first one's output (rel.
    error) and timed as `attngen tune` times (GPU time, warm-up, median of 5)."""

    def __init__(self, dev, flops: float):
        self.dev, self.flops, self.ref, self.cells = dev, flops, None, []

    def add(self, label: str, make, note=None) -> None:
        """make(): the compiled kernel; note(kernel): text after the figures (or None). A variant
        that fails or is refused is a cell saying so."""
        from attngen.backends import wgsl
        from attngen.reference import relative_error

        try:
            kern = make()
            out = kern(*self.dev).numpy()
            self.ref = out if self.ref is None else self.ref
            err = relative_error(out.astype(np.float32), self.ref.astype(np.float32))
            ms = wgsl.BACKEND.time_call(kern, tuple(self.dev), {}, 5)
            extra = f" [{note(kern)}]" if note else ""
            self.cells.append(f"{label} {self.flops / ms / 1e9:6.2f} TFLOP/s {ms:.3g} ms ({err:.0e}){extra}")
        except Exception as e:  # noqa: BLE001 - a refused or failing variant: say so, go on
            self.cells.append(f"{label} n/a ({type(e).__name__}: {str(e).splitlines()[0][:80]})")

    def line(self, dtype: str, d: int, L: int, mask: str) -> str:
        return f"{dtype} d{d} L{L} {mask:6s} | " + " | ".join(self.cells)
