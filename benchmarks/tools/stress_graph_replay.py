"""The graph-replay flake, looped (benchmarks/NOTES.md, 2026-11-26 and 2026-11-27):
tests/backends/cuda/test_calls.py::test_device_integer_inputs_are_not_read_on_the_host[paged]
failed twice in parallel runs of the whole suite ("wrong graph replay, outputs up to 7.8, one
NaN"). This runs the same steps (a first call on the null stream, the call captured on a
non-blocking stream, a replay, an eager call on the captured stream, a second replay) ROUNDS times
with new data each round, checks every output against the float64 reference, and on a failure
prints which step, how far off, how many rows and which, and the buffers' addresses. It found the
cause: a captured call's workspace handed back to CuPy's pool while the graph still wrote it
(NOTES.md, 2026-11-27, fourth session; about one round in five failed before the fix, none after).

    python3 benchmarks/tools/stress_graph_replay.py [--rounds 300] [--paged both|on|off] [--burn]
        [--sync-first] [--keep-ws] [--fresh-zeroed] [--first-on-stream]

--burn keeps the GPU busy from a second process (matrix products) as a parallel test run does;
the other flags change one step each, to find which one the failure needs.

The flags reach into the runtime (kernel._run, launcher.ZEROED) on purpose: they are diagnostics.
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
    ap.add_argument("--burn", action="store_true", help="a second process keeps the GPU busy")
    ap.add_argument("--sync-first", action="store_true", help="synchronise the GPU after the first call")
    ap.add_argument("--keep-ws", action="store_true", help="never hand a call's workspace back to the pool")
    ap.add_argument("--fresh-zeroed", action="store_true", help="forget the per-stream counter buffers")
    ap.add_argument("--first-on-stream", action="store_true", help="the first call on the captured stream")
    a = ap.parse_args()
    import cupy
    burner = None
    if a.burn:
        import subprocess
        burner = subprocess.Popen([sys.executable, "-c", "import cupy\nx = cupy.random.rand(4096, 4096, dtype=cupy.float32)\n"
                                   "while True:\n    y = x @ x\n    cupy.cuda.Device().synchronize()"])
    from attngen.backends.cuda import launch as launcher
    kept = []
    modes = {"both": (True, False), "on": (True,), "off": (False,)}[a.paged]
    failures = 0
    for r in range(a.rounds):
        for paged in modes:
            spec, q, k, v, lens, table = case(paged, r)
            kernel = attngen.compile(spec, target="cuda")
            if a.keep_ws and not hasattr(kernel, "_stress_run"):
                kernel._stress_run = kernel._run
                kernel._run = lambda *x, _k=kernel: (lambda r: kept.append(r[1]) or r)(_k._stress_run(*x))
            dq, dk, dv = (cupy.asarray(x.astype(np.float16)) for x in (q, k, v))
            opts = {"kv_lens": cupy.asarray(lens)}
            kw = {"kv_lens": lens}
            if paged:
                opts["block_table"] = cupy.asarray(table)
                kw["block_table"] = table
            ref = reference(spec, q, k, v, **kw)
            stream = cupy.cuda.Stream(non_blocking=True)
            if a.first_on_stream:
                with stream:
                    first = kernel(dq, dk, dv, **opts)
            else:
                first = kernel(dq, dk, dv, **opts)
            if a.sync_first:
                cupy.cuda.Device().synchronize()
            if a.fresh_zeroed:
                launcher.ZEROED._by_stream.clear()
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
    if burner is not None:
        burner.kill()
    flags = " ".join(f"--{n.replace('_', '-')}" for n in ("burn", "sync_first", "keep_ws", "fresh_zeroed",
                                                            "first_on_stream") if getattr(a, n))
    print(f"{a.rounds} rounds x {len(modes)} [{flags}]: {failures} failed steps")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
