"""The graph-replay flake, looped (benchmarks/NOTES.md, 2026-11-26 and 2026-11-27):
tests/backends/cuda/test_calls.py::test_device_integer_inputs_are_not_read_on_the_host[paged]
failed twice in parallel runs of the whole suite ("wrong graph replay, outputs up to 7.8, one
NaN"). This runs the same steps (a first call on the null stream, the call captured on a
non-blocking stream, a replay, an eager call on the captured stream, a second replay) ROUNDS times
with new data each round, checks every output against the float64 reference, and on a failure
prints which step, how far off, how many rows and which, and the buffers' addresses (a captured
call's workspace handed back to the pool and reused is one suspect).

    python3 benchmarks/stress_graph_replay.py [--rounds 300] [--paged both|on|off]

Run it beside the test suite (gpu_session.sh) so that the GPU is as busy as when it failed.
Exits 1 if any round failed.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import attngen
from attngen.reference import reference, relative_error, tolerance


def case(paged: bool, seed: int):
    spec = attngen.parse("attention t {\n head_dim 64\n heads q=6 kv=2\n dtype f16\n schedule split_kv(auto)\n"
                         + (" kv_cache paged(page=16)\n" if paged else "") + "}")[0]
    rng = np.random.default_rng(seed)
    b, hq, hkv, cap = 3, 6, 2, 96
    lens = np.array([5, 96, 41], np.int32)
    q = rng.standard_normal((b, 1, hq, 64)).astype(np.float32)
    if paged:
        pages = 3 * (cap // 16)
        k = rng.standard_normal((pages, 16, hkv, 64)).astype(np.float32)
        v = rng.standard_normal((pages, 16, hkv, 64)).astype(np.float32)
        table = rng.permutation(pages).astype(np.int32).reshape(b, cap // 16)
        return spec, q, k, v, lens, table
    k = rng.standard_normal((b, cap, hkv, 64)).astype(np.float32)
    v = rng.standard_normal((b, cap, hkv, 64)).astype(np.float32)
    return spec, q, k, v, lens, None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--paged", choices=("both", "on", "off"), default="both")
    a = ap.parse_args()
    import cupy
    modes = {"both": (True, False), "on": (True,), "off": (False,)}[a.paged]
    failures = 0
    for r in range(a.rounds):
        for paged in modes:
            spec, q, k, v, lens, table = case(paged, r)
            kernel = attngen.compile(spec, target="cuda")
            dq, dk, dv = (cupy.asarray(x.astype(np.float16)) for x in (q, k, v))
            opts = {"kv_lens": cupy.asarray(lens)}
            kw = {"kv_lens": lens}
            if paged:
                opts["block_table"] = cupy.asarray(table)
                kw["block_table"] = table
            ref = reference(spec, q, k, v, **kw)
            first = kernel(dq, dk, dv, **opts)
            stream = cupy.cuda.Stream(non_blocking=True)
            with stream:
                stream.begin_capture()
                out = kernel(dq, dk, dv, **opts)
                graph = stream.end_capture()
            steps = []
            graph.launch(stream)
            stream.synchronize()
            steps.append(("first call (null stream)", first))
            steps.append(("replay 1", out.get()))
            with stream:
                eager = kernel(dq, dk, dv, **opts)
            stream.synchronize()
            steps.append(("eager on the captured stream", eager.get()))
            graph.launch(stream)
            stream.synchronize()
            steps.append(("replay 2", out.get()))
            for name, got in steps:
                got = cupy.asnumpy(got) if not isinstance(got, np.ndarray) else got
                err = relative_error(got.astype(np.float64), ref)
                if not err <= tolerance(spec):
                    failures += 1
                    bad = np.argwhere(np.abs(got.astype(np.float64) - ref).max(axis=-1) > 1e-2)
                    print(f"round {r} paged={paged} {name}: rel err {err:.3g}, max |out| "
                          f"{np.nanmax(np.abs(got)):.3g}, NaN {int(np.isnan(got).sum())}, rows off "
                          f"{len(bad)} first {bad[:6].tolist()}; out {out.data.ptr:#x} eager {eager.data.ptr:#x} "
                          f"first {first.data.ptr:#x} stream {stream.ptr:#x}", flush=True)
            del graph, stream
    print(f"{a.rounds} rounds x {len(modes)}: {failures} failed steps")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
