"""The gradients of `grad` inputs in the CUDA backward (issue 42; docs/backward.md): what the fast
(wgmma) family adds to its recompute step for a score that reads a `grad` input, and what the
deterministic (fma) family adds to its dK/dV step, without atomics (`source`'s `atomic`; below).

    struct ExprGrads { float* bias; ... };        // one f32 buffer per grad input, its shape, zeroed
    void grad_inputs_add(in, g, ds, s, b, h, hkv, q, k, Lq, Lk)

For each visible pair the kernel calls grad_inputs_add with ds = d loss / d score (P (dP - D),
before the factor d score / d s) and s, the scaled score: for every distinct read of every grad
input (attngen.plan.expr_grad.input_derivatives) it adds ds * d score / d that read into the
read's entry, with atomicAdd (f32, in no fixed order: the entries' last bits may differ between
runs). The read's indices are the score's (a read out of its bounds adds nothing: the score's
loader has reported it). Each derivative is a function of its own, `grad_NAME_M` (read M of
input NAME, from 1), under a comment quoting it.

Reads that many pairs of a step add into (`staged_reads`: a relative-bias table at a function of
k - q, a per-head slope) are summed per step first, in the fast family: a warpgroup's step (kBlockM
rows x 64 keys) adds into a run of at most kBlockM + 63 entries of such a read (one entry where the
read names neither q nor k), so its pairs add into a shared-memory copy of that run
(`red_shared_add`, grad_sums[stage][warpgroup]) and `grad_stage_flush`, called in the next step
(or after the loop) once the warpgroup's adds are done, adds each entry of the run with one
atomicAdd and zeroes the copy. A pair whose entry is outside the run (never, by the analysis)
adds with atomicAdd directly. Two refinements keep many pairs off one word: a step whose pairs
all read one entry of a read (grad_stage_uniform) sums it in registers and adds once per warp
(grad_stage_uniform_add), and a read at a function of k - q in the other steps is summed by
diagonals, over a lane's two pairs and a chain of lanes, before its adds (_band_source).

The deterministic family (atomic=False) adds a read that names one entry per pair
(attngen.plan.backward.injective) with a plain `+=`: one thread per entry. Every other input
(*partials*: a table read at k - q, slopes[h], a bias without b) goes through partial sums, as
the WGSL backward does: the recompute keeps each pair's ds and s in shared memory (Tiles' gds and
gs); after the tile pair, grad_partials_add walks the tile's pairs in order and adds ds * d score
/ d entry into the block's own slice of the input's partials (`ExprGrads::NAME_partials`), each
slice word by the thread whose index is its offset modulo kThreads; the entry point
<entry>_bwd_grads (grad_partials_sum) then sums, per entry, the slices of the blocks that can
name it in grid order. A slice spans the input's axes, except an axis indexed by its own name in
every read, k (the block's kTile keys), b, hkv (one) or h (without hkv: the group's heads):
attngen.plan.grad_partials decides which inputs and axes, and this module renders them. No
atomics: the same bits on every run. A pair whose ds is exactly 0 adds nothing.
"""

from __future__ import annotations

from ...lang.expr import INT, Binary, Fn, Load, Unary, Var, format_expr, inputs_read, walk
from ...plan import grad_partials
from ...plan.expr_grad import as_real, grad_inputs, grad_reads, input_derivatives
from . import expr as cuda_expr

# Reads summed per step in shared memory at most (2 stages x 2 warpgroups x kBlockM + 63 floats each:
# 2 KB a read, static shared memory beside the kernel's dynamic ~200 KB).
MAX_STAGED = 4


def derivatives(spec) -> list:
    """d score / d read of every distinct read of every grad input (their helpers are rendered
    with the score's)."""
    return [as_real(d) for i in grad_inputs(spec) for _, d in input_derivatives(spec.score, i.name)]


def _free(e) -> bool:
    """Whether integer expression `e` names neither q nor k and reads no input (the same value at
    every pair of a step: b, h, hkv, Lq, Lk, constants)."""
    return e.type == INT and not any(isinstance(n, Load) or (isinstance(n, Var) and n.name in ("q", "k"))
                                     for n in walk(e))


def _relative(e) -> int:
    """+1 (-1) where integer expression `e` is a nondecreasing (nonincreasing) function of k - q
    that moves by at most 1 per unit of k - q, with q and k nowhere else: `k - q` or `q - k`, plus
    or minus terms free of them (_free), negated, clamp / min / max against bounds free of them;
    0 otherwise."""
    q, k = Var("q", INT), Var("k", INT)
    if isinstance(e, Binary) and e.op == "-" and (e.a, e.b) in ((k, q), (q, k)):
        return 1 if e.a == k else -1
    if isinstance(e, Binary) and e.op in ("+", "-"):
        if _free(e.b):
            return _relative(e.a)
        if _free(e.a):
            return _relative(e.b) * (1 if e.op == "+" else -1)
    if isinstance(e, Unary) and e.op == "-":
        return -_relative(e.x)
    if isinstance(e, Fn) and e.name == "clamp" and all(_free(a) for a in e.args[1:]):
        return _relative(e.args[0])
    if isinstance(e, Fn) and e.name in ("min", "max") and len(e.args) == 2:
        if _free(e.args[1]):
            return _relative(e.args[0])
        if _free(e.args[0]):
            return _relative(e.args[1])
    return 0


def staged_reads(spec) -> list:
    """[(input, M, read, direction)] of the `grad` reads the fast family sums per step in shared
    memory (module docstring), at most MAX_STAGED: every index free of q and k (direction 0: one
    entry per step), or one a _relative function of k - q and the others free (+1 / -1: the run's
    first entry is at the step's smallest / largest k - q). The other reads add with atomicAdd at
    each pair."""
    out = []
    for inp in grad_inputs(spec) if spec.score is not None else ():
        for m, (ld, _) in enumerate(input_derivatives(spec.score, inp.name), 1):
            free = [_free(i) for i in ld.indices]
            moving = [_relative(i) for i, f in zip(ld.indices, free) if not f]
            if len(out) < MAX_STAGED and (not moving or (len(moving) == 1 and moving[0] != 0)):
                out.append((inp, m, ld, moving[0] if moving else 0))
    return out


def site_of(spec, exprs) -> dict:
    """cuda_expr.site_numbers(spec), with each read of `exprs` (derived expressions: their reads
    may be new objects) given the site of the same read in the score (0 where it is in bounds)."""
    from ...plan.expr_reads import in_bounds
    found = cuda_expr.sites(spec)
    out = cuda_expr.site_numbers(spec)
    for e in exprs:
        for n in walk(e):
            if isinstance(n, Load) and id(n) not in out:
                out[id(n)] = 0 if in_bounds(n, spec.inputs) else next(
                    at + 1 for at, (what, m) in enumerate(found) if what == "score" and m == n)
    return out


def partials(spec) -> list:
    """attngen.plan.grad_partials.partials of the deterministic family: a read at hkv that is once
    per pair is added directly (a block's one thread adds the GQA group's heads in turn), so only
    the inputs with a read that is not once per pair go through partial sums."""
    return grad_partials.partials(spec, direct_at_hkv=True)


def fields(spec, atomic: bool) -> list:
    """ExprGrads' pointers, in order: each grad input's gradient, then (deterministic family) each
    partials input's partial sums (NAME_partials)."""
    return [i.name for i in grad_inputs(spec)] + ([] if atomic else [f"{p.input.name}_partials" for p in partials(spec)])


SUM_BLOCKS = 256  # blocks of <entry>_bwd_grads: their threads stride over the gradients' entries
PARTIALS_LIMIT_BYTES = 1 << 32  # the partial sums a call may allocate (4 GiB)

def _full(axis) -> str:
    """The C++ extent of an input's axis (ExprInputs' ext_NAME, or its fixed size)."""
    return f"in.ext_{axis}" if isinstance(axis, str) else str(axis)


def _slice_extents(p) -> list:
    """The C++ extents of one block's slice of a partials input (`p`, grad_partials.Partials)."""
    return p.extents("kTile", "a.group", "1", _full)


def partial_words(spec, shapes: dict, n_slices: int, tile: int, group: int) -> dict:
    """{NAME_partials: words} of a call: `n_slices` dK/dV blocks (its grid), each with a slice of
    every partials input (`shapes`: the inputs' shapes in the call)."""
    return {f"{p.input.name}_partials": n_slices * p.words(shapes[p.input.name], tile, group) for p in partials(spec)}


def check_partials(kernel: str, words: dict) -> None:
    """A LaunchError where a call's partial sums (partial_words) exceed PARTIALS_LIMIT_BYTES (this
    target's own bound: the launcher allocates them in device memory beside the call's tensors;
    the WGSL workspace is bounded by the device's storage-binding limit instead)."""
    from ...errors import LaunchError
    total = 4 * sum(words.values())
    if total > PARTIALS_LIMIT_BYTES:
        raise LaunchError(f"kernel '{kernel}' (cuda, deterministic backward): the partial sums of the `grad` inputs "
                          f"({', '.join(n.removesuffix('_partials') for n in words)}) would take {total} bytes, above "
                          f"the {PARTIALS_LIMIT_BYTES} this target allocates for them (one slice per dK/dV block); "
                          "a smaller batch or sequence, or the fast family (backward=auto on cuda-sm90, f16 / bf16), "
                          "computes it")


def source(spec, atomic: bool = True) -> str:
    """ExprGrads, the derivative functions and grad_inputs_add ("" without grad inputs). `atomic`:
    atomicAdd (the fast family); False: a plain `+=` (the deterministic family, for reads that
    name one entry per pair, attngen.plan.backward.injective: one thread adds into each entry, a
    GQA group's heads in the loop's order), and for the others grad_partials_add and
    grad_partials_sum (module docstring)."""
    grads = grad_inputs(spec)
    if not grads:
        return ""
    reads = grad_reads(spec)
    part = [] if atomic else partials(spec)
    sites = site_of(spec, [d for *_, d in reads])
    fields = "\n".join(f"    float* {i.name};  // d loss / d {i.name}: f32, {i.name}'s shape, zeroed before the launch"
                        for i in grads) + "".join(
        f"\n    float* {p.input.name}_partials;  // {p.input.name}'s partial sums: one slice per dK/dV block, zeroed"
        for p in part)
    how = "added into with atomicAdd" if atomic else "each entry added into by one thread (no atomics)"
    out = [f"// The gradients of the `grad` inputs (issue 42): one f32 buffer each, {how}.\n"
           f"struct ExprGrads {{\n{fields}\n}};\n"]
    staged = {(inp.name, m): direction for inp, m, _, direction in staged_reads(spec)} if atomic else {}
    if staged:
        out.append(_stage_head(staged))
    body, flush, uniform, warp_add, at = [], [], [], [], ""
    band, band_pair, band_end = [], [], []  # (the staged reads at a function of k - q: _band_source)
    args = "s, b, h, hkv, q, k, Lq, Lk"
    for inp, m, ld, d in reads:
        name = f"grad_{inp.name}_{m}"
        out.append(cuda_expr.function(name, d, f"d score / d {format_expr(ld)} =", sites))
        if any(p.input is inp for p in part):
            continue
        ext = [f"in.ext_{a}" if isinstance(a, str) else str(a) for a in inp.axes]
        idx = "".join(f"        const int i{n} = {cuda_expr.render(i, sites)};\n" for n, i in enumerate(ld.indices))
        bounds = " && ".join(f"i{n} >= 0 && i{n} < {x}" for n, x in enumerate(ext))
        value = f"ds * {name}({'in, ' if inputs_read(d) else ''}{args})"
        first = ""
        if (inp.name, m) in staged:
            j = len(uniform)  # its bit in grad_stage_uniform's word, its accumulator in gacc
            span = "1" if staged[(inp.name, m)] == 0 else "kGradRun"
            corner = {1: "q0 + kBlockM - 1, k0", -1: "q0, k0 + 63", 0: "q0, k0"}[staged[(inp.name, m)]]
            other = {1: "q0, k0 + 63", -1: "q0 + kBlockM - 1, k0", 0: None}[staged[(inp.name, m)]]
            off = f"{at} + " if at else ""
            out.append(f"// the entry of {format_expr(ld)} at (q, k), row-major in {inp.name}'s shape, and whether its\n"
                       f"// indices there are in {inp.name}'s bounds\n"
                       f"__device__ __forceinline__ long long {name}_at(const ExprInputs& in, int b, int h, int hkv, "
                       f"int q, int k, int Lq, int Lk) {{\n{idx.replace('        ', '    ')}"
                       f"    return {_flat(ext)};\n}}\n"
                       f"__device__ __forceinline__ bool {name}_in(const ExprInputs& in, int b, int h, int hkv, "
                       f"int q, int k, int Lq, int Lk) {{\n{idx.replace('        ', '    ')}"
                       f"    return {bounds};\n}}\n")
            same = (f" && {name}_at(in, b, h, hkv, {corner}, Lq, Lk) == {name}_at(in, b, h, hkv, {other}, Lq, Lk)"
                    if other else "")
            uniform.append(f"    if ({name}_in(in, b, h, hkv, {corner}, Lq, Lk){same}) u |= {1 << j}u;"
                           f"  // {format_expr(ld)}\n")
            warp_add.append(f"    if (uni & {1 << j}u) {{  // {format_expr(ld)}: the run's first entry\n"
                            f"        const float v = warp_sum(gacc[{j}]);\n"
                            f"        if (lane == 0 && v != 0.0f) red_shared_add(gsum + {off}0, v);\n    }}\n")
            first = (f"        if (uni & {1 << j}u) {{  // every pair of the step reads one entry, in bounds\n"
                     f"            gacc[{j}] += {value};\n        }} else {{\n")
            if staged[(inp.name, m)] != 0:  # (summed by _band_source's functions, not grad_inputs_add)
                jb = len(band)
                band.append(f"// {format_expr(ld)} in a band step: v, the sum of a lane's pairs at the k - q of (q, k), summed\n"
                            "// with the warp's other lanes at that k - q, added by the first of them into the step's run\n"
                            f"__device__ __forceinline__ void {name}_band(const ExprInputs& in, const ExprGrads& g, float v, "
                            "int b, int h, int hkv, int q, int k, int Lq, int Lk, int q0, int k0, float* gsum, int lane) {\n"
                            "    v = band_sum(v, lane);\n"
                            "    if (!band_first(lane) || v == 0.0f) return;\n"
                            + idx.replace("        ", "    ") + f"    if ({bounds}) {{\n"
                            f"        const long long at = {_flat(ext)}, slot = at - {name}_at(in, b, h, hkv, {corner}, Lq, Lk);\n"
                            f"        if (slot >= 0 && slot < {span}) red_shared_add(gsum + {off}slot, v);  // (the step's run)\n"
                            f"        else atomicAdd(g.{inp.name} + at, v);\n    }}\n}}\n")
                band_pair.append(f"    {{  // {format_expr(ld)}\n"
                                 f"        const float term = live ? {value} : 0.0f;\n"
                                 f"        if (uni & {1 << j}u) {{\n            gacc[{j}] += term;\n"
                                 f"        }} else if (e < 2) {{\n            gb.next[{jb}][e] = term;\n"
                                 "        } else {\n"
                                 f"            {name}_band(in, g, gb.pend[{jb}][e - 2] + term, b, h, hkv, q, k, Lq, Lk, q0, k0, gsum, lane);\n"
                                 f"            if (e == 3) {{\n                gb.pend[{jb}][0] = gb.next[{jb}][0];\n"
                                 f"                gb.pend[{jb}][1] = gb.next[{jb}][1];\n            }}\n        }}\n    }}\n")
                band_end.append(f"    if (!(uni & {1 << j}u)) {{  // {format_expr(ld)}\n"
                                f"        {name}_band(in, g, gb.pend[{jb}][0], b, h, hkv, q, k, Lq, Lk, q0, k0, gsum, lane);\n"
                                f"        {name}_band(in, g, gb.pend[{jb}][1], b, h, hkv, q + 1, k, Lq, Lk, q0, k0, gsum, lane);\n"
                                "    }\n")
            add = (f"            const float v = {value};\n"
                   f"            const long long at = {_flat(ext)}, slot = at - {name}_at(in, b, h, hkv, {corner}, Lq, Lk);\n"
                   f"            if (slot >= 0 && slot < {span}) red_shared_add(gsum + {off}slot, v);  // (the step's run)\n"
                   f"            else atomicAdd(g.{inp.name} + at, v);\n")
            flush.append(f"    for (int x = threadIdx.x % 128; x < {span}; x += 128) {{  // {format_expr(ld)}: the run "
                         f"from the entry at ({corner})\n"
                         f"        const float v = sums[{off}x];\n"
                         f"        if (v != 0.0f) atomicAdd(g.{inp.name} + {name}_at(in, b, h, hkv, {corner}, Lq, Lk) + x, v);\n"
                         f"        sums[{off}x] = 0.0f;\n    }}\n")
            at = f"{at} + {span}" if at else span
            if staged[(inp.name, m)] != 0:
                continue
        else:
            add = ((f"            atomicAdd(g.{inp.name} + {_flat(ext)}, " if atomic
                    else f"            g.{inp.name}[{_flat(ext)}] += (") + f"{value});\n")
        body.append(f"    {{  // {format_expr(ld)}\n{first}"
                    + idx.replace("        ", "    " * (3 if first else 2))
                    + ("    " if first else "") + f"        if ({bounds}) {{\n"
                    + (add.replace("            ", "                ") if first else add)
                    + ("            }\n        }\n" if first else "        }\n") + "    }\n")
    step = ", int q0, int k0, float* gsum, unsigned uni, float (&gacc)[kGradStaged]" if staged else ""
    out.append("// ds = d loss / d score at a visible pair (q, k), s its scaled score: each grad input's entry that\n"
               "// the pair reads gets ds times the score's derivative with respect to that read"
               + (" (reads summed per\n// step: into gsum, the step's sums of the warpgroup whose rows start at q0, keys at k0)"
                  if staged else "") + ".\n"
               f"__device__ __forceinline__ void grad_inputs_add(const ExprInputs& in, const ExprGrads& g, float ds, "
               f"float s, int b, int h, int hkv, int q, int k, int Lq, int Lk{step}) {{\n" + "".join(body) + "}\n")
    if staged:
        out.append(_stage_tail("".join(flush), "".join(uniform), "".join(warp_add)))
    if band:
        out.append(_band_source(band, band_pair, band_end))
    if part:
        out.append(_partials_source(spec, part, reads, sites))
    return "\n".join(out)


def _stage_head(staged: dict) -> str:
    run = "constexpr int kGradRun = kBlockM + 63;\n" if any(staged.values()) else ""
    return ("// The reads summed per step (expr_grads.staged_reads): a warpgroup's step (kBlockM rows, 64 keys)\n"
            "// adds into a run of kBlockM + 63 entries of a read that moves with k - q (1 of one that does not),\n"
            "// in shared memory: grad_sums[stage][warpgroup], zeroed before the loop and by each flush. A step\n"
            "// whose pairs all read one entry of a read (grad_stage_uniform: a clamped distance past its bound,\n"
            "// a read free of q and k) sums it in a register of each thread (gacc) instead, added once per warp\n"
            "// (grad_stage_uniform_add): so many adds into one word would serialise.\n"
            + run + f"constexpr int kGradSums = {' + '.join('1' if d == 0 else 'kGradRun' for d in staged.values())};\n"
            f"constexpr int kGradStaged = {len(staged)};  // the staged reads (gacc's registers)\n"
            "__shared__ float grad_sums[2][2][kGradSums];  // (added into by red_shared_add)\n")


def _stage_tail(flush: str, uniform: str, warp_add: str) -> str:
    return ("// Bit j: every pair of a warpgroup's step (rows q0 .. q0 + kBlockM - 1, keys k0 .. k0 + 63) reads the\n"
            "// same entry of staged read j, in bounds (the read is a monotone function of k - q: its entries at\n"
            "// the step's smallest and largest k - q are equal).\n"
            "__device__ __forceinline__ unsigned grad_stage_uniform(const ExprInputs& in, int b, int h, int hkv, int q0, "
            "int k0, int Lq, int Lk) {\n    unsigned u = 0;\n" + uniform + "    return u;\n}\n\n"
            "__device__ __forceinline__ float warp_sum(float v) {\n"
            "    #pragma unroll\n"
            "    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
            "    return v;\n}\n\n"
            "// After a step's pairs (every lane of the warp): the register sums of its uniform reads, summed over\n"
            "// the warp, into the first entry of their runs (one add per warp; NaN is added, 0 skipped).\n"
            "__device__ __forceinline__ void grad_stage_uniform_add(float* gsum, unsigned uni, const float (&gacc)"
            "[kGradStaged], int lane) {\n" + warp_add + "}\n\n"
            "// Before the loop (a barrier follows): every stage's sums zeroed.\n"
            "__device__ __forceinline__ void grad_stage_zero() {\n"
            "    for (int x = threadIdx.x; x < 2 * 2 * kGradSums; x += 2 * 128) (&grad_sums[0][0][0])[x] = 0.0f;\n}\n\n"
            "// A warpgroup's sums of one step (rows q0.., keys k0..) into the gradients, one atomicAdd per entry\n"
            "// of each run (entries no pair added into hold 0 and are skipped; NaN is added), and zeroed for the\n"
            "// step after next. Called by the warpgroup's threads once all of them have made the step's adds\n"
            "// (after the step's last barrier).\n"
            "__device__ __forceinline__ void grad_stage_flush(const ExprInputs& in, const ExprGrads& g, float* sums, int b, "
            "int h, int hkv, int q0, int k0, int Lq, int Lk) {\n"
            f"{flush}}}\n")


def _band_source(band: list, pair: list, end: list) -> str:
    """The staged reads at a function of k - q in steps whose pairs read several entries (the band
    of a relative table): summed by diagonals. A lane holds P^T at keys g (+ 8) and rows 8 n + 2 t (+ 1)
    (the accumulator layout; g = lane / 4, t = lane % 4), so its pair (n, e) and its pair (n + 1, e + 2)
    share a k - q, as do lanes (g, t), (g + 2, t + 1), ... (lanes L, L + 9, L + 18, L + 27): a
    lane's two pairs are summed in registers (GradBand: e = 0, 1 of step n wait for e = 2, 3 of step
    n + 1), then the lanes of one k - q by two shuffles, and the first of them adds the sum into the
    step's run: 18 adds a thread and step instead of 32, no two of a warp into one word."""
    return ("// The staged reads at a function of k - q in a band step (expr_grads._band_source): a lane's pairs\n"
            "// (n, e) and (n + 1, e + 2) share a k - q, as do lanes (g, t), (g + 2, t + 1), ... of the warp: summed\n"
            "// in registers, then over those lanes, and added once per k - q by the first lane of each chain.\n"
            f"constexpr int kGradBand = {len(band)};\n"
            "struct GradBand {\n"
            "    float pend[kGradBand][2];  // pairs (n, 0) and (n, 1) of the last step n, waiting for (n + 1, 2), (n + 1, 3)\n"
            "    float next[kGradBand][2];  // this step n's (n, 0) and (n, 1)\n};\n\n"
            "// v summed over the lanes at v's k - q: lane (g, t) adds (g + 2, t + 1) and then (g + 4, t + 2)'s sums\n"
            "__device__ __forceinline__ float band_sum(float v, int lane) {\n"
            "    const int g = lane / 4, t = lane % 4;\n"
            "    const float v9 = __shfl_down_sync(0xffffffffu, v, 9);\n"
            "    v += t < 3 && g < 6 ? v9 : 0.0f;\n"
            "    const float v18 = __shfl_down_sync(0xffffffffu, v, 18);\n"
            "    return v + (t < 2 && g < 4 ? v18 : 0.0f);\n}\n\n"
            "// the first lane of its k - q's chain (no lane (g - 2, t - 1))\n"
            "__device__ __forceinline__ bool band_first(int lane) { return lane % 4 == 0 || lane / 4 < 2; }\n\n"
            + "\n".join(band) + "\n"
            "// One pair (q, k) = (n, e) of the lane, in the order n, then e (every lane of the warp: shuffles): its\n"
            "// term ds * d score / d read (0 where the pair is hidden: `live`) into gacc (a uniform step), kept\n"
            "// (e < 2), or summed with the kept pair at its k - q and added (e >= 2).\n"
            "__device__ __forceinline__ void grad_band_pair(const ExprInputs& in, const ExprGrads& g, GradBand& gb, unsigned uni, "
            "float (&gacc)[kGradStaged], bool live, float ds, float s, int b, int h, int hkv, int q, int k, int Lq, int Lk, "
            "int q0, int k0, float* gsum, int e, int lane) {\n" + "".join(pair) + "}\n\n"
            "// After the lane's last pairs: the kept (n, 0) and (n, 1) of its last step n, at (q, k) and (q + 1, k).\n"
            "__device__ __forceinline__ void grad_band_end(const ExprInputs& in, const ExprGrads& g, const GradBand& gb, "
            "unsigned uni, int b, int h, int hkv, int q, int k, int Lq, int Lk, int q0, int k0, float* gsum, int lane) {\n"
            + "".join(end) + "}\n")


def _index_flat(parts: list, ext: list) -> str:
    flat = f"(long long)({parts[0]})"
    for x, e in zip(parts[1:], ext[1:]):
        flat = f"({flat}) * {e} + ({x})"
    return flat


def _partials_source(spec, part, reads, sites) -> str:
    adds, sums = [], []
    for p in part:
        inp, own, ext = p.input, p.owned, _slice_extents(p)
        full = [_full(a) for a in inp.axes]
        size = " * ".join(f"(long long){e}" if n == 0 else e for n, e in enumerate(ext))
        for _, m, ld, d in (r for r in reads if r[0] is inp):
            idx = [cuda_expr.render(i, sites) for i in ld.indices]
            slot = {"k": f"i{{n}} - key0", "b": "0", "hkv": "0", "h": "i{n} - hkv * a.group"}
            parts = [slot[o].format(n=n) if o else f"i{n}" for n, o in enumerate(own)]
            adds.append(
                f"        {{  // {format_expr(ld)}: slices of {' * '.join(ext)} words\n"
                + "".join(f"            const int i{n} = {x};\n" for n, x in enumerate(idx))
                + f"            if ({' && '.join(f'i{n} >= 0 && i{n} < {x}' for n, x in enumerate(full))}) {{\n"
                f"                const long long o = {_index_flat(parts, ext)};\n"
                "                if (o % kThreads == threadIdx.x) {\n"
                f"                    g.{inp.name}_partials[slice * {size} + o] += "
                f"ds * grad_{inp.name}_{m}({'in, ' if inputs_read(d) else ''}s, b, h, hkv, q, k, Lq, Lk);\n"
                "                }\n            }\n        }\n")
        rng = {"z": ("0", "in.ext_b"), "y": ("0", "in.ext_hkv"), "x": ("0", "n_x")}
        slot = []
        for n, o in enumerate(own):
            if o:  # the one block of the grid's dimension that names the entry (keys past the grid: none)
                at = {"k": f"ax{n} / kTile", "h": f"ax{n} / a.group"}.get(o, f"ax{n}")
                rng[grad_partials.GRID[o]] = (at, f"min({at} + 1, n_x)" if o == "k" else f"{at} + 1")
            slot.append({"k": f"ax{n} % kTile", "b": "0", "hkv": "0", "h": f"ax{n} % a.group"}.get(o, f"ax{n}"))
        decomp = "".join(f"            const int ax{n} = (int)(rest % {full[n]});\n            rest /= {full[n]};\n"
                         for n in reversed(range(1, len(full)))) + "            const int ax0 = (int)rest;\n"
        entries = " * ".join(f"(long long){e}" if n == 0 else e for n, e in enumerate(full))
        sums.append(
            f"    {{  // {inp.name}\n"
            f"        for (long long n = first; n < {entries}; n += stride) {{\n"
            "            long long rest = n;\n" + decomp
            + f"            const long long o = {_index_flat(slot, ext)};\n"
            "            float sum = 0.0f;\n"
            f"            for (int z = {rng['z'][0]}; z < {rng['z'][1]}; ++z)\n"
            f"                for (int y = {rng['y'][0]}; y < {rng['y'][1]}; ++y)\n"
            f"                    for (int x = {rng['x'][0]}; x < {rng['x'][1]}; ++x)\n"
            f"                        sum += g.{inp.name}_partials[(((long long)z * in.ext_hkv + y) * n_x + x) * "
            f"{size} + o];\n"
            f"            g.{inp.name}[n] = sum;\n        }}\n    }}\n")
    return (
        "// After the dK/dV step's tile pair (rows [row0, row0 + kTile) of head h, keys [key0, key0 + kTile)): every\n"
        "// pair of the tile, in order, adds ds times d score / d entry into this block's slice (`slice`, the grid in\n"
        "// order) of each partials input, each slice word by the thread whose index is its offset modulo kThreads.\n"
        "__device__ __forceinline__ void grad_partials_add(const Args& a, const ExprInputs& in, const ExprGrads& g, "
        "const Tiles& t, int row0, int key0, int b, int h, int hkv, int Lq, int Lk) {\n"
        "    const long long slice = ((long long)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;\n"
        "    for (int e = 0; e < kTile * kTile; ++e) {\n"
        "        const int r = e / kTile, c = e % kTile;\n"
        "        const float ds = t.gds[r * kStrideT + c];\n"
        "        if (ds == 0.0f) continue;  // hidden, or nothing to add\n"
        "        const float s = t.gs[r * kStrideT + c];\n"
        "        const int q = row0 + r, k = key0 + c;\n"
        + "".join(adds) + "    }\n}\n\n"
        "// <entry>_bwd_grads: each entry of a partials input's gradient, written once, is the sum of the slices of the\n"
        "// dK/dV blocks that can name it (z, y, x in grid order); the threads of the grid stride over the entries.\n"
        "__device__ __forceinline__ void grad_partials_sum(const Args& a, const ExprInputs& in, const ExprGrads& g) {\n"
        "    const int n_x = (a.rows_k + kTile - 1) / kTile;  // the dK/dV grid's x\n"
        "    const long long first = (long long)blockIdx.x * kThreads + threadIdx.x;\n"
        "    const long long stride = (long long)gridDim.x * kThreads;\n"
        + "".join(sums) + "}\n")


def _flat(ext: list) -> str:
    flat = "(long long)i0"
    for d in range(1, len(ext)):
        flat = f"({flat}) * {ext[d]} + i{d}" if d > 1 else f"{flat} * {ext[d]} + i{d}"
    return flat
