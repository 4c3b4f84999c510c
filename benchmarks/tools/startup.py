"""Start-up costs, each in a fresh Python process (issue 12's numbers): `import attngen`, a cold
attngen.compile (empty disk cache: plan, render, NVRTC), a warm one (the kernel in the cache: no
render, no NVRTC), and a warm one after `attngen precompile` filled the cache. Medians of
--runs processes; the imports of CuPy and of attngen are timed apart from the compile.

    python3 benchmarks/tools/startup.py [--runs 5] [--spec examples/llama3_8b.attn]

Prints a markdown table (date, GPU, commit) for benchmarks/RESULTS.md. The children share one
PYTHONPYCACHEPREFIX, so that they import from bytecode as an installed package does.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHILD = r"""
import json, sys, time
T = time.perf_counter
t0 = T()
import cupy
cupy.cuda.Device().use()
t1 = T()
import attngen
t2 = T()
spec = attngen.load(sys.argv[1])
t3 = T()
kernel = attngen.compile(spec, target="cuda")
t4 = T()
print(json.dumps({"import cupy": t1 - t0, "import attngen": t2 - t1, "load spec": t3 - t2,
                  "compile": t4 - t3}))
"""


_PYC = tempfile.mkdtemp(prefix="attngen-pyc-")  # bytecode kept between the children, as an install has it


def _env(cache: str) -> dict:
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "ATTNGEN_CACHE_DIR": cache, "PYTHONPATH": path, "PYTHONPYCACHEPREFIX": _PYC}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def child(spec: str, cache: str) -> dict:
    env = _env(cache)
    out = subprocess.run([sys.executable, "-c", CHILD, spec], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"a child process failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def median_ms(rows: list[dict], key: str) -> float:
    return 1e3 * statistics.median(r[key] for r in rows)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--spec", default=os.path.join(ROOT, "examples", "llama3_8b.attn"))
    args = ap.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        cold = []
        for i in range(args.runs):  # a new empty cache each time
            cold.append(child(args.spec, os.path.join(tmp, f"cold{i}")))
        rows["cold (empty cache)"] = cold
        rows["warm (built by an earlier process)"] = [child(args.spec, os.path.join(tmp, "cold0"))
                                                     for _ in range(args.runs)]
        pre = os.path.join(tmp, "pre")
        env = _env(pre)
        subprocess.run([sys.executable, "-m", "attngen", "precompile", args.spec, "--target", "cuda", "-q"],
                       env=env, check=True, capture_output=True)
        rows["warm (after attngen precompile)"] = [child(args.spec, pre) for _ in range(args.runs)]
    import cupy
    gpu = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    commit = os.environ.get("ATTNGEN_COMMIT", "unknown")
    print(f"## {datetime.date.today()} — {gpu} — commit {commit}: start-up\n")
    print(f"Fresh processes, median of {args.runs}; spec {os.path.relpath(args.spec, ROOT)}; ms.\n")
    print("| case | import cupy | import attngen | load spec | attngen.compile |")
    print("|---|---|---|---|---|")
    for name, rs in rows.items():
        print(f"| {name} | {median_ms(rs, 'import cupy'):.0f} | {median_ms(rs, 'import attngen'):.0f} | "
              f"{median_ms(rs, 'load spec'):.0f} | {median_ms(rs, 'compile'):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
