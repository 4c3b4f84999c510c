"""The WGSL kernel family on subgroup matrices (issue 43; templates/wgsl/kernel_sgmat.wgsl.j2):
Q K^T and P V on the GPU's matrix units through WebGPU's subgroup matrices (Dawn's
`chromium-experimental-subgroup-matrix`), the online softmax in scalar code over S in
workgroup memory.

A profile lists the shapes its adapter offers in `[features] subgroup_matrix_configs` (M, N, K,
component and result types, subgroup sizes: Dawn's AdapterPropertiesSubgroupMatrixConfigs); the
runtime's profile of a live Dawn adapter takes the adapter's own list (devices.adapter_profile).
`target wgsl { matrix=auto|on|off }` asks for the family: `on` plans it or refuses the spec with
the checker's reason (problems); `auto` (the default) plans it where the profile guarantees the
features, offers a usable config at its only subgroup size, and the family serves the spec and fits
the profile (auto_picks), else the scalar family (kernel.wgsl.j2), silently: measured on the H200
through Dawn, 1.04-1.89x the scalar family on every row of the WGSL grid. At load, a kernel planned
under `auto` for a profile the live adapter does not match is planned again without the family
(kernel.py); under `on` it is a LaunchError.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...lang.spec import AttentionSpec
from ...plan.kernel_plan import Problem, place_buffers
from ...plan.profiles import Profile, ProfileError

# WebGPU's name of the feature and the WGSL extension it enables.
FEATURE = "chromium-experimental-subgroup-matrix"
DIRECTIVE = "chromium_experimental_subgroup_matrix"
HEAD_DIMS = (64, 128)  # the head dims the family takes so far (d_qk = d_v)
# Subgroups per workgroup by head dim (each owns M rows of the Q tile), and keys per K/V tile:
# the fastest of benchmarks/probes/probe_sgmat_staging.py's loop on the H200 (d64: 8 subgroups,
# 32 keys; d128: 4 subgroups, 32 keys: 8 would pass 48 KiB).
SUBGROUPS = {64: 8, 128: 4}
TILE_KV = 32
# Padding (elements, 16 bytes each) of the rows of K and V (f16) and of the columns of each
# subgroup's S (f32) and P (f16) in workgroup memory: without it the matrix loads' rows and the
# softmax's invocations fall on the same banks.
KV_PAD, S_PAD, P_PAD = 8, 4, 8
_CONFIG_KEYS = ("m", "n", "k", "component", "result")


@dataclass(frozen=True)
class MatrixConfig:
    """One subgroup-matrix shape: left M x K times right K x N accumulated into an M x N result."""
    m: int
    n: int
    k: int
    component: str  # f16, f32, i8, u8, ...
    result: str
    min_subgroup_size: int = 0  # 0: not reported
    max_subgroup_size: int = 0

    @property
    def summary(self) -> str:
        return f"{self.m}x{self.n}x{self.k} {self.component} -> {self.result}"


def matrix_configs(profile: Profile) -> tuple[MatrixConfig, ...]:
    """The profile's subgroup-matrix configs ([features] subgroup_matrix_configs); () when the
    profile has none or lacks the feature. A malformed entry is a ProfileError."""
    if not profile.may_use_feature(FEATURE):
        return ()
    out = []
    for row in profile.features.get("subgroup_matrix_configs", ()):
        if not isinstance(row, dict) or any(key not in row for key in _CONFIG_KEYS):
            raise ProfileError(f"profile {profile.name}: each [features] subgroup_matrix_configs entry needs "
                               f"{', '.join(_CONFIG_KEYS)} (got {row!r})")
        out.append(MatrixConfig(int(row["m"]), int(row["n"]), int(row["k"]), str(row["component"]),
                                str(row["result"]), int(row.get("min_subgroup_size", 0)),
                                int(row.get("max_subgroup_size", 0))))
    return tuple(out)


def from_adapter(configs) -> list[dict]:
    """Dawn's list (wgpudawn extras.get_adapter_properties(adapter)["subgroup_matrix_configs"]) as
    the profile's [features] subgroup_matrix_configs entries."""
    return [{"m": int(c["m"]), "n": int(c["n"]), "k": int(c["k"]), "component": str(c["component_type"]),
             "result": str(c["result_component_type"]), "min_subgroup_size": int(c.get("min_subgroup_size", 0)),
             "max_subgroup_size": int(c.get("max_subgroup_size", 0))} for c in configs]


def _usable(c: MatrixConfig) -> bool:
    """f16 operands into f32 results, tiles that divide the kernel's (TILE_KV and the head dims
    divisible by N and K, TILE_KV by M: the Q tile passes through sK TILE_KV rows at a time), one
    known subgroup size (the kernel counts subgroups as WORKGROUP / size) that is a power-of-two
    multiple of M (the softmax's invocations per row) dividing N and TILE_KV, and M x N."""
    size = c.max_subgroup_size
    lanes = size // c.m if c.m and size % c.m == 0 else 0
    return (c.component == "f16" and c.result == "f32" and TILE_KV % c.n == 0 and TILE_KV % c.k == 0
            and TILE_KV % c.m == 0 and all(d % c.n == 0 and d % c.k == 0 for d in HEAD_DIMS)
            and c.min_subgroup_size == size > 0 and lanes > 0 and lanes & (lanes - 1) == 0
            and c.n % lanes == 0 and TILE_KV % lanes == 0 and (c.m * c.n) % size == 0)


def choose(profile: Profile) -> MatrixConfig | None:
    """The config the family plans with: 16x16x16 f16 -> f32 where offered, else the usable one
    with the largest M x N x K; None when none is usable."""
    usable = [c for c in matrix_configs(profile) if _usable(c)]
    if not usable:
        return None
    return max(usable, key=lambda c: ((c.m, c.n, c.k) == (16, 16, 16), c.m * c.n * c.k))


def requested(spec: AttentionSpec) -> str:
    """auto, on or off: the spec's `target wgsl { matrix=... }`."""
    return spec.options("wgsl").get("matrix") or "auto"


def uses_family(spec: AttentionSpec, profile: Profile, storage: str | None) -> bool:
    """Whether `spec` is planned on the subgroup-matrix family for `profile` (storage:
    config.f16_storage's answer): `on` (the checker refused what the family does not take), or
    `auto` where auto_picks() says so."""
    mode = requested(spec)
    return mode == "on" or (mode == "auto" and auto_picks(spec, profile, storage))


def auto_picks(spec: AttentionSpec, profile: Profile, storage: str | None) -> bool:
    """`matrix=auto`'s choice: the family where why_not() finds nothing; else the scalar family
    runs the spec without a word."""
    return why_not(spec, profile, storage) is None


def why_not(spec: AttentionSpec, profile: Profile, storage: str | None) -> str | None:
    """Why `matrix=auto` keeps `spec` off the family on `profile`, in words (None: it takes it): the
    profile must guarantee the family's features (optional ones are used only on request, as for
    subgroups), offer a usable config whose subgroup size is the profile's only one (the kernel
    counts subgroups as WORKGROUP / size), and the family must serve the spec (refusals()) and fit
    the profile's limits (fit_problem())."""
    lacking = [f for f in (FEATURE, "shader-f16", "subgroups") if not profile.has_feature(f)]
    if lacking:
        return f"profile {profile.name} does not guarantee {' and '.join(lacking)}"
    mc = choose(profile)
    if mc is None:
        return f"profile {profile.name} offers no f16 -> f32 subgroup-matrix config the family takes"
    sizes = (profile.features.get("subgroup_min_size"), profile.features.get("subgroup_max_size"))
    if sizes != (mc.max_subgroup_size, mc.max_subgroup_size):
        return (f"profile {profile.name} runs subgroups of {sizes[0]} to {sizes[1]}, the config "
                f"{mc.summary} exactly {mc.max_subgroup_size}")
    refused = refusals(spec, profile, storage)
    if refused:
        return refused[0].message.replace("matrix=on: ", "", 1)
    why = fit_problem(spec, profile, mc)
    return None if why is None else why.replace("matrix=on: ", "", 1)


def with_mode(spec: AttentionSpec, mode: str) -> AttentionSpec:
    """`spec` with `target wgsl { matrix=mode }` (auto: the option left out, as when not given)."""
    from dataclasses import replace
    options = {k: v for k, v in spec.options("wgsl").items() if k != "matrix"}
    if mode != "auto":
        options["matrix"] = mode
    others = tuple((t, o) for t, o in spec.targets if t != "wgsl")
    return replace(spec, targets=others + ((("wgsl", tuple(sorted(options.items()))),) if options else ()))


def without_family(profile: Profile) -> Profile:
    """`profile` less the family's feature and configs, under its own name: what it plans for
    `matrix=auto` is the scalar family's plan (the plan `matrix=off` gives, with the spec's text
    unchanged)."""
    strip = lambda key: [f for f in profile.features.get(key, ()) if f != FEATURE]  # noqa: E731
    return profile.narrowed(features={"guaranteed": strip("guaranteed"), "optional": strip("optional"),
                                      "subgroup_matrix_configs": []})


def problems(spec: AttentionSpec, profile: Profile, storage: str | None) -> list[Problem]:
    """Why `matrix=on` cannot plan `spec` on `profile` (storage: config.f16_storage's answer);
    nothing under auto and off (auto falls back to the scalar family)."""
    return refusals(spec, profile, storage) if requested(spec) == "on" else []


def refusals(spec: AttentionSpec, profile: Profile, storage: str | None) -> list[Problem]:
    """Why the family cannot plan `spec` on `profile`, as the checker words them for `matrix=on`."""
    key, hint = "target.wgsl", "use matrix=off (or auto): the scalar family runs it"
    missing = [f for f in (FEATURE, "shader-f16", "subgroups") if not profile.may_use_feature(f)]
    if missing:
        return [Problem(f"matrix=on needs the {' and '.join(missing)} feature(s), which profile {profile.name} "
                        "does not offer (target wgsl)", key=key,
                        hint="plan for a profile with subgroup matrices (dawn-vulkan-nvidia) or use matrix=off")]
    if choose(profile) is None:
        have = ", ".join(c.summary for c in matrix_configs(profile)) or "none"
        return [Problem(f"matrix=on: profile {profile.name} offers no f16 -> f32 subgroup-matrix config the "
                        f"family takes (one subgroup size, a power-of-two multiple of M dividing M x N; N, K and M "
                        f"dividing {TILE_KV} and N and K the head dims; "
                        f"has: {have})", key=key, hint=hint)]
    why = []
    if spec.dtype != "f16":
        why.append(f"storage {spec.dtype} (the family takes f16 storage)")
    elif storage == "packed":
        why.append("f16=packed (the matrices read native f16)")
    if spec.head_dim_qk != spec.head_dim_v or spec.head_dim_qk not in HEAD_DIMS:
        why.append(f"head_dim qk={spec.head_dim_qk} v={spec.head_dim_v} (the family takes "
                   f"{' or '.join(map(str, HEAD_DIMS))}, equal)")
    if spec.mask.kind not in ("none", "causal", "window", "custom"):
        why.append(f"mask {spec.mask.kind} (the family takes none, causal, window and custom)")
    if spec.score is not None or spec.inputs:
        why.append("score expressions and inputs")
    if spec.schedule.kind != "fused":
        why.append(f"schedule {spec.schedule.kind} (the family is the fused prefill schedule)")
    if "f16" in (spec.acc_qk, spec.acc_pv):
        why.append("accumulate f16 (the matrices accumulate in f32)")
    if spec.options("wgsl").get("subgroups") == "off":
        why.append("subgroups=off (the family places subgroups by @builtin(subgroup_id))")
    if spec.tile.q is not None or spec.tile.kv is not None or spec.tile.d is not None:
        why.append("tile sizes from the spec (the family's tiles follow the matrix config)")
    if spec.options("wgsl").get("workgroup") is not None:
        why.append("workgroup from the spec")
    if why:
        return [Problem("matrix=on: the subgroup-matrix family does not take " + "; ".join(why) + " yet",
                        key=key, hint=hint)]
    mc = choose(profile)
    misaligned = alignment_problems(layout(spec, mc)[0], matrix_offsets(spec, mc))
    if misaligned:
        return [Problem(f"matrix=on: with config {mc.summary} of profile {profile.name} the workgroup memory "
                        f"cannot be laid out {ALIGN}-byte aligned for the subgroup-matrix built-ins "
                        f"({'; '.join(misaligned)}; target wgsl)", key=key, hint=hint)]
    return []


def layout(spec: AttentionSpec, mc: MatrixConfig):
    """The family's workgroup buffers and their bytes (place_buffers)."""
    subgroups, d = SUBGROUPS[spec.head_dim_qk], spec.head_dim_qk
    return place_buffers([
        ("sK", "f16", 1, TILE_KV, d + KV_PAD, "the K tile (first the Q tile, TILE_KV rows at a time)"),
        ("sV", "f16", 1, TILE_KV, spec.head_dim_v + KV_PAD, "the V tile (inf and NaN replaced by 0)"),
        ("sS", "f32", 1, subgroups * TILE_KV, mc.m + S_PAD, "each subgroup's S, column-major; acc on its way"),
        ("sP", "f16", 1, subgroups * TILE_KV, mc.m + P_PAD, "each subgroup's P, column-major"),
        ("sFlags", "u32", 1, 1, 4, "[0] the last tile that rescales acc, [1] the last whose V holds inf or NaN"),
    ])


# Alignment on workgroup memory (measured on the H200, Dawn on NVIDIA's Vulkan driver:
# benchmarks/probes/probe_sgmat_parts.py): a subgroup-matrix load or store whose base is not
# 16-byte aligned reads and writes as if the misalignment were not there (an f16 tile at an
# 8-byte offset was read from the offset's 16-byte boundary), and a 4-byte workgroup variable
# beside the f16 tiles misplaced them. So every workgroup variable is a multiple of 16 bytes,
# and every offset and row stride a subgroup-matrix built-in gets on workgroup memory is a
# multiple of 16 bytes (8 f16, 4 f32 elements).
ALIGN = 16
_BYTES = {"f16": 2, "f32": 4, "u32": 4, "i32": 4}


def alignment_problems(buffers, offsets) -> list[str]:
    """What breaks the alignment rule above: buffers (place_buffers' Buffers: each a multiple of
    ALIGN bytes), offsets ((buffer name, what, elements): each offset or stride term a
    subgroup-matrix built-in adds on that buffer, as a multiple of ALIGN bytes)."""
    out = []
    kinds = {b.name: b.dtype for b in buffers}
    for b in buffers:
        if b.bytes % ALIGN:
            out.append(f"workgroup variable {b.name} is {b.bytes} bytes, not a multiple of {ALIGN}")
    for name, what, elements in offsets:
        if elements * _BYTES[kinds[name]] % ALIGN:
            out.append(f"{what} on {name} is {elements} {kinds[name]} elements, not a multiple of {ALIGN} bytes")
    return out


def matrix_offsets(spec: AttentionSpec, mc: MatrixConfig) -> list[tuple[str, str, int]]:
    """The offset and stride terms (elements) the template's subgroup-matrix calls use on each
    workgroup buffer (kernel_sgmat.wgsl.j2: Q and K from sK, V from sV, S and acc to and from sS,
    P from sP)."""
    ks, vs, sc, pc = spec.head_dim_qk + KV_PAD, spec.head_dim_v + KV_PAD, mc.m + S_PAD, mc.m + P_PAD
    return [("sK", "the row stride", ks), ("sK", "a subgroup's Q rows (MAT_M rows)", mc.m * ks),
            ("sK", "MAT_N keys", mc.n * ks), ("sK", "MAT_K columns", mc.k),
            ("sV", "the row stride", vs), ("sV", "MAT_K keys", mc.k * vs), ("sV", "MAT_N columns", mc.n),
            ("sS", "the column stride", sc), ("sS", "a subgroup's region", TILE_KV * sc),
            ("sS", "MAT_N keys", mc.n * sc), ("sS", "the output's row stride (MAT_N + 4)", mc.n + 4),
            ("sP", "the column stride", pc), ("sP", "a subgroup's region", TILE_KV * pc),
            ("sP", "MAT_K keys", mc.k * pc)]


def fit_problem(spec: AttentionSpec, profile: Profile, mc: MatrixConfig) -> str | None:
    """Why the family's kernel with config `mc` does not fit `profile` (alignment, workgroup memory,
    invocations), or None."""
    buffers, smem = layout(spec, mc)
    misaligned = alignment_problems(buffers, matrix_offsets(spec, mc))
    if misaligned:
        return (f"matrix=on: with config {mc.summary} the kernel's workgroup memory cannot be laid out "
                f"16-byte aligned for the subgroup-matrix built-ins ({'; '.join(misaligned)})")
    limit = profile.limit("workgroup_storage_bytes")
    if smem > limit:
        return (f"matrix=on: the subgroup-matrix kernel needs {smem} bytes of workgroup memory, "
                f"profile {profile.name} allows {limit}")
    workgroup = SUBGROUPS[spec.head_dim_qk] * mc.max_subgroup_size
    if workgroup > profile.limit("invocations_per_workgroup"):
        return (f"matrix=on: a workgroup of {workgroup} invocations exceeds profile {profile.name}'s "
                f"{profile.limit('invocations_per_workgroup')}")
    return None


def matrix_config(spec: AttentionSpec, profile: Profile, config_type):
    """The WgslConfig (config_type) of the family: TILE_Q = SUBGROUPS x M rows, TILE_KV keys, a
    workgroup of SUBGROUPS subgroups. The scalar family's sub-block fields are set so that the
    shared code (grid, workgroup size) reads them right: threads_per_row = the workgroup's
    invocations per row of the tile (the softmax's LANES)."""
    mc = choose(profile)
    if mc is None:
        raise Problem(f"matrix=on: profile {profile.name} has no usable subgroup-matrix config", key="target.wgsl")
    why = fit_problem(spec, profile, mc)
    if why is not None:
        raise Problem(why, key="target.wgsl")
    tile_q = SUBGROUPS[spec.head_dim_qk] * mc.m
    workgroup = SUBGROUPS[spec.head_dim_qk] * mc.max_subgroup_size
    buffers, smem = layout(spec, mc)
    return config_type(tile_q, TILE_KV, workgroup // tile_q, 1, True, spec.head_dim_qk, spec.head_dim_v,
                       buffers, smem, pad=0, matrix=mc)
