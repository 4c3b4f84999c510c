"""The Backend protocol: what the target-neutral core asks of a target.

A backend is one object per target, registered by name (attngen.backends). The core calls it
at each step of the pipeline and never looks inside it:

    language  schema            the options of `target NAME { ... }` blocks
    profiles  profile(name)     a targets/*.toml profile of this target, checked for its keys
    check     check(spec, p)    target problems (dtypes, features) -> [Problem]
    configure configure(spec,p) the tile configuration, searched once (raises Problem)
    lower     lower(...)        parameters, grid, entry points, workspaces -> Lowered
    render    render(plan)      the source text
    manifest  manifest(plan)    what a launcher without Python needs (JSON-able dict)
    describe  describe(plan)    lines for `attngen check` and `--emit ir`
    compile   compile(spec, p)  a runnable Kernel on this machine's device
    precompile precompile(spec, device)  fill the disk cache ahead of time (`attngen precompile`)
    run       device_inputs / time_call: what `attngen run` needs of the device

Adding a target is a new package under attngen/backends/ with a subclass of Backend, its
templates and its profiles; tests/plan/test_toy_backend.py registers one without an edit to
the core.
"""

from __future__ import annotations

import importlib

from ..lang.options import TargetSchema
from ..lang.spec import AttentionSpec
from ..plan.kernel_plan import KernelPlan, Lowered, Problem
from ..plan.profiles import Profile, ProfileError, find_profile, profiles_for, require


class Backend:
    """Base class of the backends; subclasses set the class attributes and override the steps."""

    name: str = ""
    # A backend package may implement the steps in modules of the usual names, which are
    # imported only when a step runs: config.configure, lower.lower, emit.render_source and
    # emit.render_manifest. Otherwise a subclass overrides the methods.
    package: str | None = None
    schema: TargetSchema = TargetSchema("", ())
    default_profile: str = ""
    # Keys every profile of this target must have (checked when a profile is looked up).
    required_limits: tuple = ()
    required_defaults: tuple = ()
    required_sections: tuple = ()
    # What `attngen run` says of its timings.
    timing: str = "wall time"
    # The file name extension of the generated source (`attngen build DIR -o OUT` writes
    # OUT/<kernel>.<source_suffix>).
    source_suffix: str = "txt"
    # The PyTorch device types (torch.device.type) whose tensors this target's kernels take, as
    # they are or as host arrays (attngen.transformers picks a target by its tensors' device).
    torch_devices: tuple = ()
    # Which score and mask expressions this target's backward kernels compile (issue 42;
    # attngen.plan.backward.problems refuses the rest): False, none; "indices", those of indices
    # and s (and masks over inputs, by the forward's block-mask builder); "inputs", also scores
    # that read inputs; "grads", also the gradients of every `grad` input.
    backward_expressions: bool | str = False

    def torch_tags(self, torch, reads_host: bool) -> tuple:
        """torch.Tag values a PyTorch operator that calls this target's kernels must carry;
        reads_host: its call reads an input on the host (a mask made into a BlockMask), which a
        graph capture of the target's work cannot hold. None by default."""
        return ()

    # -- profiles ---------------------------------------------------------------------------
    def extra_profiles(self) -> tuple:
        """Profiles the backend brings besides targets/*.toml (none by default)."""
        return ()

    def profile(self, profile: Profile | str | None = None) -> Profile:
        """The named profile (default: the target's), checked to be this target's and to have
        the keys this target needs; a Profile object is checked and returned."""
        if isinstance(profile, Profile):
            if profile.target != self.name:
                raise ProfileError(f"profile '{profile.name}' is for target {profile.target}, not {self.name}")
            if profile.overrides:
                self.check_overrides(profile)
            return profile
        prof = find_profile(profile or self.default_profile, self.name, self.extra_profiles())
        return require(prof, self.required_limits, self.required_defaults, self.required_sections)

    def check_overrides(self, profile: Profile) -> None:
        """Refuse overrides (Profile.overrides) that this target's tile table does not have
        (ProfileError naming the field): the package's tiles.tiles_for checks them."""
        try:
            tiles_for = self._step("tiles", "tiles_for")
        except (NotImplementedError, ModuleNotFoundError):
            raise ProfileError(f"profile {profile.name}: target {self.name} has no tile table to override "
                               f"({', '.join(profile.overrides)})") from None
        tiles_for(profile)

    def profiles(self) -> list[Profile]:
        return [require(p, self.required_limits, self.required_defaults, self.required_sections)
                for p in profiles_for(self.name, self.extra_profiles())]

    # -- the pipeline -----------------------------------------------------------------------------
    def check(self, spec: AttentionSpec, profile: Profile) -> list[Problem]:
        """Problems of `spec` on this target that do not depend on tiles (dtypes, features)."""
        problems = self.expression_problems(spec) + self.kv_dtype_problems(spec)
        if spec.is_fp8:
            problems += self.fp8_problems(spec, profile)
        elif spec.dtype not in profile.storage_dtypes:
            problems.append(Problem(f"dtype {spec.dtype} is not available (has: {', '.join(profile.storage_dtypes)})",
                                    key="dtype"))
        return problems

    def fp8_problems(self, spec: AttentionSpec, profile: Profile) -> list[Problem]:
        """An FP8 dtype (FP8 prefill, issue 44) where this target builds none: refused with the reason
        (cuda overrides it with what it builds)."""
        return [Problem(f"dtype {spec.dtype}: FP8 prefill is not built on target {self.name}", key="dtype",
                        hint="FP8 prefill runs on target cuda with profile cuda-sm90 (Hopper); use dtype f16 here")]

    kv_dtypes: tuple = ()  # the `kv_dtype`s (quantized K/V caches, issue 44) this target's kernels read

    def kv_dtype_problems(self, spec: AttentionSpec) -> list[Problem]:
        """`kv_dtype` where this target has no kernels for it (issue 44): refused, never ignored."""
        if spec.kv_dtype is None or spec.kv_dtype in self.kv_dtypes:
            return []
        return [Problem(f"kv_dtype {spec.kv_dtype}: not built on target {self.name} yet (issue 44)", key="kv_dtype",
                        hint="leave kv_dtype out (K and V in the spec's dtype); target wgsl builds it")]

    def expression_tiles(self, spec: AttentionSpec) -> str:
        """What this target's kernels do with a mask expression's tile classification (`attngen
        check`'s line, attngen.plan.expr_blocks.describe)."""
        return "the kernel skips wholly hidden tiles and tests mixed ones per element"

    def expression_problems(self, spec: AttentionSpec) -> list[Problem]:
        """The spec's score and mask expressions (issue 42), each refused at its expression: the
        default of a target that compiles none (cuda and wgsl override it with what they compile;
        the float64 reference evaluates every one: attngen.reference)."""
        why = f"not compiled by target {self.name} yet (issue 42)"
        hint = "attngen.reference evaluates it; for a kernel today, use a named mask or mask custom"
        problems = []
        if spec.mask.kind == "expr":
            problems.append(Problem(f"mask expressions are {why}", key="mask.expr", hint=hint))
        if spec.score is not None:
            problems.append(Problem(f"score expressions are {why}", key="score.expr", hint=hint))
        return problems  # (every input is read by one of them: the reader makes sure)

    def _step(self, module: str, function: str):
        if self.package is None:
            raise NotImplementedError(f"backend {self.name} implements no {function}")
        return getattr(importlib.import_module(f"{self.package}.{module}"), function)

    def configure(self, spec: AttentionSpec, profile: Profile):
        """The tile configuration (tile_q, tile_kv, buffers, smem_bytes, summary()); raise
        Problem when the spec's own choices cannot work."""
        return self._step("config", "configure")(spec, profile)

    def lower(self, spec: AttentionSpec, profile: Profile, config, entry: str) -> Lowered:
        return self._step("lower", "lower")(spec, profile, config, entry)

    def render(self, plan: KernelPlan) -> str:
        return self._step("emit", "render_source")(plan)

    def manifest(self, plan: KernelPlan) -> dict:
        return self._step("emit", "render_manifest")(plan)

    def describe(self, plan: KernelPlan) -> list[str]:
        """What `attngen check` prints under a plan (one line each)."""
        c = plan.config
        return [plan.summary(), f"on-chip memory: {plan.smem_bytes} bytes",
                f"grid: ({', '.join(plan.grid)}) x {plan.threads} threads"] + (
            [f"features: {', '.join(plan.features)}"] if plan.features else []) + (
            [f"buffers: {c.smem_summary}"] if hasattr(c, "smem_summary") else [])

    def describe_ir(self, plan: KernelPlan) -> list[str]:
        """Lines `attngen build --emit ir` adds under describe's: what the emitter derives from the
        plan in full (the CUDA backend: each namespace's KernelShape, the fields its templates
        test). None by default."""
        return []

    def compile(self, spec: AttentionSpec, profile: Profile | str | None = None):
        """A runnable kernel for this machine's device (attngen.runtime.kernel.Kernel)."""
        raise NotImplementedError(f"target {self.name} generates source only: it has no runtime here")

    # -- attngen precompile ---------------------------------------------------------------------
    # What `--device` names for this target, in words ("" when the target builds nothing ahead of time).
    device_kinds: str = ""

    def precompile_devices(self) -> tuple:
        """The devices `attngen precompile` builds for when none are named."""
        return ()

    def precompile(self, spec: AttentionSpec, device: str) -> bool:
        """Build `spec` for `device` into the disk cache, as compile() on such a device will look
        it up; True when it was there already. ValueError for a device name this target does
        not know."""
        raise NotImplementedError(f"target {self.name} builds its kernels when they are loaded: there is "
                                  "nothing to precompile")

    # -- attngen tune -----------------------------------------------------------------------------
    def tune_space(self, spec: AttentionSpec) -> list:
        """The choices `attngen tune` sweeps: dicts of tile_q, tile_kv and options (this target's
        `target NAME { ... }` values); the planner refuses the illegal ones."""
        return []

    def plan_fields(self, plan: KernelPlan) -> dict:
        """{short name: value} of the choices that tell one plan of a spec from another (tiles,
        threads, stages, ...), in the order a person reads them: `attngen tune` labels each
        candidate with those that vary among its candidates. Tile q and kv by default."""
        return {"q": plan.tile_q, "kv": plan.tile_kv}

    def device_identity(self) -> str:
        """This machine's device, as tuned results are keyed: vendor, architecture, device, driver."""
        raise NotImplementedError(f"target {self.name} has no runtime here")

    def describe_backward(self, plan: KernelPlan) -> list[str]:
        """Lines for `attngen check` on the backward of `plan` (entry points, grids, memory, its
        workspace); empty: this target builds no backward (yet)."""
        return []

    def backward_problems(self, plan: KernelPlan) -> list:
        """Why `plan` has no backward on this target (empty: it has one): the neutral rules
        (attngen.plan.backward.problems with backward_expressions) by default."""
        from ..plan.backward import problems
        return problems(plan.spec, self.backward_expressions)

    def helper_sources(self, plan: KernelPlan) -> dict:
        """{name: source} of the helper modules a foreign runtime runs beside the kernel
        (`attngen build --emit NAME`); none by default."""
        return {}

    # -- attngen serve-demo -----------------------------------------------------------------------
    def demo_files(self, spec: AttentionSpec, profile: Profile) -> dict:
        """{file name: text} of a static web page that runs the kernel (attngen serve-demo);
        targets without a web runtime raise NotImplementedError."""
        raise NotImplementedError(f"target {self.name} has no web demo")

    # -- attngen run ------------------------------------------------------------------------------
    def device_inputs(self, spec: AttentionSpec, host: tuple, options: dict) -> tuple[tuple, dict]:
        """(q, k, v, options) on the device, from float32 host arrays and host options."""
        raise NotImplementedError(f"target {self.name} has no runtime here")

    def check_sizes(self, kernel, launch, inputs: dict, mask: tuple | None = None) -> None:
        """A LaunchError when a call of `kernel` resolved to `launch` (attngen.runtime.launch.resolve)
        with inputs of {name: bytes} (and a custom mask of (shape (B, H, Lq, Lk), kind "bool" or
        "additive")) would pass a limit of the target that the call checks (grids, buffer sizes):
        the same rules, from shapes alone, before anything is allocated (attngen run checks each
        --shape with it). Nothing by default."""

    def time_call(self, kernel, args: tuple, options: dict, repeat: int) -> float:
        """Median milliseconds of `repeat` calls after a warm-up call (a backend whose calls wait
        for the device warms it up for longer, warm_up)."""
        import statistics
        import time
        kernel(*args, **options)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            kernel(*args, **options)
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    def __repr__(self) -> str:
        return f"<attngen backend '{self.name}'>"


# Seconds of calls before a candidate is timed (attngen tune): the GPU idles while the host
# checks the candidate against the float64 reference, its clocks drop, and a few short timed
# calls do not bring them back (H100, WGSL: rows timed 2-3x slow; benchmarks/NOTES.md 2026-11-24).
WARM_UP_S = 0.3


def warm_up(call, seconds: float = WARM_UP_S) -> None:
    """Run `call` (which must wait for its work to finish) until `seconds` have passed, at least once."""
    import time
    start = time.perf_counter()
    call()
    while time.perf_counter() - start < seconds:
        call()

