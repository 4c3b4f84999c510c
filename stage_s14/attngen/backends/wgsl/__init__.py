"""The WGSL backend: WGSL for WebGPU (browsers' Tint, wgpu's naga), launched through wgpu-py.

    config.py     the tile configuration (invocations per row, workgroup-memory layout)
    lower.py      the Params struct, bindings, dispatches, workspaces and entry points
    emit.py       the source (templates/wgsl) and the manifest (manifest.py: packed buffers)
    devices.py    the process's wgpu device, the adapter's profile, WgslTensor
    kernel.py     the kernel object: compile, inputs, the call
    launch.py     one call: upload, dispatch every entry point, read back
    args.py       the Params words and the packed integer inputs
    blockmask.py  BlockMask lists built on the GPU by a generated shader

This module only describes the backend; wgpu and jinja2 are imported when needed.
    from attngen.backends.wgsl import WgslTensor, device   # the runtime's public names
"""

from __future__ import annotations

from ...lang.options import Option, TargetSchema
from ..base import Backend, warm_up
from ...plan.kernel_plan import Problem
from .lower import RUNTIME_CHECKS

_NP = {"f16": "float16", "f32": "float32"}


class WgslBackend(Backend):
    name = "wgsl"
    package = __name__  # config.py, lower.py and emit.py implement configure, lower, render, manifest
    schema = TargetSchema("wgsl", (
        Option("workgroup", "int", 1, 1024, tiling=True),
        Option("subgroups", "choice", choices=("auto", "on", "off"), what="subgroups mode", usage="auto|on|off"),
        Option("f16", "choice", choices=("auto", "native", "packed"), what="f16 storage", usage="auto|native|packed"),
        Option("prefetch", "choice", choices=("auto", "on", "off"), what="tile prefetch", usage="auto|on|off"),
        # the decode kernel for split_kv (decode.py); auto: the profile's [dialect] decode_kernel. Not printed at
        # auto, so the text (golden files, cache keys) of specs stored before it stays the same. Tiling: it picks
        # the kernel whose tiles the sweep would set (the decode kernel has none), so a spec that sets it is not tuned
        Option("decode", "choice", choices=("auto", "on", "off"), what="decode kernel", usage="auto|on|off",
               tiling=True, printed_at_auto=False),
        # the kernel family on subgroup matrices (matrix.py); auto: where the profile offers a usable config and
        # the family serves the spec (matrix.auto_picks), else the scalar family
        Option("matrix", "choice", choices=("auto", "on", "off"), what="subgroup-matrix mode", usage="auto|on|off",
               printed_at_auto=False),
    ), language="WGSL")
    default_profile = "webgpu-core"
    torch_devices = ("cpu",)  # host tensors, through numpy arrays
    required_limits = ("workgroup_storage_bytes", "invocations_per_workgroup", "storage_buffers_per_stage",
                       "workgroups_per_dimension", "storage_buffer_binding_bytes")
    required_defaults = ("max_head_dim", "tile_q", "threads_per_row", "tile_kv")
    required_sections = ("dialect",)
    wall_timing = "wall time, uploads and read-back included"  # where the adapter has no timestamp queries
    gpu_timing = ("GPU time of the dispatches (timestamp queries; short calls repeated back to back in one "
                  "submission of ~25 ms), inputs resident on the device")

    @property
    def timing(self):
        """How time_call measures on this machine's adapter."""
        try:
            from .devices import device_state
            return self.gpu_timing if "timestamp-query" in device_state().features else self.wall_timing
        except Exception:  # no wgpu or no adapter here: nothing is timed
            return self.wall_timing
    device_name = "wgpu adapter"
    source_suffix = "wgsl"
    # expressions, those that read inputs too, as the forward (templates/wgsl/backward.wgsl.j2), and
    # every `grad` input, without atomics (attngen/backends/wgsl/expr_grads.py)
    backward_expressions = "grads"

    def backward_problems(self, plan) -> list:
        """Why `plan` has no backward on this target (expr_grads.backward_problems)."""
        from .expr_grads import backward_problems
        return backward_problems(plan.spec)

    def expression_tiles(self, spec):
        from ...lang.expr import inputs_read
        if inputs_read(spec.mask.expr):
            return ("a generated builder evaluates the mask over inputs into a BlockMask, and the kernel runs mask "
                    "custom's lists (docs/variants.md)")
        return ("the kernels (forward and backward) skip wholly hidden tiles, take wholly visible ones without a "
                "per-element test and test mixed ones per element (mask_expr_tile, i32 intervals)")

    def expression_problems(self, spec):
        """Score and mask expressions compile for the forward (attngen/backends/wgsl/expr.py), their
        inputs passed by keyword in one storage binding (docs/language.md); a bf16 input is refused
        (WGSL has no bf16). The backward takes index-only expressions (its blocks classified by
        mask_expr_tile as the forward's tiles, d score / d s as score_expr_ds), score expressions
        that read inputs, and the gradients of `grad` inputs (expr_grads.py: read once per pair
        directly, the others through per-workgroup partial sums)."""
        return [Problem(f"input '{i.name}' is bf16: WGSL has no bf16 type", key=f"input.{i.name}",
                        hint="declare it f32 or f16 for target wgsl; bf16 inputs are for cuda")
                for i in spec.inputs if i.dtype == "bf16"]

    kv_dtypes = ("e4m3", "e5m2", "i8")  # decoded by hand from u32 words (templates/wgsl/quant.j2)

    def fp8_problems(self, spec, profile):
        return [Problem(f"dtype {spec.dtype}: FP8 prefill is not built on target wgsl: WGSL has no 8-bit float type "
                        "and WebGPU no FP8 matrix instructions (issue 44)", key="dtype",
                        hint="use dtype f16 here (an FP8 KV cache, decoded in the shader: kv_dtype e4m3); FP8 "
                             "prefill runs on target cuda with profile cuda-sm90")]

    def check(self, spec, profile):
        problems = self.expression_problems(spec) + self.kv_dtype_problems(spec)
        if spec.is_fp8:  # (nothing below applies: no FP8 kernel to configure)
            return problems + self.fp8_problems(spec, profile)
        if spec.dtype not in profile.storage_dtypes:
            if spec.dtype == "bf16":
                problems.append(Problem("dtype bf16 is not available: WGSL has no bf16 type", key="dtype",
                                        hint="use dtype f16 (packed in u32 words where shader-f16 is missing) or f32 for WGSL; "
                                             "bf16 runs on cuda"))
            else:
                problems.append(Problem(f"dtype {spec.dtype} is not available (has: "
                                        f"{', '.join(profile.storage_dtypes)})", key="dtype"))
        from .config import f16_storage
        storage = f16_storage(spec, profile)
        f16_math = "f16" in (spec.acc_qk, spec.acc_pv)
        if storage == "native" and not profile.may_use_feature("shader-f16"):
            problems.append(Problem("f16=native needs the shader-f16 feature, which this profile does not "
                                    "offer", key="target.wgsl", hint="use f16=packed (or auto): f16 in u32 words"))
        elif f16_math and not profile.may_use_feature("shader-f16"):
            problems.append(Problem("accumulate f16 needs the shader-f16 feature (f16 arithmetic), which this "
                                    "profile does not offer", key="accumulate",
                                    hint="use accumulate qk=f32 pv=f32: f16 storage is then packed in u32 words"))
        elif f16_math and storage == "packed":
            problems.append(Problem("accumulate f16 with f16=packed: packed storage computes in f32",
                                    key="accumulate", hint="use accumulate qk=f32 pv=f32, or f16=native"))
        from .lower import main_params
        used, most = sum(p.kind == "tensor" for p in main_params(spec)), profile.limit("storage_buffers_per_stage")
        if spec.kv_dtype is not None and used > most:  # kv_scale is one storage buffer more
            problems.append(Problem(f"kv_dtype {spec.kv_dtype}: the attention entry point with the kv_scale binding "
                                    f"needs {used} storage buffers; profile {profile.name} allows {most}",
                                    key="kv_dtype", hint="a quantized cache does not fit with mask custom or "
                                                         "expression inputs on this profile"))
        elif spec.inputs:  # the inputs binding is one storage buffer more in the attention entry point
            if used > most:
                problems.append(Problem(f"the attention entry point with the inputs binding needs {used} storage "
                                        f"buffers; profile {profile.name} allows {most}", key=f"input.{spec.inputs[0].name}",
                                        hint="a custom mask and inputs do not fit together: write the mask as "
                                             "an expression"))
        if spec.options(self.name).get("subgroups") == "on" and not profile.may_use_feature("subgroups"):
            problems.append(Problem("subgroups=on, but this profile has no subgroups feature", key="target.wgsl",
                                    hint="use subgroups=auto or off"))
        from .matrix import problems as matrix_problems
        return problems + matrix_problems(spec, profile, storage)

    def describe(self, plan):
        c = plan.config
        if c.decode is not None:
            return self._describe_decode(plan)
        if c.matrix is not None:
            return [
                plan.summary(),
                f"subgroup matrix {c.matrix.summary} (of the profile's configs; target wgsl {{ matrix="
                f"{plan.spec.options(self.name).get('matrix') or 'auto'} }}): Q K^T and P V on subgroup "
                f"matrices, the online softmax in scalar code over S in workgroup memory, two invocations per row",
                f"workgroup memory: {plan.smem_bytes} bytes ({c.smem_summary})",
                f"grid: ({', '.join(plan.grid)}) x {plan.threads} threads",
                f"features: {', '.join(plan.features) or 'none'}",
            ]
        return [
            plan.summary(),
            f"register tiling: {c.sub_block} ({c.workgroup} invocations: {c.row_groups} row groups x "
            f"{c.threads_per_row} per row; row reductions: {c.reduction}; the profile's register budget: "
            f"{c.budget[0]} scores and {c.budget[1]} accumulators per invocation)",
            f"workgroup memory: {plan.smem_bytes} bytes ({c.smem_summary})",
            f"grid: ({', '.join(plan.grid)}) x {plan.threads} threads",
            f"features: {', '.join(plan.features) or 'none'}",
            f"wgpu runtime checks: {plan.details.runtime_checks} ({RUNTIME_CHECKS[plan.details.runtime_checks]}; "
            "the profile's dialect, wgpu-native only)",
        ] + ([f"kv_dtype {plan.spec.kv_dtype}: K and V one byte per value in u32 words, decoded in the shader and "
              "multiplied by their f32 scales (binding kv_scale: k_scale, then v_scale)"] if plan.spec.kv_dtype else [])

    def _describe_decode(self, plan):
        """describe() of a plan with the decode kernel (decode.py)."""
        c, d = plan.config, plan.config.decode
        kv = plan.spec.kv_dtype
        return [
            plan.summary(),
            f"decode kernel (target wgsl {{ decode={plan.spec.options(self.name).get('decode') or 'auto'} }}): per step "
            f"each team of {d.team} loads {d.keys} key(s) x {d.chunks_k} + {d.chunks_v} 16-byte item(s) of K and V per "
            f"invocation, no workgroup memory in the main loop; {d.registers} f32 of q and acc per invocation; the teams "
            f"merged at the end (subgroups of {d.subgroup} relied on)",
            f"workgroup memory: {plan.smem_bytes} bytes ({c.smem_summary}; the epilogue's)",
            f"grid: ({', '.join(plan.grid)}) x {plan.threads} threads",
            f"features: {', '.join(plan.features) or 'none'}",
            f"wgpu runtime checks: {plan.details.runtime_checks} ({RUNTIME_CHECKS[plan.details.runtime_checks]}; "
            "the profile's dialect, wgpu-native only)",
        ] + ([f"kv_dtype {kv}: K and V one byte per value, read 16 bytes at a time and decoded in the shader; their f32 "
              "scales bound as they are (k_scale, v_scale)"] if kv else [])

    def tune_space(self, spec):
        """Rows per workgroup x keys per tile x invocations per row (workgroup = rows x that)."""
        return [{"tile_q": q, "tile_kv": kv, "options": {"workgroup": q * per_row}}
                for q in (8, 16, 32) for kv in (16, 32) for per_row in (2, 4, 8)]

    def plan_fields(self, plan):
        c = plan.config
        if c.decode is not None:  # the decode kernel (decode.py): its rows, team, keys per step
            d = c.decode
            return {"kernel": "decode", "rows": d.rows, "workgroup": d.workgroup, "team": d.team, "keys": d.keys,
                    "step": d.step, "f16": "packed" if c.f16_packed else "native"}
        if c.matrix is not None:  # the subgroup-matrix family (matrix.py): its tiles follow the config
            return {"kernel": "subgroup-matrix", "q": c.tile_q, "kv": c.tile_kv, "workgroup": c.workgroup,
                    "config": c.matrix.summary}
        return {"q": c.tile_q, "kv": c.tile_kv, "workgroup": c.workgroup, "per_row": c.threads_per_row,
                "rows": c.rows, "reduce": c.reduction, "prefetch": "on" if c.prefetch else "off",
                "f16": "packed" if c.f16_packed else "native", "d": c.tile_d or "whole", "v_blocks": c.v_blocks}

    def device_identity(self):
        from .devices import device_state
        info = device_state().info
        parts = [str(info.get(k) or "") for k in ("vendor", "architecture", "device", "description", "backend_type")]
        return " / ".join(p for p in parts if p)

    def helper_sources(self, plan):
        """The block-mask builder of a custom-mask kernel (manifest: block_mask) or of a mask expression
        over inputs (for the same spec with `mask custom`, on that kernel's tiles: the subgroup-matrix
        family may plan it where the spec's own kernel is scalar) with that `mask custom` kernel's
        source (manifest: mask_inputs), and the backward module of every spec that has one (manifest:
        backward; docs/backward.md)."""
        from ...plan.mask_inputs import reads_inputs
        from .emit import backward_plan, backward_source, block_mask_source, expr_block_mask_source
        from .manifest import companion_plan
        out = {"block-mask": block_mask_source(plan)} if plan.spec.mask.is_custom else {}
        if reads_inputs(plan.spec):
            att = companion_plan(plan)
            tiles = (plan.tile_q, plan.tile_kv) if att is None else (att.tile_q, att.tile_kv)
            out["block-mask"] = expr_block_mask_source(plan.spec, *tiles)
            if att is not None:  # the attention kernel of the two-part call (manifest: mask_inputs)
                out["mask-custom"] = self.render(att)
        if backward_plan(plan) is not None:
            out["backward"] = backward_source(plan)
        return out

    def describe_backward(self, plan):
        """Lines for `attngen check`: the backward's entry points, grids, blocks, workgroup memory
        and workspace (or why there is none)."""
        from ...plan.backward import problems, workspace_bytes
        from .emit import backward_plan
        made = backward_plan(plan)
        if made is None:
            why = "; ".join(p.message for p in self.backward_problems(plan)) or (
                f"head dims qk={plan.d_qk} v={plan.d_v} do not fit its blocks in 16384 bytes of workgroup memory")
            return [f"backward: none ({why})"]
        cfg, entries = made
        lines = [f"backward: {len(entries)} entry points, deterministic (no atomics), f32 accumulation; {cfg.summary}"]
        for e in entries:
            lines.append(f"  {e.entry}: grid ({', '.join(e.grid)}) x {e.threads} invocations, "
                         f"{e.smem_bytes} bytes of workgroup memory, {sum(p.kind == 'tensor' for p in e.params)} "
                         "storage buffers")
        lines.append(f"  workspace rows: D per query row and head ({workspace_bytes(1, 1, 1)} bytes each: "
                     "plan.backward.workspace_bytes(B, Hq, Lq)), with lse * log2(e) beside it (as much again) "
                     "and one word for the loop-budget check; dk and dv share one binding (dkv)")
        from .expr_grads import partials
        grads = [i.name for i in plan.spec.inputs if i.grad]
        part = partials(plan.spec)
        if grads:
            direct = [i.name for i in plan.spec.inputs if i.grad and all(p.input is not i for p in part)]
            lines.append(f"  gradients of the `grad` inputs {', '.join(grads)}: f32 in rows after its flag word, "
                         + (f"{', '.join(direct)} written by the dkdv step (one invocation per entry: no atomics)"
                            if direct else "written by the grads step"))
        for p in part:
            lines.append(f"  {p.input.name}'s gradient sums many pairs: partial sums in rows, one slice of "
                         f"{' * '.join(p.formula('BKV'))} words per dkdv workgroup "
                         f"(ceil(Lk / {cfg.block_kv}) * Hkv * B of them), summed in a fixed order by the grads "
                         "step (the rows binding must hold them: a larger call is refused)")
        return lines

    # The profile of the web demo's subgroup-matrix build where the chosen one has no configs: Chrome's
    # WebGPU on NVIDIA (Dawn on Vulkan), where the family was measured.
    demo_matrix_profile = "dawn-vulkan-nvidia"

    def demo_files(self, spec, profile):
        """The kernel, its manifest, examples/web's page and runtime (docs/web.md "Two builds"):
        kernel.wgsl on the scalar family for `profile`, and where the subgroup-matrix family serves
        the spec, kernel-matrix.wgsl for adapters with its config (planned for `profile` where that
        has configs, else demo_matrix_profile); builds.json lists them in the page's order of
        preference, and says why there is no subgroup-matrix build where there is none."""
        import json
        from ...plan.lower import lower
        from ...resources import resource_path
        from . import matrix
        from .config import f16_storage
        prof = self.profile(profile)
        mode = matrix.requested(spec)
        scalar_spec = matrix.with_mode(spec, "off") if mode == "on" else spec
        # the scalar build: the spec's own plan on a profile without configs (byte for byte what
        # `attngen build` writes), the scalar family's where auto would take the family
        on_family = matrix.uses_family(scalar_spec, prof, f16_storage(scalar_spec, prof))
        scalar_prof = matrix.without_family(prof) if on_family else prof
        plan = lower(scalar_spec, self, scalar_prof)  # checked: SpecError with every problem
        files = {"kernel.wgsl": self.render(plan), "kernel.wgsl.json": json.dumps(self.manifest(plan), indent=1) + "\n"}
        builds = [{"kernel": "kernel.wgsl", "family": "scalar", "profile": plan.profile}]
        not_built = []
        mprof = prof if matrix.matrix_configs(prof) else self.profile(self.demo_matrix_profile)
        why = ("the spec says target wgsl { matrix=off }" if mode == "off"
               else matrix.why_not(spec, mprof, f16_storage(spec, mprof)))
        if why is None or mode == "on":  # on: planned, or refused with the checker's reason (SpecError)
            mplan = lower(spec, self, mprof)
            files["kernel-matrix.wgsl"] = self.render(mplan)
            files["kernel-matrix.wgsl.json"] = json.dumps(self.manifest(mplan), indent=1) + "\n"
            builds.insert(0, {"kernel": "kernel-matrix.wgsl", "family": "subgroup-matrix", "profile": mplan.profile,
                              "config": f"{mplan.config.matrix.summary} at subgroup size "
                                        f"{mplan.config.matrix.max_subgroup_size}"})
        else:
            not_built.append({"family": "subgroup-matrix", "why": why})
        files["builds.json"] = json.dumps({
            "doc": "the builds of this kernel, in the page's order of preference: the page runs the first whose "
                   "manifest the adapter serves (its features and limits, and for a subgroup-matrix build the "
                   "manifest's subgroup_matrix config among the adapter's info.subgroupMatrixConfigs at its "
                   "subgroup size: attngen.js pickKernel)",
            "builds": builds, "not_built": not_built}, indent=1) + "\n"
        for name in ("index.html", "attngen.js"):
            files[name] = resource_path("web", name).read_text()
        return files

    def compile(self, spec, profile=None):
        from .kernel import compile_kernel
        return compile_kernel(self, spec, profile)

    def device_inputs(self, spec, host, options):
        import numpy as np
        from .devices import WgslTensor
        # resident on the device: a timed call uploads nothing but its uniforms and integer inputs (a
        # quantized cache's bytes and its f32 scales too: WgslTensor holds uint8 / int8)
        args = tuple(WgslTensor.from_numpy(a if a.dtype in (np.uint8, np.int8) else a.astype(np.dtype(_NP[spec.dtype])))
                     for a in host)
        scales = {n: WgslTensor.from_numpy(options[n]) for n in ("k_scale", "v_scale") if options.get(n) is not None}
        return args, {**options, **scales}

    def check_sizes(self, kernel, launch, inputs, mask=None):
        from .launch import check_sizes
        check_sizes(kernel, launch, inputs, mask)

    def time_call(self, kernel, args, options, repeat):
        """Median GPU milliseconds of `repeat` calls (timestamp queries around the dispatches),
        or median wall time where the adapter has no timestamp queries (self.timing says which)."""
        import statistics
        from .launch import gpu_timer, timed_repeats
        if "timestamp-query" not in kernel.state.features:
            return super().time_call(kernel, args, options, repeat)

        def call():
            kernel(*args, **options)
        warm_up(call)  # pipelines, and the GPU's clocks (timed calls wait)
        # each timed call: its dispatches repeated back to back in one submission of ~25 ms
        with gpu_timer(kernel, repeat=timed_repeats(kernel, call)) as times:
            per_call = []
            for _ in range(repeat):
                times.clear()
                kernel(*args, **options)
                per_call.append(sum(times))
        return statistics.median(per_call)


BACKEND = WgslBackend()


def compile_kernel(spec, profile=None):
    """A WGSL kernel for the live adapter (attngen.compile(spec, target="wgsl"))."""
    return BACKEND.compile(spec, profile)


def adapter_profile():
    """The profile of the live adapter, narrowed to what it reports."""
    from .devices import adapter_profile as profile_of
    return profile_of(BACKEND)


# The runtime's public names, imported on first use (they need wgpu).
_RUNTIME = {"WgslTensor": "devices", "device": "devices", "device_state": "devices", "WgslKernel": "kernel"}


def __getattr__(name):
    if name in _RUNTIME:
        import importlib
        return getattr(importlib.import_module(f"{__name__}.{_RUNTIME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
