"""Where the subgroup-matrix WGSL family (issue 43, templates/wgsl/kernel_sgmat.wgsl.j2) goes wrong:
tiny compute shaders on one workgroup through wgpudawn directly, each compared with numpy, one line
per check (OK, or the mismatch with a diagnosis: zeros, NaN, transposed, rows / columns permuted,
shifted, off by a factor, read with another stride, and which rows / columns are wrong).

    ATTNGEN_WGPU=wgpudawn python3 benchmarks/probes/probe_sgmat_parts.py [--null] [--only b,c]
        [--configs 16x16x16,16x8x16,16x8x8] [--variants default,stride,norobust,reconverge]
        [--forms template,bool] [--no-kernel]

The checks (letters as in the probe's brief, issue 43):
  a  @builtin(subgroup_id), subgroup_invocation_id, subgroup_size per invocation (64, 128, 256)
  b  a left matrix loaded row_major from storage / from a workgroup f16 array (copied from storage),
     times identity slices loaded from storage, stored to storage / to a workgroup f32 array copied
     out; then the same with a 4-byte workgroup atomic and a 3-element f16 array declared before
     the tile (does the driver keep the tile's base 16-byte aligned?), at an 8-byte offset (below
     the 16 bytes Vulkan asks for: informative only), and with the atomic padded to 16 bytes
  c  a right matrix from memory, an identity-like left from storage: col_major (K^T of a [key][d]
     tile, as the kernel reads sK) from storage and from workgroup memory with strides 64 and
     2K + 8; row_major from workgroup memory (as the kernel reads sV)
  d  a result stored to a workgroup f32 array with stride N + 4, read back by scalar code, and
     loaded back as a result matrix; the kernel's rescale path (stored at stride N, rows scaled in
     scalar code, loaded back) with 4 subgroups
  e  one S = Q K^T tile and one acc += P V step exactly as the kernel computes them (4 subgroups,
     TILE_KV 32, head dim 64), P written either by all invocations or, as in the kernel, one
     invocation per row inside `if (lid < TILE_Q)` followed by workgroupUniformLoad; acc as the
     kernel's array<result_t, D / N> or as named variables
  f  every check of b-e on every device variant (default; `stride`:
     vulkan_cooperative_matrix_stride_is_matrix_elements; `norobust`: disable_robustness;
     `reconverge`: use_spirv_reconvergence_mode) and with both call forms Tint accepts
     (`template`: subgroupMatrixLoad<T, row_major>(p, offset, stride); `bool`:
     subgroupMatrixLoad<T>(p, offset, false, stride)). The first variant and form print every line;
     the others print a summary and only the lines that differ from it.
  g  the attngen kernel itself (target wgsl { matrix=on }) at Lq = Lk = 1, 16, 64, head dims 64 and
     128, on every device variant, and on the first variant with the candidate fixes applied to its
     source (--fixes; FIXES below): max error against the float64 reference and a slice of both.

--null compiles every shader on Dawn's Null backend (no GPU: Tint parses, resolves and checks
uniformity; pipelines that the Null adapter refuses for its 128-wide subgroups or its workgroup
storage are reported as compiled). On the GPU the whole run takes seconds.

Dumping Dawn's generated SPIR-V: the `dump_shaders` toggle sends the dump through the device's
logging callback, which wgpudawn 0.32 does not expose (no wgpuDeviceSetLoggingCallback in its cffi
module, Dawn's symbols not exported), so there is no flag for it here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

FEATURES = ["shader-f16", "subgroups", "chromium-experimental-subgroup-matrix"]
INSTANCE_TOGGLES = ["allow_unsafe_apis", "vulkan_enable_f16_on_nvidia"]
VARIANTS = {  # device toggles of each variant (f)
    "default": [],
    "stride": ["vulkan_cooperative_matrix_stride_is_matrix_elements"],
    "norobust": ["disable_robustness"],
    "reconverge": ["use_spirv_reconvergence_mode"],
}
# Candidate fixes of the kernel (issue 43's suspects), as rewrites of its generated source:
FIXES = {
    # the two 4-byte atomics padded to 16 bytes each: a driver that places 4-byte-aligned variables
    # before the f16 tiles would otherwise leave them 8 bytes off the 16 that matrix loads need
    "aligned": [(r"var<workgroup> (sRescaleTile|sVBadTile): atomic<u32>;", r"var<workgroup> \1: array<atomic<u32>, 4>;"),
                (r"&(sRescaleTile|sVBadTile)\b", r"&\1[0]")],
    # acc as named result matrices, not a function-scope array of them
    "named": [(r"var acc: array<result_t, (\d+)>;", "ACC_DECL"), (r"acc\[(\d+)\]", r"acc_\1")],
}
CONFIGS = ["16x16x16", "16x8x16", "16x8x8"]  # M x N x K, f16 -> f32 (the H100's / H200's)
SUBGROUP = 32      # the subgroup size the matrix shaders are written for (NVIDIA's)
SUBGROUPS = 4      # subgroups per workgroup in d and e (the family's)
TILE_KV = 32       # the family's key tile
HEAD_DIM = 64


# ---- numpy: what a load reads, and the diagnosis of a mismatch ---------------------------------

def load_sim(mem, offset, stride, rows, cols, col_major):
    """The rows x cols matrix a subgroupMatrixLoad reads from flat `mem` (Dawn's extension doc:
    row-major (r, c) at offset + r * stride + c; column-major at offset + c * stride + r); NaN where
    that falls outside `mem`."""
    r = np.arange(rows)[:, None]
    c = np.arange(cols)[None, :]
    idx = offset + (c * stride + r if col_major else r * stride + c)
    out = np.full((rows, cols), np.nan)
    ok = (idx >= 0) & (idx < mem.size)
    out[ok] = mem.reshape(-1)[idx[ok]]
    return out


def load_hypotheses(mem, offset, stride, rows, cols, col_major, embed):
    """What the check would give if the load had read differently: `embed` turns a loaded matrix
    into the check's expected output."""
    h = {
        "the other layout (row/col major swapped)": (offset, stride, not col_major),
        "stride taken as the matrix's size": (offset, cols if not col_major else rows, col_major),
        "stride x 2 (counted in 32-bit words?)": (offset, 2 * stride, col_major),
        "stride / 2": (offset, max(1, stride // 2), col_major),
        "offset ignored": (0, stride, col_major),
        "offset x 2": (2 * offset, stride, col_major),
        "offset / 2": (offset // 2, stride, col_major),
    }
    out = {}
    for name, (o, s, cm) in h.items():
        if (o, s, cm) == (offset, stride, col_major):
            continue
        m = load_sim(mem, o, s, rows, cols, cm)
        if not np.isnan(m).any():
            out[name] = embed(m)
    return out


def _ranges(idx) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8'."""
    idx = list(idx)
    if not idx:
        return "-"
    out, start, prev = [], idx[0], idx[0]
    for i in idx[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
        if i is not None:
            start = prev = i
    return ",".join(out)


def _close(a, b, tol):
    return a.shape == b.shape and np.allclose(a, b, rtol=tol, atol=tol * max(1.0, float(np.abs(b).max(initial=0))))


def diagnose(got, want, tol, hypotheses=None) -> str:
    """'OK', or what the mismatch looks like."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if _close(got, want, tol):
        return "OK"
    err = np.abs(got - want)
    finite = np.isfinite(got)
    head = f"MISMATCH max|err| {np.nanmax(np.where(finite, err, 0)):.3g} (|want| <= {np.abs(want).max():.3g})"
    notes = []
    if not finite.all():
        notes.append(f"{(~finite).sum()} of {got.size} not finite")
    if not got.any():
        notes.append("all zeros")
    for name, alt in (hypotheses or {}).items():
        if _close(got, alt, tol):
            notes.append(f"matches: {name}")
    if got.ndim == 2 and finite.all() and got.any():
        if got.shape[::-1] == want.shape and _close(got.T, want, tol):
            notes.append("transposed")
        elif got.shape[0] == got.shape[1] and _close(got, want.T, tol):
            notes.append("transposed")
        rows = [next((j for j in range(want.shape[0]) if _close(got[i], want[j], tol)), None) for i in range(got.shape[0])]
        if None not in rows and rows != list(range(got.shape[0])):
            notes.append(f"rows permuted: got row i = want row {rows[:16]}{'...' if len(rows) > 16 else ''}")
        cols = [next((j for j in range(want.shape[1]) if _close(got[:, i], want[:, j], tol)), None) for i in range(got.shape[1])]
        if None not in cols and cols != list(range(got.shape[1])):
            notes.append(f"columns permuted: got col i = want col {cols[:16]}{'...' if len(cols) > 16 else ''}")
        if np.abs(want).max() > 0:
            c = float((got * want).sum() / (want * want).sum())
            if abs(c) > 1e-6 and abs(c - 1) > tol and _close(got, c * want, tol):
                notes.append(f"off by a factor {c:.6g}")
        flat_g, flat_w = got.reshape(-1), want.reshape(-1)
        for s in range(-64, 65):
            if s and abs(s) < flat_w.size // 2:
                a = flat_g[max(0, s):flat_g.size + min(0, s)]
                b = flat_w[max(0, -s):flat_w.size + min(0, -s)]
                if np.abs(b).max() > 0 and _close(a, b, tol):
                    notes.append(f"the whole output shifted by {s} elements (flat)")
                    break
    if got.ndim == 2:
        bad = ~np.isclose(got, want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max())))
        br, bc = np.nonzero(bad.any(axis=1))[0], np.nonzero(bad.any(axis=0))[0]
        notes.append(f"{bad.sum()}/{bad.size} wrong, rows {_ranges(br)}, cols {_ranges(bc)}")
        zr = [i for i in range(got.shape[0]) if not got[i].any() and want[i].any()]
        if zr and len(zr) < got.shape[0]:
            notes.append(f"zero rows where want is not: {_ranges(zr)}")
    return head + ": " + "; ".join(notes)


# ---- WGSL -------------------------------------------------------------------------------------

HEADER = """enable f16;
enable subgroups;
enable chromium_experimental_subgroup_matrix;
"""


@dataclass
class Cfg:
    m: int
    n: int
    k: int

    @classmethod
    def parse(cls, text):
        m, n, k = (int(x) for x in text.split("x"))
        return cls(m, n, k)

    @property
    def name(self):
        return f"{self.m}x{self.n}x{self.k}"

    def aliases(self):
        return (f"alias left_t = subgroup_matrix_left<f16, {self.k}, {self.m}>;\n"
                f"alias right_t = subgroup_matrix_right<f16, {self.n}, {self.k}>;\n"
                f"alias result_t = subgroup_matrix_result<f32, {self.n}, {self.m}>;\n"
                f"const MAT_M: u32 = {self.m}u;\nconst MAT_N: u32 = {self.n}u;\nconst MAT_K: u32 = {self.k}u;\n")


def ld(form, t, ptr, off, stride, col_major=False):
    """A subgroupMatrixLoad in one of the call forms Tint accepts."""
    if form == "template":
        return f"subgroupMatrixLoad<{t}, {'col_major' if col_major else 'row_major'}>({ptr}, {off}, {stride})"
    return f"subgroupMatrixLoad<{t}>({ptr}, {off}, {'true' if col_major else 'false'}, {stride})"


def st(form, ptr, off, value, stride, col_major=False):
    if form == "template":
        return f"subgroupMatrixStore<{'col_major' if col_major else 'row_major'}>({ptr}, {off}, {value}, {stride});"
    return f"subgroupMatrixStore({ptr}, {off}, {value}, {'true' if col_major else 'false'}, {stride});"


@dataclass
class Check:
    key: str                  # letter and number: "b1"
    what: str                 # one line: what is checked
    src: str
    inputs: list              # numpy arrays bound at 0.. as read-only storage (f16 or f32 or u32)
    want: np.ndarray          # the expected output (bound read_write after the inputs)
    tol: float = 1e-6
    workgroup: int = SUBGROUP
    hypotheses: dict = field(default_factory=dict)
    out_dtype: type = np.float32


def _bindings(inputs, out_type="f32"):
    lines = []
    for i, a in enumerate(inputs):
        t = {np.dtype(np.float16): "f16", np.dtype(np.float32): "f32", np.dtype(np.uint32): "u32"}[a.dtype]
        lines.append(f"@group(0) @binding({i}) var<storage, read> in{i}: array<{t}>;")
    lines.append(f"@group(0) @binding({len(inputs)}) var<storage, read_write> out: array<{out_type}>;")
    return "\n".join(lines) + "\n"


def _entry(wg, body, extra_builtins=""):
    return (f"@compute @workgroup_size({wg}, 1, 1)\n"
            f"fn main(@builtin(local_invocation_index) lid: u32, @builtin(subgroup_id) sg: u32{extra_builtins}) {{\n"
            f"{body}}}\n")


def small_ints(rng, shape, lo=-8, hi=8, scale=0.25):
    """Values exact in f16 whose products and sums are exact in f32."""
    return (rng.integers(lo, hi + 1, size=shape) * scale).astype(np.float16)


def eye_slices(rows, cols, blocks):
    """[blocks] rows x cols matrices with ones at (b * cols + j, j): I @ slice b picks columns
    b * cols .. of a left matrix."""
    out = np.zeros((blocks, rows, cols), np.float16)
    for b in range(blocks):
        for j in range(cols):
            if b * cols + j < rows:
                out[b, b * cols + j, j] = 1
    return out


def checks_a():
    out = []
    for wg in (64, 128, 256):
        body = ("    out[lid * 4u] = lid;\n    out[lid * 4u + 1u] = sg;\n"
                "    out[lid * 4u + 2u] = sgi;\n    out[lid * 4u + 3u] = sgs + 0u * in0[0];\n")
        src = ("enable subgroups;\nenable chromium_experimental_subgroup_matrix;\n" + _bindings([np.zeros(4, np.uint32)], "u32")
               + _entry(wg, body, ", @builtin(subgroup_invocation_id) sgi: u32, @builtin(subgroup_size) sgs: u32"))
        lid = np.arange(wg)
        want = np.stack([lid, lid // SUBGROUP, lid % SUBGROUP, np.full(wg, SUBGROUP)], axis=1).astype(np.uint32)
        out.append(Check(f"a{wg}", f"subgroup builtins, workgroup {wg}", src, [np.zeros(4, np.uint32)], want,
                         workgroup=wg, out_dtype=np.uint32))
    return out


def diagnose_a(got, want):
    got = got.reshape(want.shape)
    if (got == want).all():
        return "OK"
    size = sorted(set(got[:, 3].tolist()))
    sg, inv = got[:, 1], got[:, 2]
    notes = [f"subgroup_size {size}"]
    if len(size) == 1 and size[0]:
        s = size[0]
        notes.append("subgroup_id = lid / size" if (sg == got[:, 0] // s).all() else
                     f"subgroup_id NOT lid / size: per 32 lids {[sorted(set(sg[i:i + 32].tolist())) for i in range(0, len(sg), 32)]}")
        notes.append("invocation id = lid % size" if (inv == got[:, 0] % s).all() else "invocation id NOT lid % size")
    return "MISMATCH: " + "; ".join(notes)


def checks_b(cfg: Cfg, form: str, rng):
    m, n, k = cfg.m, cfg.n, cfg.k
    blocks = -(-k // n)
    a = small_ints(rng, (m, k))
    eye = eye_slices(k, n, blocks)
    want = np.zeros((m, blocks * n), np.float32)
    want[:, :k] = a
    cn = blocks * n
    res = []

    def embed(mat):  # a loaded left matrix -> the check's output
        w = np.zeros((m, cn))
        w[:, :k] = mat
        return w

    for key, a_from, c_to, pre, a_off in [
        ("b0", "storage", "storage", "", 0),
        ("b1", "workgroup", "storage", "", 0),
        ("b2", "storage", "workgroup", "", 0),
        ("b3", "workgroup", "workgroup", "", 0),
        ("b4", "workgroup", "storage", "atomic", 0),
        ("b5", "workgroup", "storage", "f16x3", 0),
        ("b6", "workgroup", "storage", "", 4),
        ("b7", "workgroup", "storage", "atomic16", 0),
    ]:
        ks = 64 if a_from == "workgroup" else k  # the tile's row stride (the kernel's Q_STRIDE at d64)
        decl = ""
        body = ""
        if pre == "atomic":
            decl += "var<workgroup> wFlag: atomic<u32>;\n"
            body += "    if (lid == 0u) { atomicStore(&wFlag, 1u); }\n"
        if pre == "atomic16":
            decl += "var<workgroup> wFlag: array<atomic<u32>, 4>;\n"
            body += "    if (lid == 0u) { atomicStore(&wFlag[0], 1u); }\n"
        if pre == "f16x3":
            decl += "var<workgroup> wPad: array<f16, 3>;\n"
            body += "    if (lid < 3u) { wPad[lid] = f16(lid); }\n"
        if a_from == "workgroup":
            decl += f"var<workgroup> wA: array<f16, {a_off + m * ks}>;\n"
            body += (f"    for (var i = lid; i < {m * k}u; i += {SUBGROUP}u) {{\n"
                     f"        wA[{a_off}u + (i / {k}u) * {ks}u + i % {k}u] = in0[i];\n    }}\n")
            body += "    workgroupBarrier();\n"
            aload = ld(form, "left_t", "&wA", f"{a_off}u", f"{ks}u")
        else:
            aload = ld(form, "left_t", "&in0", "0u", f"{k}u")
        if c_to == "workgroup":
            cs = cn
            decl += f"var<workgroup> wC: array<f32, {m * cs}>;\n"
        body += f"    let a = {aload};\n"
        for b in range(blocks):
            body += f"    let r{b} = {ld(form, 'right_t', '&in1', f'{b * k * n}u', f'{n}u')};\n"
            value = f"subgroupMatrixMultiply<f32>(a, r{b})"
            if c_to == "workgroup":
                body += "    " + st(form, "&wC", f"{b * n}u", value, f"{cs}u") + "\n"
            else:
                body += "    " + st(form, "&out", f"{b * n}u", value, f"{cn}u") + "\n"
        if c_to == "workgroup":
            body += (f"    workgroupBarrier();\n    for (var i = lid; i < {m * cn}u; i += {SUBGROUP}u) {{\n"
                     f"        out[i] = wC[i];\n    }}\n")
        if pre == "atomic":
            body += "    if (lid == 0u) { out[0] += f32(atomicLoad(&wFlag)) * 0.0; }\n"
        if pre == "atomic16":
            body += "    if (lid == 0u) { out[0] += f32(atomicLoad(&wFlag[0])) * 0.0; }\n"
        if pre == "f16x3":
            body += "    if (lid == 0u) { out[0] += f32(wPad[2]) * 0.0; }\n"
        src = HEADER + cfg.aliases() + _bindings([a, eye]) + decl + _entry(SUBGROUP, body)
        what = {"b0": "left<-storage, result->storage (the known-good path)",
                "b1": "left<-workgroup f16 (stride 64), result->storage",
                "b2": "left<-storage, result->workgroup f32 -> copied out",
                "b3": "left<-workgroup f16 (stride 64), result->workgroup f32 -> copied out",
                "b4": "as b1, a workgroup atomic<u32> declared before the tile",
                "b5": "as b1, a workgroup array<f16, 3> declared before the tile",
                "b6": "as b1, the tile at an 8-byte offset (Vulkan asks 16: informative)",
                "b7": "as b4 with the atomic padded to 16 bytes (array<atomic<u32>, 4>): fix `aligned`"}[key]
        hyp = {}
        if a_from == "workgroup":
            mem = np.zeros(a_off + m * ks)
            for i in range(m):
                mem[a_off + i * ks:a_off + i * ks + k] = a[i]
            hyp = load_hypotheses(mem, a_off, ks, m, k, False, embed)
        res.append(Check(key, what, src, [a, eye.reshape(-1)], want, hypotheses=hyp))
    # b8: no matrices at all: f16 storage -> workgroup f16 (stride 64) -> f32 out by scalar code
    body = (f"    for (var i = lid; i < {m * k}u; i += {SUBGROUP}u) {{\n"
            f"        wA[(i / {k}u) * 64u + i % {k}u] = in0[i];\n    }}\n    workgroupBarrier();\n"
            f"    for (var i = lid; i < {m * k}u; i += {SUBGROUP}u) {{\n"
            f"        out[i] = f32(wA[(i / {k}u) * 64u + i % {k}u]) + 0.0 * f32(in1[0]);\n    }}\n")
    src = HEADER + cfg.aliases() + _bindings([a, eye]) + f"var<workgroup> wA: array<f16, {m * 64}>;\n" + _entry(SUBGROUP, body)
    res.append(Check("b8", "no matrices: f16 storage -> workgroup f16 -> f32 by scalar code", src,
                     [a, eye.reshape(-1)], a.astype(np.float32)))
    return res


def checks_c(cfg: Cfg, form: str, rng):
    """Right matrices (K rows x N columns) from memory, times an identity-like M x K left (M >= K):
    the output is the loaded matrix over M - K zero rows."""
    m, n, k = cfg.m, cfg.n, cfg.k
    ident = np.zeros((m, k), np.float16)
    for i in range(min(m, k)):
        ident[i, i] = 1
    res = []

    def embed(mat):
        w = np.zeros((m, n))
        w[:k] = mat
        return w

    for key, where, col_major, ds in [("c0", "storage", True, 64), ("c1", "workgroup", True, 64),
                                      ("c2", "workgroup", True, 2 * k + 8), ("c3", "workgroup", False, 64),
                                      ("c4", "workgroup", False, 2 * n + 8)]:
        if col_major:  # a [key][d] tile of 2N keys; K^T block at keys N.., dims K..
            rows, off = 2 * n, n * ds + k
            assert 2 * k <= ds
        else:          # a [key][d] tile of 2K keys; the block at keys K.., dims N..
            rows, off = 2 * k, k * ds + n
            assert 2 * n <= ds
        tile = small_ints(rng, (rows, ds))
        mem = tile.reshape(-1).astype(np.float64)
        b = load_sim(mem, off, ds, k, n, col_major)
        want = embed(b).astype(np.float32)
        decl, body = "", ""
        if where == "workgroup":
            decl = f"var<workgroup> wT: array<f16, {rows * ds}>;\n"
            body += (f"    for (var i = lid; i < {rows * ds}u; i += {SUBGROUP}u) {{\n        wT[i] = in1[i];\n    }}\n"
                     "    workgroupBarrier();\n")
            ptr = "&wT"
        else:
            ptr = "&in1"
        body += f"    let a = {ld(form, 'left_t', '&in0', '0u', f'{k}u')};\n"
        body += f"    let b = {ld(form, 'right_t', ptr, f'{off}u', f'{ds}u', col_major)};\n"
        body += "    " + st(form, "&out", "0u", "subgroupMatrixMultiply<f32>(a, b)", f"{n}u") + "\n"
        src = HEADER + cfg.aliases() + _bindings([ident, tile]) + decl + _entry(SUBGROUP, body)
        layout = "col_major (K^T of a [key][d] tile)" if col_major else "row_major (a [key][d] tile, as V)"
        what = f"right<-{where} {layout}, stride {ds}, offset {off}"
        res.append(Check(key, what, src, [ident.reshape(-1), tile.reshape(-1)], want,
                         hypotheses=load_hypotheses(mem, off, ds, k, n, col_major, embed)))
    return res


def checks_d(cfg: Cfg, form: str, rng):
    m, n, k = cfg.m, cfg.n, cfg.k
    res = []
    # C = A @ R with exact values: A (M x K) and R (K x N) small integers
    a = small_ints(rng, (SUBGROUPS * m, k), -4, 4, 0.5)
    r = small_ints(rng, (k, n), -4, 4, 0.5)
    c = a.astype(np.float64) @ r.astype(np.float64)
    cs = n + 4
    rows_off, cols_off = 2, 4  # the result stored at row 2, column 4 of an (M + 4) x (N + 8) f32 area
    area = (m + 4, cs + 8)
    # d1: stored at stride cs, read back by scalar code
    body = (f"    let a = {ld(form, 'left_t', '&in0', '0u', f'{k}u')};\n"
            f"    let r = {ld(form, 'right_t', '&in1', '0u', f'{n}u')};\n"
            f"    let c = subgroupMatrixMultiply<f32>(a, r);\n")
    decl = f"var<workgroup> wS: array<f32, {area[0] * area[1]}>;\n"
    stride = area[1]
    off = rows_off * stride + cols_off
    d1 = body + "    " + st(form, "&wS", f"{off}u", "c", f"{stride}u") + "\n" + (
        f"    workgroupBarrier();\n    for (var i = lid; i < {area[0] * area[1]}u; i += {SUBGROUP}u) {{\n"
        f"        out[i] = wS[i];\n    }}\n")
    want1 = np.zeros(area)
    want1[rows_off:rows_off + m, cols_off:cols_off + n] = c[:m]
    res.append(Check("d1", f"result->workgroup f32 at stride {stride} offset {off}, read by scalar code",
                     HEADER + cfg.aliases() + _bindings([a, r]) + decl + _entry(SUBGROUP, d1),
                     [a.reshape(-1), r.reshape(-1)], want1.astype(np.float32)))
    # d2: stored at stride cs + 8, loaded back as result_t, stored to storage
    d2 = body + "    " + st(form, "&wS", f"{off}u", "c", f"{stride}u") + "\n" + (
        "    workgroupBarrier();\n"
        f"    let back = {ld(form, 'result_t', '&wS', f'{off}u', f'{stride}u')};\n"
        "    " + st(form, "&out", "0u", "back", f"{n}u") + "\n")
    res.append(Check("d2", f"result->workgroup f32 (stride {stride}) -> loaded back as result_t -> storage",
                     HEADER + cfg.aliases() + _bindings([a, r]) + decl + _entry(SUBGROUP, d2),
                     [a.reshape(-1), r.reshape(-1)], c[:m].astype(np.float32)))
    # d3: the kernel's rescale path, 4 subgroups: stored at sg * M * N stride N, rows scaled by
    # alpha = row + 1 in scalar code, loaded back, stored to storage rows sg * M ..
    wg = SUBGROUPS * SUBGROUP
    tq = SUBGROUPS * m
    d3 = (f"    let a = {ld(form, 'left_t', '&in0', 'sg * MAT_M * MAT_K', 'MAT_K')};\n"
          f"    let r = {ld(form, 'right_t', '&in1', '0u', 'MAT_N')};\n"
          "    var acc = subgroupMatrixMultiply<f32>(a, r);\n"
          "    " + st(form, "&wS", "sg * MAT_M * MAT_N", "acc", "MAT_N") + "\n"
          "    workgroupBarrier();\n"
          f"    for (var e = lid; e < {tq}u * MAT_N; e += {wg}u) {{\n"
          "        wS[e] = wS[e] * f32(e / MAT_N + 1u);\n    }\n"
          "    workgroupBarrier();\n"
          f"    acc = {ld(form, 'result_t', '&wS', 'sg * MAT_M * MAT_N', 'MAT_N')};\n"
          "    " + st(form, "&out", "sg * MAT_M * MAT_N", "acc", "MAT_N") + "\n")
    want3 = c * (np.arange(tq) + 1)[:, None]
    res.append(Check("d3", f"the kernel's rescale path: acc->workgroup (stride N), rows scaled, loaded back; {SUBGROUPS} subgroups",
                     HEADER + cfg.aliases() + _bindings([a, r]) + f"var<workgroup> wS: array<f32, {tq * n}>;\n"
                     + _entry(wg, d3), [a.reshape(-1), r.reshape(-1)], want3.astype(np.float32), workgroup=wg))
    return res


def checks_e(cfg: Cfg, form: str, rng):
    """The kernel's two products, with its strides and offsets (kernel_sgmat.wgsl.j2)."""
    m, n, k = cfg.m, cfg.n, cfg.k
    d, tq, wg = HEAD_DIM, SUBGROUPS * m, SUBGROUPS * SUBGROUP
    s_stride, p_stride = TILE_KV + 4, TILE_KV + 8
    consts = (f"const TILE_Q: u32 = {tq}u;\nconst TILE_KV: u32 = {TILE_KV}u;\nconst HEAD_DIM: u32 = {d}u;\n"
              f"const Q_STRIDE: u32 = {d}u;\nconst K_STRIDE: u32 = {d}u;\nconst V_STRIDE: u32 = {d}u;\n"
              f"const S_STRIDE: u32 = {s_stride}u;\nconst P_STRIDE: u32 = {p_stride}u;\nconst WG: u32 = {wg}u;\n")
    decl = (f"var<workgroup> sQ: array<f16, {tq * d}>;\nvar<workgroup> sK: array<f16, {TILE_KV * d}>;\n"
            f"var<workgroup> sV: array<f16, {TILE_KV * d}>;\nvar<workgroup> sS: array<f32, {tq * s_stride}>;\n"
            f"var<workgroup> sP: array<f16, {tq * p_stride}>;\nvar<workgroup> sFlag: u32;\n")
    res = []
    q = (rng.standard_normal((tq, d)) * 0.5).astype(np.float16)
    kk_ = (rng.standard_normal((TILE_KV, d)) * 0.5).astype(np.float16)
    want = q.astype(np.float64) @ kk_.astype(np.float64).T
    body = ("    for (var e = lid; e < TILE_Q * HEAD_DIM; e += WG) { sQ[e] = in0[e]; }\n"
            "    for (var e = lid; e < TILE_KV * HEAD_DIM; e += WG) { sK[e] = in1[e]; }\n"
            "    workgroupBarrier();\n"
            "    for (var n = 0u; n < TILE_KV / MAT_N; n++) {\n"
            "        var s_acc = result_t(0.0);\n"
            "        for (var kk = 0u; kk < HEAD_DIM / MAT_K; kk++) {\n"
            f"            let a = {ld(form, 'left_t', '&sQ', 'sg * MAT_M * Q_STRIDE + kk * MAT_K', 'Q_STRIDE')};\n"
            f"            let b = {ld(form, 'right_t', '&sK', 'n * MAT_N * K_STRIDE + kk * MAT_K', 'K_STRIDE', True)};\n"
            "            s_acc = subgroupMatrixMultiplyAccumulate(a, b, s_acc);\n        }\n"
            "        " + st(form, "&sS", "sg * MAT_M * S_STRIDE + n * MAT_N", "s_acc", "S_STRIDE") + "\n    }\n"
            "    workgroupBarrier();\n"
            "    for (var e = lid; e < TILE_Q * TILE_KV; e += WG) {\n"
            "        out[e] = sS[(e / TILE_KV) * S_STRIDE + e % TILE_KV];\n    }\n"
            "    if (lid == 0u) { out[0] += f32(sV[0]) * 0.0 + f32(sP[0]) * 0.0 + f32(sFlag) * 0.0; }\n")
    res.append(Check("e1", f"S = Q K^T tile as the kernel ({tq} x {TILE_KV}, d {d}, {SUBGROUPS} subgroups)",
                     HEADER + cfg.aliases() + consts + _bindings([q, kk_]) + decl + _entry(wg, body),
                     [q.reshape(-1), kk_.reshape(-1)], want.astype(np.float32), tol=2e-3, workgroup=wg))
    p = rng.uniform(0, 1, (tq, TILE_KV)).astype(np.float16)
    v = (rng.standard_normal((TILE_KV, d)) * 0.5).astype(np.float16)
    want = p.astype(np.float64) @ v.astype(np.float64)
    for key, divergent, named in (("e2", False, False), ("e3", True, False), ("e4", False, True)):
        acc = (lambda i: f"acc{i}") if named else (lambda i: f"acc[{i}]")
        if divergent:  # the kernel's softmax: one invocation per row, then workgroupUniformLoad
            fill = ("    if (lid < TILE_Q) {\n        for (var j = 0u; j < TILE_KV; j++) {\n"
                    "            sP[lid * P_STRIDE + j] = in0[lid * TILE_KV + j];\n        }\n"
                    "        if (lid == 0u) { sFlag = 1u; }\n    }\n"
                    "    let flag = workgroupUniformLoad(&sFlag);\n")
        else:
            fill = ("    for (var e = lid; e < TILE_Q * TILE_KV; e += WG) {\n"
                    "        sP[(e / TILE_KV) * P_STRIDE + e % TILE_KV] = in0[e];\n    }\n"
                    "    workgroupBarrier();\n    let flag = 1u;\n")
        body = ("    for (var e = lid; e < TILE_KV * HEAD_DIM; e += WG) { sV[e] = in1[e]; }\n" + fill
                + ("".join(f"    var acc{i} = result_t(0.0);\n" for i in range(d // n)) if named else
                   f"    var acc: array<result_t, {d // n}>;\n" + "".join(f"    acc[{i}] = result_t(0.0);\n" for i in range(d // n)))
                + "    for (var kk = 0u; kk < TILE_KV / MAT_K; kk++) {\n"
                f"        let a = {ld(form, 'left_t', '&sP', 'sg * MAT_M * P_STRIDE + kk * MAT_K', 'P_STRIDE')};\n"
                + "".join(f"        {acc(i)} = subgroupMatrixMultiplyAccumulate(a, "
                          f"{ld(form, 'right_t', '&sV', f'kk * MAT_K * V_STRIDE + {i}u * MAT_N', 'V_STRIDE')}, {acc(i)});\n"
                          for i in range(d // n))
                + "    }\n")
        for i in range(d // n):  # the epilogue: one result matrix of every subgroup at a time through sS
            body += ("    workgroupBarrier();\n"
                     "    " + st(form, "&sS", "sg * MAT_M * MAT_N", acc(i), "MAT_N") + "\n"
                     "    workgroupBarrier();\n"
                     "    for (var e = lid; e < TILE_Q * MAT_N; e += WG) {\n"
                     f"        out[(e / MAT_N) * HEAD_DIM + {i}u * MAT_N + e % MAT_N] = sS[e] * f32(flag);\n    }}\n")
        body += "    if (lid == 0u) { out[0] += f32(sQ[0]) * 0.0 + f32(sK[0]) * 0.0; }\n"
        what = (f"acc += P V as the kernel, P {'by one invocation per row in if (lid < TILE_Q) + workgroupUniformLoad' if divergent else 'by all invocations + barrier'}"
                f", out through sS (stride N){'; acc as named variables, not an array' if named else ''}")
        res.append(Check(key, what, HEADER + cfg.aliases() + consts + _bindings([p, v]) + decl + _entry(wg, body),
                         [p.reshape(-1), v.reshape(-1)], want.astype(np.float32), tol=2e-3, workgroup=wg))
    return res


# ---- running -------------------------------------------------------------------------------------

class Runner:
    def __init__(self, null: bool):
        self.null = null
        import wgpudawn
        from wgpudawn.backends.dawn import extras
        self.wgpu, self.extras = wgpudawn, extras
        self.devices = {}

    def device(self, variant: str):
        if variant not in self.devices:
            adapter = self.wgpu.gpu.request_adapter_sync(power_preference="high-performance")
            missing = [f for f in FEATURES if f not in adapter.features]
            if missing:
                sys.exit(f"the adapter ({dict(adapter.info)}) lacks {missing}: run with the toggles on Dawn/Vulkan/NVIDIA")
            # the limits and features attngen's own device asks for (devices.py), so that g's kernels run on it
            limits = {name: adapter.limits[name] for name in ("max-compute-workgroup-storage-size",
                      "max-compute-invocations-per-workgroup", "max-compute-workgroup-size-x",
                      "max-storage-buffer-binding-size", "max-buffer-size", "max-storage-buffers-per-shader-stage")
                      if name in adapter.limits}
            features = FEATURES + [f for f in ("timestamp-query",) if f in adapter.features and not self.null]
            self.devices[variant] = self.extras.request_device_sync(
                adapter, required_features=features, required_limits=limits, enable_toggles=VARIANTS[variant])
        return self.devices[variant]

    def run(self, variant, check: Check):
        """(output array | None, error text | None)."""
        wgpu = self.wgpu
        dev = self.device(variant)
        try:
            module = dev.create_shader_module(code=check.src)
        except Exception as e:
            return None, "module: " + str(e).strip().splitlines()[0][:300]
        try:
            pipeline = dev.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
        except Exception as e:
            msg = str(e).strip().splitlines()[0]
            if self.null and ("multiple of the device maxSubgroupSize" in msg or "workgroup storage" in msg):
                return None, None  # the Null adapter's limits, not the shader's fault
            return None, "pipeline: " + msg[:300]
        if self.null:
            return None, None
        bufs = []
        for a in check.inputs:
            data = np.ascontiguousarray(a).tobytes()
            data += b"\0" * (-len(data) % 4 or 0) + b"\0" * max(0, 16 - len(data))
            bufs.append(dev.create_buffer_with_data(data=data, usage=wgpu.BufferUsage.STORAGE))
        nbytes = max(16, check.want.size * 4)
        out = dev.create_buffer(size=nbytes, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
        entries = [{"binding": i, "resource": {"buffer": b}} for i, b in enumerate(bufs + [out])]
        group = dev.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)
        enc = dev.create_command_encoder()
        cp = enc.begin_compute_pass()
        cp.set_pipeline(pipeline)
        cp.set_bind_group(0, group)
        cp.dispatch_workgroups(1, 1, 1)
        cp.end()
        dev.queue.submit([enc.finish()])
        got = np.frombuffer(dev.queue.read_buffer(out), dtype=check.out_dtype)[:check.want.size]
        return got.reshape(check.want.shape), None


def status(runner, variant, check):
    got, err = runner.run(variant, check)
    if err:
        return "ERROR " + err
    if got is None:
        return "compiled"
    if check.key.startswith("a"):
        return diagnose_a(got, check.want)
    return diagnose(got, check.want, check.tol, check.hypotheses)


def apply_fixes(source: str, names) -> str:
    """The kernel's source with the FIXES named applied (each must change it)."""
    import re
    for name in names:
        for pat, rep in FIXES[name]:
            if rep == "ACC_DECL":
                rep = lambda m: " ".join(f"var acc_{i}: result_t;" for i in range(int(m.group(1))))
            new, count = re.subn(pat, rep, source)
            if not count:
                raise SystemExit(f"fix {name}: nothing matches {pat!r} in the kernel's source")
            source = new
    return source


def kernel_checks(args, runner):
    """g: the attngen kernel itself at small sizes, on every device variant and with each fix."""
    import attngen
    from attngen import api, backends
    from attngen.reference import reference
    print("\n== g: the attngen kernel (target wgsl { matrix=on }), B 1, Hq 2, Hkv 1", flush=True)
    runs = [(v, ()) for v in args.variants] + [(args.variants[0], tuple(f.split("+"))) for f in args.fixes]
    backend = backends.get("wgsl")
    render = backend.render
    for d in (64, 128):
        text = (f"attention probe_sgmat_d{d} {{\n head_dim {d}\n heads q=2 kv=1\n dtype f16\n mask none\n"
                " target wgsl { matrix=on }\n}")
        (spec,) = api.parse(text)
        if runner.null:
            plan = api.lower(spec, "wgsl", "dawn-vulkan-nvidia")
            for fixes in [()] + [tuple(f.split("+")) for f in args.fixes]:
                src = apply_fixes(api.emit_plan(plan).source, fixes)
                try:
                    runner.device("default").create_shader_module(code=src)
                    print(f"g d{d} fixes {'+'.join(fixes) or 'none'}: the kernel's source compiled ({plan.config.matrix.summary})")
                except Exception as e:
                    print(f"g d{d} fixes {'+'.join(fixes) or 'none'}: ERROR module: {str(e).strip()[:500]}")
            continue
        from attngen.backends.wgsl import devices, kernel as kmod
        st_ = devices.device_state()
        for variant, fixes in runs:
            st_.device = runner.device(variant)  # the kernel runs on this variant's device
            kmod._PIPELINES.clear()
            backend.render = lambda plan, fixes=fixes: apply_fixes(render(plan), fixes)
            try:
                kern = attngen.compile(spec, target="wgsl")
            finally:
                backend.render = render
            label = f"{variant}{'+' + '+'.join(fixes) if fixes else ''}"
            for L in (1, 16, 64):
                rng = np.random.default_rng(L + d)
                q = rng.standard_normal((1, L, 2, d)).astype(np.float16)
                k = rng.standard_normal((1, L, 1, d)).astype(np.float16)
                v = rng.standard_normal((1, L, 1, d)).astype(np.float16)
                out = np.asarray(kern(q, k, v), dtype=np.float64)
                ref = reference(spec, q, k, v)
                err = np.abs(out - ref).max()
                rel = err / max(1e-30, np.abs(ref).max())
                verdict = "OK" if rel < 2e-3 else "WRONG"
                print(f"g {label:18s} d{d:<3d} L{L:<3d} {verdict:5s} max|err| {err:.3g} (rel {rel:.3g}); "
                      f"out[0,0,0,:5] {np.round(out[0, 0, 0, :5], 3).tolist()} ref {np.round(ref[0, 0, 0, :5], 3).tolist()}",
                      flush=True)
                if verdict == "WRONG" and L > 1:
                    print("   head 0, rows = queries: " + diagnose(out[0, :, 0, :], ref[0, :, 0, :], 2e-3), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--null", action="store_true", help="Dawn's Null backend: compile every shader, run none")
    ap.add_argument("--only", default="a,b,c,d,e,g", help="check letters to run (a,b,c,d,e,g)")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--variants", default=",".join(VARIANTS), help="device variants (f): " + ", ".join(VARIANTS))
    ap.add_argument("--forms", default="template,bool", help="subgroupMatrixLoad call forms (f): template, bool")
    ap.add_argument("--no-kernel", action="store_true", help="skip g (the attngen kernel)")
    ap.add_argument("--fixes", default="",
                    help="g: candidate fixes (" + ", ".join(FIXES) + "; a+b for both) run on the first variant; "
                         "they rewrite the first version's source (both are in the template since: none by default)")
    args = ap.parse_args()
    args.variants = [v for v in args.variants.split(",") if v]
    args.fixes = [f for f in args.fixes.split(",") if f]
    for f in args.fixes:
        if any(x not in FIXES for x in f.split("+")):
            sys.exit(f"unknown fix {f!r}: {', '.join(FIXES)}")
    forms = [f for f in args.forms.split(",") if f]
    only = set(args.only.split(","))
    if args.no_kernel:
        only.discard("g")
    for v in args.variants:
        if v not in VARIANTS:
            sys.exit(f"unknown variant {v!r}: {', '.join(VARIANTS)}")
    t0 = time.time()
    if args.null:
        os.environ["WGPU_BACKEND_TYPE"] = "Null"  # before wgpudawn makes its instance
        from wgpudawn.backends.dawn import extras
        extras.set_instance_extras(enable_toggles=INSTANCE_TOGGLES)
    elif "g" in only:
        os.environ.setdefault("ATTNGEN_WGPU", "wgpudawn")
        from attngen.backends.wgsl import devices
        if not devices.DAWN:
            sys.exit("run with ATTNGEN_WGPU=wgpudawn")
        devices.device_state()  # attngen's device first: it sets the instance's toggles (f16 on NVIDIA)
    else:
        from wgpudawn.backends.dawn import extras
        extras.set_instance_extras(enable_toggles=INSTANCE_TOGGLES)
    runner = Runner(args.null)
    dev = runner.device(args.variants[0])
    adapter_info = dev.adapter.info if hasattr(dev, "adapter") else {}
    print(f"device: {dict(adapter_info).get('device', '?')} / {dict(adapter_info).get('backend_type', '?')}"
          f"{' (Null: compile only)' if args.null else ''}; toggles {runner.extras.get_toggles(dev)}", flush=True)
    if not args.null:
        props = runner.extras.get_adapter_properties(dev.adapter)
        cfgs = [f"{c['m']}x{c['n']}x{c['k']} {c['component_type']}->{c['result_component_type']}"
                for c in props.get("subgroup_matrix_configs") or []]
        print(f"adapter's subgroup-matrix configs: {', '.join(cfgs) or 'none'}", flush=True)

    base = (args.variants[0], forms[0])
    if "a" in only:
        print("\n== a: subgroup built-ins", flush=True)
        for c in checks_a():
            print(f"{c.key:5s} {c.what:60s} {status(runner, base[0], c)}", flush=True)
    groups = [(letter, fn) for letter, fn in (("b", checks_b), ("c", checks_c), ("d", checks_d), ("e", checks_e))
              if letter in only]
    if groups:
        results = {}
        for variant in args.variants:
            for form in forms:
                first = (variant, form) == base
                if first:
                    print(f"\n== b-e on variant {variant} (toggles {VARIANTS[variant] or 'none'}), form {form}", flush=True)
                same = total = 0
                diffs = []
                for cfg_text in args.configs.split(","):
                    cfg = Cfg.parse(cfg_text)
                    for letter, fn in groups:
                        for c in fn(cfg, form, np.random.default_rng(7)):
                            s = status(runner, variant, c)
                            key = (cfg.name, c.key)
                            if first:
                                results[key] = s
                                print(f"{c.key:3s} {cfg.name:8s} {c.what:80s} {s}", flush=True)
                            else:
                                total += 1
                                if s.split(":")[0] == results.get(key, "").split(":")[0]:
                                    same += 1
                                else:
                                    diffs.append(f"{c.key:3s} {cfg.name:8s} {c.what:80s} {s}")
                if not first:
                    print(f"-- variant {variant} ({', '.join(VARIANTS[variant]) or 'no toggles'}), form {form}: "
                          f"{same}/{total} checks as on {base[0]}/{base[1]}", flush=True)
                    for line in diffs:
                        print("   " + line, flush=True)
    if "g" in only:
        kernel_checks(args, runner)
    print(f"\n({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
