"""FP8 prefill's `_prepare_v` entry alone (issue 44): V^T with the key slots permuted, its bad keys
and the descales' check (templates/cuda/fp8_prepare.j2), timed and checked byte for byte.

Speed: head dims 64 / 128 / 256 x L 4096 / 16384, B L = 16384, H D = 2048, Hkv = Hq, e4m3; the
first launch of the kernel's prepared call alone, medians of CUDA events after warm-up with L2
flushed before each call (common.median_ms). GB/s = (V's bytes read + vt's and vt_bad's bytes
written) / time: 2 x V's bytes and the bad bits when L is a multiple of 128. Beside it, the kernel
this one replaced (the template as it was before, compiled here with cupy.RawModule: 16-byte
copies to shared memory, then 4 single-byte gathers and one 4-byte store per thread) and a plain
device-to-device copy of V's bytes (torch's copy_: HBM's ceiling here). The goal: >= 3 TB/s,
about 25 us at d128 L16384 (the old kernel took 82-84 us there on the H200).

Checks, every case: vt and vt_bad equal to a numpy model of the permutation (fp8.py's KEY_SLOTS:
vt[b][h][d][slot] = v[b][32 (slot / 32) + KEY_SLOTS[slot % 32]][h][d], zero past Lk and where v
held an inf or NaN; bit j % 32 of word j / 32 of vt_bad = key j held one) and to the old kernel's
outputs, with non-finite bytes planted in V. Then untimed cases of odd lengths (Lk 1, 113, 1000),
head dims 16 / 48 / 96 / 256 and qk != v, e5m2, and a bad descale reported in its errors word.

    python3 benchmarks/probes/probe_fp8_prepare.py [--dims 64,128,256] [--lengths 4096,16384] [--no-checks]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import attngen  # noqa: E402
from attngen.backends.cuda.fp8 import KEY_SLOTS, PREPARE_THREADS, TILE_KV, padded_keys  # noqa: E402

TOKENS, WIDTH = 16384, 2048  # B L and H D
TORCH_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
# a byte is non-finite iff (byte & mask) == mask (fp8_prepare.j2's clear_nonfinite_fp8)
NONFINITE = {"e4m3": 0x7F, "e5m2": 0x7C}
PLANTED = {"e4m3": (0x7F, 0xFF), "e5m2": (0x7C, 0xFC, 0x7E, 0xFF)}  # NaN (e4m3); inf, -inf, NaN (e5m2)

# The kernel before this probe's change (templates/cuda/fp8_prepare.j2 at c299e1d), as it rendered,
# with its constants in front: the reference it is timed and compared against.
OLD_KERNEL = r"""
typedef unsigned char elem_t;
constexpr int kBlockKV = 128, kHeadDimV = HEAD_DIM_V, kPrepareThreads = 256;
constexpr unsigned kNonFiniteBits = NONFINITE_BITS, kNonFiniteStep = NONFINITE_STEP;
constexpr int kPrepareRow = kHeadDimV + 16;
__device__ __constant__ unsigned char kKeySlot[32] = { KEY_SLOTS };

__device__ __forceinline__ unsigned clear_nonfinite_fp8(unsigned w, bool& found) {
    const unsigned high = ((w & kNonFiniteBits) + kNonFiniteStep) & 0x80808080u;
    found |= high != 0u;
    return w & ~((high >> 7) * 0xffu);
}

extern "C" __global__ void __launch_bounds__(kPrepareThreads)
old_prepare_v(const elem_t* __restrict__ v, long long v_sb, long long v_sl, long long v_sh,
              unsigned char* __restrict__ vt, unsigned* __restrict__ vt_bad, const float* __restrict__ q_descale,
              const float* __restrict__ k_descale, const float* __restrict__ v_descale, int len_k,
              int* __restrict__ errors) {
    __shared__ __align__(16) unsigned char rows[kBlockKV * kPrepareRow];
    __shared__ unsigned bad[kBlockKV / 32];
    const int tile = blockIdx.x, h = blockIdx.y, b = blockIdx.z, heads_kv = gridDim.y;
    const int tid = threadIdx.x, j0 = tile * kBlockKV;
    const long long slots = (long long)gridDim.x * kBlockKV;
    if (tid < kBlockKV / 32) bad[tid] = 0u;
    if (tile == 0 && tid < 3 && errors != nullptr) {
        const float x = (tid == 0 ? q_descale : tid == 1 ? k_descale : v_descale)[b * heads_kv + h];
        if (!(x > 0.f && x <= 3.402823466e38f)) *reinterpret_cast<volatile int*>(errors + 5 + tid) = b * heads_kv + h + 1;
    }
    __syncthreads();
    const unsigned char* src = reinterpret_cast<const unsigned char*>(v) + b * v_sb + h * v_sh;
    constexpr int kChunks = kHeadDimV / 16;
    for (int i = tid; i < kBlockKV * kChunks; i += kPrepareThreads) {
        const int r = i / kChunks, c = i % kChunks;
        uint4 x = make_uint4(0u, 0u, 0u, 0u);
        if (j0 + r < len_k) x = *reinterpret_cast<const uint4*>(src + (long long)(j0 + r) * v_sl + 16 * c);
        bool found = false;
        x.x = clear_nonfinite_fp8(x.x, found);
        x.y = clear_nonfinite_fp8(x.y, found);
        x.z = clear_nonfinite_fp8(x.z, found);
        x.w = clear_nonfinite_fp8(x.w, found);
        if (found) atomicOr(&bad[r / 32], 1u << (r % 32));
        *reinterpret_cast<uint4*>(rows + r * kPrepareRow + 16 * c) = x;
    }
    __syncthreads();
    unsigned char* dst = vt + ((long long)b * heads_kv + h) * kHeadDimV * slots + j0;
    for (int i = tid; i < kHeadDimV * (kBlockKV / 4); i += kPrepareThreads) {
        const int d = i / (kBlockKV / 4), s = 4 * (i % (kBlockKV / 4));
        const int key = s & ~31, k = s & 31;
        const unsigned word = rows[(key + kKeySlot[k]) * kPrepareRow + d]
                            | (unsigned)rows[(key + kKeySlot[k + 1]) * kPrepareRow + d] << 8
                            | (unsigned)rows[(key + kKeySlot[k + 2]) * kPrepareRow + d] << 16
                            | (unsigned)rows[(key + kKeySlot[k + 3]) * kPrepareRow + d] << 24;
        *reinterpret_cast<unsigned*>(dst + d * slots + s) = word;
    }
    if (tid < kBlockKV / 32) vt_bad[((long long)b * heads_kv + h) * (slots / 32) + tile * (kBlockKV / 32) + tid] = bad[tid];
}
"""


def old_kernel(dtype: str, d_v: int):
    """The old _prepare_v for head dim v `d_v`, compiled with cupy.RawModule for this GPU."""
    import cupy
    bits = {"e4m3": ("0x7f7f7f7fu", "0x01010101u"), "e5m2": ("0x7c7c7c7cu", "0x04040404u")}[dtype]
    code = (OLD_KERNEL.replace("HEAD_DIM_V", str(d_v)).replace("NONFINITE_BITS", bits[0])
            .replace("NONFINITE_STEP", bits[1]).replace("KEY_SLOTS", ", ".join(map(str, KEY_SLOTS))))
    return cupy.RawModule(code=code).get_function("old_prepare_v")  # (CuPy picks this GPU's arch)


def model(v: np.ndarray, dtype: str) -> tuple:
    """(vt, vt_bad) of v (B, Lk, Hkv, Dv) uint8, in numpy (module docstring)."""
    b, lk, h, d = v.shape
    mask = NONFINITE[dtype]
    bad = (v & mask) == mask
    clean = np.where(bad, np.uint8(0), v)
    slots = padded_keys(lk)
    keys = np.zeros((b, h, d, slots), np.uint8)
    keys[..., :lk] = clean.transpose(0, 2, 3, 1)
    j = np.arange(slots)
    vt = keys[..., 32 * (j // 32) + np.asarray(KEY_SLOTS)[j % 32]]
    bad_keys = np.zeros((b, h, slots), bool)
    bad_keys[..., :lk] = bad.any(axis=-1).transpose(0, 2, 1)
    words = np.packbits(bad_keys.reshape(b, h, slots // 32, 32), axis=-1, bitorder="little").view("<u4")[..., 0]
    return vt, words


class Case:
    """One spec and its inputs, with the _prepare_v launch of its prepared call and the views of
    the vt / vt_bad workspace it writes (fp8_prefill.parts' recipe, taken one launch at a time)."""

    def __init__(self, dtype, d_qk, d_v, batch, length, heads, seed, descales=None, plant=64):
        self.dtype, self.d_v, self.batch, self.length, self.heads = dtype, d_v, batch, length, heads
        name = f"prep_{dtype}_{d_qk}_{d_v}"
        head = f"{d_qk}" if d_qk == d_v else f"qk={d_qk} v={d_v}"
        self.spec = attngen.parse(f"attention {name} {{\n head_dim {head}\n dtype {dtype}\n}}\n")[0]
        self.kernel = attngen.compile(self.spec, target="cuda")
        g = torch.Generator(device="cuda").manual_seed(seed)
        fp8 = TORCH_FP8[dtype]
        self.q, self.k = (torch.randn((batch, length, heads, d_qk), device="cuda", generator=g).to(fp8)
                          for _ in range(2))
        self.v = torch.randn((batch, length, heads, d_v), device="cuda", generator=g).to(fp8)
        raw = self.v.view(torch.uint8).view(-1)
        at = torch.randint(0, raw.numel(), (plant,), device="cuda", generator=g)
        values = torch.tensor(PLANTED[dtype], dtype=torch.uint8, device="cuda")
        raw[at] = values[torch.arange(plant, device="cuda") % len(values)]
        ones = torch.ones((batch, heads), dtype=torch.float32, device="cuda")
        self.descales = descales or {"q_descale": ones, "k_descale": ones, "v_descale": ones}
        ints = {"kv_lens": None, "cu_seqlens_q": None, "cu_seqlens_k": None, "block_table": None}
        _, self.recipe, self.ptrs, self.held = self.kernel._call(self.q, self.k, self.v, None, None, False, None, None,
                                                                 False, ints, None, None, dict(self.descales))
        self.launch = self.recipe.launches[0]  # (the second: the attention)
        ws = self.held[0].view(torch.uint8)
        off = dict(self.recipe.workspaces)
        slots = padded_keys(length)
        n_vt, n_bad = batch * heads * d_v * slots, batch * heads * (slots // 32)
        self.vt = ws[off["vt"]:off["vt"] + n_vt].view(batch, heads, d_v, slots)
        self.vt_bad = ws[off["vt_bad"]:off["vt_bad"] + 4 * n_bad].view(torch.int32).view(batch, heads, slots // 32)
        self.bytes = self.v.numel() + n_vt + 4 * n_bad

    def prepare(self):
        import cupy
        self.launch.launch(cupy.cuda.driver, self.ptrs, self.recipe.stream())

    def old(self):
        """A function that runs the old kernel into vt_old / bad_old (allocated here)."""
        self.vt_old, self.bad_old = torch.empty_like(self.vt), torch.empty_like(self.vt_bad)
        fn = old_kernel(self.dtype, self.d_v)
        st = self.v.stride()
        ptr = lambda t: np.uint64(t.data_ptr())  # noqa: E731
        args = (ptr(self.v), np.int64(st[0]), np.int64(st[1]), np.int64(st[2]), ptr(self.vt_old), ptr(self.bad_old),
                ptr(self.descales["q_descale"]), ptr(self.descales["k_descale"]), ptr(self.descales["v_descale"]),
                np.int32(self.length), np.uint64(0))
        grid = (padded_keys(self.length) // TILE_KV, self.heads, self.batch)
        import cupy
        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)  # (the timer's events' stream)

        def run():
            with stream:
                fn(grid, (PREPARE_THREADS,), args)
        return run

    def check(self, old=True) -> str:
        """'ok', or what differs, of the last launch's vt / vt_bad against the numpy model (and the old kernel's)."""
        torch.cuda.synchronize()
        want_vt, want_bad = model(self.v.view(torch.uint8).cpu().numpy(), self.dtype)
        got_vt, got_bad = self.vt.cpu().numpy(), self.vt_bad.cpu().numpy().view(np.uint32)
        out = []
        if not np.array_equal(got_vt, want_vt):
            where = np.argwhere(got_vt != want_vt)
            out.append(f"vt differs from the model at {len(where)} bytes (first [b, h, d, slot] = {where[0].tolist()})")
        if not np.array_equal(got_bad, want_bad):
            out.append(f"vt_bad differs from the model in {int((got_bad != want_bad).sum())} words")
        if old:
            if not torch.equal(self.vt, self.vt_old):
                out.append("vt differs from the old kernel's")
            if not torch.equal(self.vt_bad, self.bad_old):
                out.append("vt_bad differs from the old kernel's")
        if want_bad.sum() == 0:
            out.append("(no planted key was found: the bad bits are untested)")
        return "ok" if not out else "; ".join(out)


def speed(dims, lengths, checks: bool):
    print("speed of _prepare_v alone (e4m3, B L = 16384, H D = 2048, Hkv = Hq; L2 flushed before each call)")
    print(f"{'case':<16}{'new us':>9}{'GB/s':>7}{'old us':>9}{'GB/s':>7}{'new/old':>9}{'copy us':>9}{'GB/s':>7}"
          f"  check")
    for d in dims:
        for length in lengths:
            c = Case("e4m3", d, d, TOKENS // length, length, WIDTH // d, seed=d + length)
            old = c.old()
            new_ms = common.median_ms(c.prepare)
            old_ms = common.median_ms(old)
            src, dst = c.v.view(torch.uint8), torch.empty_like(c.v.view(torch.uint8))
            copy_ms = common.median_ms(lambda: dst.copy_(src))
            c.prepare()
            old()
            verdict = c.check() if checks else "(not checked)"
            gbs = lambda ms: c.bytes / ms / 1e6  # noqa: E731
            print(f"{f'd{d} L{length}':<16}{new_ms * 1e3:>9.1f}{gbs(new_ms):>7.0f}{old_ms * 1e3:>9.1f}{gbs(old_ms):>7.0f}"
                  f"{old_ms / new_ms:>8.2f}x{copy_ms * 1e3:>9.1f}{2 * src.numel() / copy_ms / 1e6:>7.0f}  {verdict}",
                  flush=True)
            del c, src, dst
            torch.cuda.empty_cache()


CHECKS = [  # (dtype, d_qk, d_v, B, Lk, Hkv)
    ("e4m3", 64, 64, 2, 1, 3), ("e4m3", 128, 128, 2, 113, 3), ("e4m3", 192, 128, 2, 1000, 3),
    ("e5m2", 96, 96, 1, 333, 5), ("e4m3", 64, 256, 3, 129, 2), ("e5m2", 16, 16, 2, 257, 4),
    ("e4m3", 48, 48, 1, 4097, 2), ("e5m2", 256, 256, 2, 1023, 2),
]


def odd_cases():
    from attngen import LaunchError
    from attngen.backends.cuda.launch import error_flags
    import cupy
    print("\nodd lengths, head dims, qk != v, e5m2 (against the numpy model and the old kernel):")
    for i, (dtype, d_qk, d_v, b, lk, h) in enumerate(CHECKS):
        c = Case(dtype, d_qk, d_v, b, lk, h, seed=i, plant=max(1, b * lk * h * d_v // 500))
        old = c.old()
        c.prepare()
        old()
        print(f"  {dtype} d {d_qk}/{d_v} B{b} Lk{lk} Hkv{h}: {c.check()}", flush=True)
    # a bad descale: k_descale[1, 2] NaN -> errors word 6 = its flat index (5) + 1, raised by the next check
    ones = torch.ones((2, 3), dtype=torch.float32, device="cuda")
    kd = ones.clone()
    kd[1, 2] = float("nan")
    c = Case("e4m3", 64, 64, 2, 300, 3, seed=9, descales={"q_descale": ones, "k_descale": kd, "v_descale": ones})
    torch.cuda.synchronize()
    flags = error_flags(cupy, torch.cuda.current_device())
    flags.words[:] = 0  # (the case's first call, in Case, reported it already)
    c.prepare()
    torch.cuda.synchronize()
    word = int(flags.words[6])
    try:
        flags.raise_found("_prepare_v")
        said = "nothing raised"
    except LaunchError as e:
        said = str(e).splitlines()[0][:120]
    print(f"  bad k_descale[1, 2]: errors word 6 = {word} (want 6); {'ok' if word == 6 else 'WRONG'}: {said}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--lengths", default="4096,16384")
    ap.add_argument("--no-checks", action="store_true", help="time only")
    a = ap.parse_args()
    print(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}")
    speed(tuple(int(x) for x in a.dims.split(",")), tuple(int(x) for x in a.lengths.split(",")), not a.no_checks)
    if not a.no_checks:
        odd_cases()


if __name__ == "__main__":
    main()
