"""The CUDA backend: CUDA C++ for NVRTC, launched through CuPy (sm_80 and newer).

    config.py   the tile configuration (warps, stages, shared-memory layout)
    lower.py    parameters, grids, workspaces and entry points of the plan
    family.py   each namespace's kernel family, its main-loop template and the paths it takes
    emit.py     the source (templates/cuda) and the manifest
    nvrtc.py    source -> cubin (no GPU needed)
    devices.py  the GPUs: CuPy, a device's profile (profile_for, device_profile), its name
    kernel.py   the kernel object: tensors in, launch on the caller's stream
    args.py     one call's kernel arguments, workspaces and block masks
    backward.py the backward pass: its tiles, source, description and launches (issue 41)

This module only describes the backend; CuPy, NVRTC and jinja2 are imported when needed.
"""

from __future__ import annotations

from ...lang.options import Option, TargetSchema
from ..base import Backend, warm_up

_NP = {"f16": "float16", "f32": "float32"}


class CudaBackend(Backend):
    name = "cuda"
    package = __name__  # config.py, lower.py and emit.py implement configure, lower, render, manifest
    schema = TargetSchema("cuda", (
        Option("warps", "int", 1, 32, tiling=True),
        Option("stages", "int", 1, 8, tiling=True),
        Option("key_warps", "int", 1, 8),
        Option("producer", "choice", choices=("auto", "on", "off"), what="producer warpgroup", usage="auto|on|off"),
        Option("persistent", "choice", choices=("auto", "on", "off"), what="persistent blocks", usage="auto|on|off"),
        Option("tma", "choice", choices=("auto", "on", "off"), what="tensor copy engine", usage="auto|on|off"),
        Option("backward", "choice", choices=("auto", "fast", "deterministic"), what="backward family",
               usage="auto|fast|deterministic"),
        Option("mask_expr", "choice", choices=("auto", "inline", "bits"), what="mask expression path",
               usage="auto|inline|bits", printed_at_auto=False),
    ), language="C++")
    default_profile = "cuda-sm80"
    torch_devices = ("cuda",)  # CUDA tensors, read in place
    required_limits = ("shared_memory_bytes", "threads_per_block", "registers_per_thread", "registers_per_block")
    required_defaults = ("math", "max_head_dim", "tile_q", "tile_kv", "stages")
    required_sections = ("device.arch",)
    timing = "GPU time (events)"
    device_name = "CUDA GPU (with CuPy)"
    source_suffix = "cu"

    # expressions, those that read inputs too, as the forward (templates/cuda/backward*.j2; masks over
    # inputs by the builder's BlockMask), and `grad` inputs (the fast family: backward.backward_problems)
    backward_expressions = "grads"
    # quantized K/V caches (issue 44): the bytes staged in shared memory and decoded in registers by
    # the mma.sync family (templates/cuda/math_mma_kvq.j2) or on CUDA cores (f32 specs)
    kv_dtypes = ("e4m3", "e5m2", "i8")

    def kv_dtype_problems(self, spec):
        """A quantized cache's products accumulate in f32 here: the stored values before their scale
        (up to 448, 57344 or 127) would leave f16 accumulators' range where the scaled values do not."""
        from ...plan.kernel_plan import Problem
        problems = super().kv_dtype_problems(spec)
        if spec.kv_dtype is not None and "f16" in (spec.acc_qk, spec.acc_pv):
            problems.append(Problem(f"kv_dtype {spec.kv_dtype} with accumulate f16: target cuda accumulates a "
                                    "quantized cache's products in f32 (its scales are applied to the f32 sums, and "
                                    "the stored values before them reach 448, 57344 or 127)", key="accumulate",
                                    hint="use accumulate qk=f32 pv=f32 (the default) with kv_dtype"))
        if spec.kv_dtype is not None and (spec.head_dim_qk % 16 or spec.head_dim_v % 16):
            problems.append(Problem(f"kv_dtype {spec.kv_dtype} with head_dim qk={spec.head_dim_qk} v={spec.head_dim_v}: "
                                    "target cuda copies a quantized cache's rows 16 bytes (16 values) at a time, so "
                                    "its head dims are multiples of 16", key="kv_dtype",
                                    hint="use a head dim that is a multiple of 16, or keep K and V in the spec's dtype"))
        return problems

    def expression_problems(self, spec):
        """Score and mask expressions compile for the forward, with or without inputs, on every
        kernel family the chooser picks for them (expr.py; P through memory is not picked for
        them: choices.stored_p_refusal), so nothing is refused here. The backward compiles
        index-only expressions, in both families (backward.py); one whose expressions read inputs
        is refused (attngen.plan.backward.problems). The one refusal: `mask_expr` given for a
        mask that is not an index-only expression (attngen/plan/expr_bits.py), where it means nothing."""
        from ...plan import expr_bits
        from ...plan.kernel_plan import Problem
        given = spec.options("cuda").get("mask_expr")
        if given is None or expr_bits.applies(spec):
            return []
        what = ("an expression that reads inputs (the builder's path)" if spec.mask.kind == "expr"
                else f"{spec.mask.kind} (a named mask, or an expression planned as one: attngen check says which)")
        return [Problem(f"mask_expr={given} chooses how an index-only mask expression runs; this spec's mask is "
                        f"{what}", key="target.cuda", hint="leave mask_expr out (auto)")]

    def fp8_problems(self, spec, profile):
        """FP8 prefill (fp8.py): profiles with FP8 wgmma, and what it does not build yet, refused by name."""
        from .fp8 import fp8_problems
        return fp8_problems(spec, profile)

    def torch_tags(self, torch, reads_host: bool) -> tuple:
        """cudagraph_unsafe where the call reads the host: torch.compile's CUDA graphs
        (mode="reduce-overhead") then run the operator outside the graph."""
        tag = getattr(torch.Tag, "cudagraph_unsafe", None)
        return (tag,) if reads_host and tag is not None else ()

    def describe(self, plan):
        c = plan.config
        # The estimate steers the tile search; whether a kernel spills is ptxas's word (the
        # examples' default plans are held to none: tests/backends/cuda/test_spills.py).
        return [
            plan.summary(),
            f"shared memory: {plan.smem_bytes} bytes ({c.smem_summary})",
            f"grid: ({', '.join(plan.grid)}) x {plan.threads} threads",
            f"registers: at most {c.registers_cap} per thread, allocated by the compiler (ptxas decides what "
            "spills; the planner's rough estimate, which only ranks tile choices: attngen build --emit ir)",
            f"arch: {plan.details.arch} (compute capability 9.0 only)" if plan.details.arch.endswith("a")
            else f"arch: {plan.details.arch} or newer",
        ] + ([c.varlen_summary] if c.varlen is not None else []) + _family_lines(c) + (
            [f"kernel family: mma.sync, not the Hopper wgmma family ({c.family_note})"] if c.family_note else []) + (
            [_kv_line(plan)] if plan.spec.kv_dtype is not None else []) + (
            [_combine_line(plan)] if plan.spec.schedule.is_split else []) + self.expression_path(plan) + (
            __import__(f"{__name__}.fp8", fromlist=["describe"]).describe(plan) if c.fp8 else [])

    def helper_sources(self, plan):
        """The backward pass's source (`attngen build --emit backward`; backward.py), for specs that
        have one on this target; the block-mask builder of a mask over inputs (`--emit block-mask`;
        expr_blockmask.py) where compile() runs one."""
        from ...lang.expr import inputs_read
        from ...plan.mask_inputs import reads_inputs
        from .backward import backward_problems, render_backward
        out = {} if backward_problems(plan) else {"backward": render_backward(plan)}
        if (reads_inputs(plan.spec) and not inputs_read(plan.spec.score)) or _bits_path(plan.spec):
            from .expr_blockmask import builder_source  # compile()'s two-part kernel (or one of its paths)
            out["block-mask"] = builder_source(plan.spec)
        return out

    def expression_tiles(self, spec):
        from ...lang.expr import inputs_read
        from ...plan.mask_inputs import reads_inputs
        if reads_inputs(spec) and not inputs_read(spec.score):
            return ("attngen.compile runs a generated builder (attngen build --emit block-mask) that evaluates the "
                    "mask over its inputs into a BlockMask, then the spec with mask custom on its lists "
                    "(docs/variants.md); this plan, which tests the mixed tiles per element, is used where the "
                    "score reads inputs too")
        return "the kernel skips wholly hidden tiles and tests mixed ones per element"

    def expression_path(self, plan) -> list[str]:
        """`attngen check`'s line on an index-only mask expression's path, inline or bits
        (attngen/plan/expr_bits.py; expr_bits.MaskBitsKernel runs it); [] for other masks."""
        from ...plan import expr_bits
        if not expr_bits.applies(plan.spec):
            return []
        if plan.spec.kv_cache.is_paged:
            return ["mask expression path: inline (a paged cache: the bits path takes contiguous caches)"]
        mode = plan.spec.options("cuda").get("mask_expr") or "auto"
        if mode != "inline":
            from ...errors import SpecError
            from ...plan.lower import lower
            from ...plan.profiles import ProfileError
            from .expr_bits import bits_spec, unplanned_reason
            try:
                lower(bits_spec(plan.spec), self, self.profile(plan.profile))
            except SpecError as e:
                return [f"mask expression path: inline ({unplanned_reason(e)})"]
            except ProfileError:  # a profile made for one call (a device's, overrides): the kernel decides
                pass
        return [f"mask expression path: {expr_bits.describe(plan.spec, plan.tile_q, plan.tile_kv, mode)}"]

    def describe_backward(self, plan) -> list[str]:
        """Lines for `attngen check`: the backward's entry points, grids, tiles, shared memory and
        workspace (backward.py)."""
        from .backward import describe_backward
        return describe_backward(plan)

    def backward_problems(self, plan) -> list:
        """The neutral rules and the families' own (backward.py: a family that cannot compute the
        spec, `grad` inputs in the deterministic one)."""
        from .backward import backward_problems
        return backward_problems(plan)

    def run_backward(self, kernel, q, k, v, out, lse, dout, **options):
        """(dq, dk, dv) of a compiled kernel (CudaKernel.backward; backward.py), and with `grad`
        inputs their gradients, a dict."""
        from .backward_launch import run_backward
        return run_backward(kernel, q, k, v, out, lse, dout, **options)

    def describe_ir(self, plan):
        """The planner's register estimate, and each namespace's KernelShape (family.py): every choice
        its family template tests, by name."""
        from .emit import namespace_shapes
        from .family import shape_fields
        c = plan.config
        return [f"register estimate: about {c.registers_estimate} per thread (rough: it ranks the tile choices; "
                f"ptxas allocates at most {c.registers_cap} and decides what spills)"] + [
            f"template fields ({name}): {shape_fields(shape)}" for name, shape in namespace_shapes(plan)]

    def tune_space(self, spec):
        """Rows per block x keys per tile x K/V stages (the planner picks the kernel family)."""
        return [{"tile_q": q, "tile_kv": kv, "options": {"stages": st}}
                for q in (64, 128) for kv in (32, 64, 128) for st in (2, 3)]

    def plan_fields(self, plan):
        from .family import family_name
        c = plan.config
        return {"q": c.tile_q, "kv": c.tile_kv, "warps": c.warps, "stages": c.stages, "family": family_name(c),
                "math": c.math, "producer": "on" if c.producer else "off",
                "persistent": "on" if c.persistent and not c.item_per_block else "off", "key_warps": c.key_warps,
                "tma": "on" if c.tma else "off", "d": c.chunk or "whole", "v_blocks": c.v_blocks}

    def device_identity(self):
        from .devices import cupy_module, device_name, gpu_count
        cupy = cupy_module()
        gpu_count(cupy)  # no driver or no GPU: a LaunchError that says so
        dev = cupy.cuda.Device()
        if dev.id not in self._identities:  # asked by every attngen.compile: once per device
            name = device_name(cupy, dev.id)
            self._identities[dev.id] = (f"NVIDIA / sm_{dev.compute_capability} / {name} / driver "
                                        f"{cupy.cuda.runtime.driverGetVersion()}")
        return self._identities[dev.id]

    _identities: dict = {}

    def compile(self, spec, profile=None):
        """A CudaKernel; for a mask expression over inputs with a score that reads none, the
        block-mask builder with the `mask custom` kernel (expr_blockmask.MaskInputsKernel)."""
        from ...lang.expr import inputs_read
        from ...plan.mask_inputs import custom_spec, reads_inputs
        from .kernel import compile_kernel
        if reads_inputs(spec) and not inputs_read(spec.score):
            from .expr_blockmask import MaskInputsKernel
            return MaskInputsKernel(spec, compile_kernel(self, custom_spec(spec), profile))
        if spec.is_fp8:  # FP8 prefill: the descales at the call (fp8_call.py)
            from .fp8_call import Fp8Kernel
            return compile_kernel(self, spec, profile, cls=Fp8Kernel)
        kernel = compile_kernel(self, spec, profile)
        if _bits_path(spec):
            from .expr_bits import MaskBitsKernel, bits_spec
            return MaskBitsKernel(kernel, lambda: compile_kernel(self, bits_spec(spec), profile, kernel._home_device))
        return kernel

    device_kinds = "CUDA architectures: sm_80, sm_86, sm_89, sm_90, ... (compute capability 8.0 or newer)"

    def precompile_devices(self):
        """The GPUs of this machine, else the two architectures of the profiles (A100, H100)."""
        try:
            import cupy  # type: ignore
            n = cupy.cuda.runtime.getDeviceCount()
            found = sorted({f"sm_{cupy.cuda.Device(i).compute_capability}" for i in range(n)})
        except Exception:  # no CuPy, no driver or no GPU: CI machines precompile for both profiles
            found = []
        return tuple(found) or ("sm_80", "sm_90")

    def precompile(self, spec, device):
        import re
        from .kernel import precompile
        m = re.fullmatch(r"sm_(\d{2,3})", device.strip())
        if m is None or int(m.group(1)) < 80:
            raise ValueError(f"unknown CUDA device {device!r}: give an architecture such as sm_80 or sm_90 "
                             "(compute capability 8.0 or newer)")
        from ...errors import LaunchError
        from . import nvrtc
        if not nvrtc.available():
            raise LaunchError("precompiling for the cuda target needs NVRTC: pip install 'attngen[gpu]' "
                              "(cuda-bindings and nvidia-cuda-nvrtc; no GPU needed)")
        hit, _ = precompile(self, spec, int(m.group(1)))
        if _bits_path(spec):  # the bits path's `mask custom` kernel too (expr_bits.py)
            from .expr_bits import bits_spec
            hit = precompile(self, bits_spec(spec), int(m.group(1)))[0] and hit
        return hit

    def device_inputs(self, spec, host, options):
        from ...errors import LaunchError
        from .devices import cupy_module
        cupy = cupy_module()
        if "mask" in options:
            options = {**options, "mask": cupy.asarray(options["mask"])}
        for inp in spec.inputs:  # expression inputs: their dtype kept (bf16, drawn as float32: made with PyTorch)
            if inp.dtype == "bf16":
                try:
                    import torch
                except ImportError:
                    raise LaunchError(f"input '{inp.name}' is bf16, which the cuda target takes as a PyTorch "
                                      "tensor; PyTorch is not installed") from None
                options = {**options, inp.name: torch.from_numpy(options[inp.name]).cuda().to(torch.bfloat16)}
            else:
                options = {**options, inp.name: cupy.asarray(options[inp.name])}
        if spec.is_fp8:  # torch float8 tensors of the bytes, the descales on the GPU (fp8_call.py)
            import torch
            from ...runtime.fp8 import DESCALES, TORCH_FP8
            fp8 = getattr(torch, TORCH_FP8[spec.dtype])
            options = {**options, **{n: torch.from_numpy(options[n]).cuda() for n in DESCALES if n in options}}
            return tuple(torch.from_numpy(a).cuda().view(fp8) for a in host), options
        stored = (1, 2) if spec.kv_dtype is not None else ()  # a quantized cache's k and v: its bytes as they are
        options = {n: cupy.asarray(x) if n in ("k_scale", "v_scale") else x for n, x in options.items()}
        if spec.dtype == "bf16":
            try:
                import torch
            except ImportError:
                raise LaunchError("bf16 inputs on the cuda target are made with PyTorch, which is not "
                                  "installed") from None
            return tuple(torch.from_numpy(a).cuda() if i in stored else torch.from_numpy(a).cuda().to(torch.bfloat16)
                         for i, a in enumerate(host)), options
        return tuple(cupy.asarray(a if i in stored else a.astype(_NP[spec.dtype])) for i, a in enumerate(host)), options

    def check_sizes(self, kernel, launch, inputs, mask=None):
        from .args import launches  # the grids' limits; buffers (a mask's too) are bounded by the GPU's memory alone
        launches(kernel.plan, launch, "bool" if kernel.spec.mask.is_custom else None)

    def time_call(self, kernel, args, options, repeat):
        import statistics
        from .devices import cupy_module
        cupy = cupy_module()
        def synced():
            kernel(*args, **options)
            cupy.cuda.get_current_stream().synchronize()
        warm_up(synced)  # module load, and the GPU's clocks
        times = []
        for _ in range(repeat):
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            kernel(*args, **options)
            stop.record()
            stop.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, stop))
        return statistics.median(times)


BACKEND = CudaBackend()


def _bits_path(spec) -> bool:
    """Whether compile() may run `spec` on the bits path: an index-only mask expression whose
    mask_expr is not inline, with a contiguous cache (attngen/plan/expr_bits.py), as planned (an
    expression that is a named mask is planned as that mask: plan.check.normalised)."""
    from ...plan import expr_bits
    from ...plan.check import normalised
    return (expr_bits.applies(normalised(spec)) and spec.options("cuda").get("mask_expr") != "inline"
            and not spec.kv_cache.is_paged)


def _family_lines(c) -> list[str]:
    """The kernel family and main-loop template of each namespace (attngen check, --emit ir)."""
    from .family import family_line
    if c.varlen is None:
        return [f"kernel family: {family_line(c)}"]
    return [f"kernel family (main entry, namespace padded): {family_line(c)}",
            f"kernel family (_varlen entry, namespace varlen): {family_line(c.varlen)}"]


def _kv_line(plan) -> str:
    """How the kernels read a quantized cache (attngen check, --emit ir; issue 44)."""
    from .kvquant import describe
    return describe(plan)


def _combine_line(plan) -> str:
    """How a split schedule's partial results are merged (attngen check, --emit ir)."""
    from .lower import fused_combine
    if fused_combine(plan.spec, plan.config):
        return ("combine: fused, one launch (the last split block of each row tile merges the splits; "
                "tile_counters, zeroed once per stream)")
    why = "two_pass" if plan.spec.schedule.is_two_pass else "output columns split over blocks"
    return f"combine: a second launch ({why})"
