"""Bad integer inputs on the GPU under compute-sanitizer (issue 12, "Bad input").

    compute-sanitizer --tool memcheck --error-exitcode 1 python3 benchmarks/tools/sanitize.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python3 benchmarks/tools/sanitize.py

Each case launches a kernel with int32 CUDA tensors whose contents are wrong (kv_lens past the
cache or negative, block-table pages outside k / v or repeated by an append, cu_seqlens that
decrease or pass the end, a sequence longer than max_seqlen_q) and expects the LaunchError of
check=True; the sanitizer's exit code says whether any launch read or wrote out of bounds. Good
calls of the same kernels run too. Small shapes: the sanitizer slows kernels 10-100x.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

import attngen


def spec(body: str, name: str):
    return attngen.parse(f"attention {name} {{\n{body}\n}}")[0]


def t(a, dtype=torch.float16):
    return torch.from_numpy(np.ascontiguousarray(a)).cuda().to(dtype)


def expect_error(what: str, fn, needle: str) -> bool:
    try:
        fn()
    except attngen.LaunchError as e:
        if needle in str(e):
            print(f"ok   {what}: {str(e)[:110]}")
            return True
        print(f"FAIL {what}: wrong message: {e}")
        return False
    print(f"FAIL {what}: no LaunchError")
    return False


def main() -> int:
    rng = np.random.default_rng(0)
    good = True
    for paged in (False, True):
        body = "head_dim 64\n heads q=8 kv=2\n dtype f16\n schedule split_kv(auto)" + (
            "\n kv_cache paged(page=16)" if paged else "")
        kern = attngen.compile(spec(body, f"san_{'paged' if paged else 'contig'}"), target="cuda")
        b, cap = 3, 64
        q = t(rng.standard_normal((b, 2, 8, 64)))
        if paged:
            k = t(rng.standard_normal((12, 16, 2, 64)))
            v = t(rng.standard_normal((12, 16, 2, 64)))
            table = np.arange(12, dtype=np.int32).reshape(3, 4)
        else:
            k = t(rng.standard_normal((b, cap, 2, 64)))
            v = t(rng.standard_normal((b, cap, 2, 64)))
            table = None
        kn = t(rng.standard_normal((b, 2, 2, 64)))
        vn = t(rng.standard_normal((b, 2, 2, 64)))

        def call(lens, tab=table, **kw):
            opts = {"kv_lens": t(np.array(lens, np.int32), torch.int32)}
            if paged:
                opts["block_table"] = t(tab, torch.int32)
            return lambda: kern(q, k, v, check=True, **opts, **kw)

        call([5, 64, 30])()  # good
        call([5, 60, 30], k_new=kn, v_new=vn)()  # good append
        name = "paged" if paged else "contiguous"
        good &= expect_error(f"{name}: kv_lens past the cache", call([5, 65, 30]), "kv_lens[1]")
        good &= expect_error(f"{name}: kv_lens negative", call([-4, 3, 30]), "kv_lens[0]")
        good &= expect_error(f"{name}: append past the cache", call([5, 63, 30], k_new=kn, v_new=vn), "kv_lens[1]")
        good &= expect_error(f"{name}: kv_lens near int32 max", call([5, 2**31 - 2, 30], k_new=kn, v_new=vn),
                             "kv_lens[1]")
        if paged:
            bad = table.copy()
            bad[2, 1] = 1000
            good &= expect_error("paged: page outside", call([5, 64, 30], bad), "block_table row 2")
            bad = table.copy()
            bad[0, 0] = -7
            good &= expect_error("paged: negative page", call([5, 64, 30], bad), "block_table row 0")
            bad = table.copy()
            bad[1, 3] = bad[1, 0]  # the append writes page bad[1, 3], which the row also reads as its first
            good &= expect_error("paged: append onto a page still read", call([5, 60, 30], bad, k_new=kn, v_new=vn),
                                 "block_table row 1")
    kern = attngen.compile(spec("head_dim 32\n heads q=4 kv=2\n dtype f16\n mask causal", "san_packed"),
                           target="cuda")
    q, k, v = (t(rng.standard_normal((40, n, 32))) for n in (4, 2, 2))

    def packed(cu, **kw):
        return lambda: kern(q, k, v, cu_seqlens_q=t(np.array(cu, np.int32), torch.int32), check=True, **kw)

    packed([0, 7, 30, 40])()  # good
    packed([0, 7, 30, 40], max_seqlen_q=23, max_seqlen_k=23)()  # good
    good &= expect_error("packed: decreasing", packed([0, 9, 4, 40]), "cu_seqlens_q[1]")
    good &= expect_error("packed: past the end", packed([0, 7, 30, 41]), "cu_seqlens_q[2]")
    good &= expect_error("packed: negative", packed([-3, 7, 30, 40]), "cu_seqlens_q[0]")
    good &= expect_error("packed: longer than max_seqlen_q", packed([0, 7, 30, 40], max_seqlen_q=20, max_seqlen_k=20),
                         "cu_seqlens_q[1]")
    torch.cuda.synchronize()
    print("all cases as expected" if good else "SOME CASES FAILED")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
