"""Compile WGSL modules with Tint, Dawn's WGSL compiler (the one in Chrome), on Dawn's null backend.

    python3 scripts/tint_check.py DIR [DIR ...]     # every *.wgsl file under each DIR

The test command (scripts/test.sh) runs its first pass with ATTNGEN_WGSL_RECORD=DIR, so that the
runtime leaves a copy of every WGSL module it compiled there (attngen.backends.wgsl.devices.
record_source), and then this script on DIR: every kernel the suite ran on lavapipe (naga's
compiler) also goes through Tint's parser, resolver and uniformity analysis, and Dawn's
validation of each compute entry point's pipeline (layout "auto"). The null backend makes no
machine code, so this takes seconds where running the kernels on a software adapter takes
minutes; the Dawn pass of the test command still runs a set of the kernels on SwiftShader
(tests/conftest.py, TINT_PASS_SAMPLE) for Tint's code generation and its results.

Prints one line per module that fails (the file, the entry point, Dawn's message) and a summary;
exits 1 when a module fails or when no module was found (a first pass that recorded nothing is a
broken setup, not a pass), 2 on a usage error or when Dawn for Python (wgpudawn) or its null backend is
missing; -h / --help prints this text.
"""

from __future__ import annotations

import glob
import os
import re
import sys

# the features a generated module may enable (`enable f16; enable subgroups;` and the experimental
# subgroup matrices of the tensor-core family), requested where the null adapter has them
FEATURES = ("shader-f16", "subgroups", "chromium-experimental-subgroup-matrix")
ENTRY = re.compile(r"@compute\b[^{;]*?\bfn\s+(\w+)\s*\(", re.S)
BEYOND_LIMITS = re.compile(r"exceeds the maximum allowed|is larger than the maximum allowed|exceeds the maximum per-stage limit")
SUBGROUP_USE = re.compile(r"\bsubgroup\w*\s*\(|builtin\(\s*subgroup_")
SUBGROUPS_ENABLED = re.compile(r"^\s*enable\s+[^;]*\bsubgroups\b", re.M)


def tint_dialect(code: str) -> str:
    """`code` as the runtime would emit it for Tint. The two dialects differ in one line: wgpu-py's
    naga rejects `enable subgroups;` and Tint requires it before subgroup built-ins (the profile's
    `[dialect] subgroups_directive`, attngen.backends.wgsl.devices.naga_dialect), so a module
    recorded under wgpu-py that uses subgroups gets the directive (before its first line: Tint's
    line numbers are then one more than the file's)."""
    if SUBGROUP_USE.search(code) and not SUBGROUPS_ENABLED.search(code):
        return "enable subgroups;\n" + code
    return code


def null_device():
    """A device on Dawn's null backend with the features above and the adapter's largest limits."""
    os.environ["WGPU_BACKEND_TYPE"] = "Null"
    import wgpudawn as wgpu
    from wgpudawn._coreutils import logger
    logger.setLevel("ERROR")  # (its "Forcing backend: Null" warning, on every run)
    from wgpudawn.backends.dawn import extras
    extras.set_instance_extras(enable_toggles=["allow_unsafe_apis"])
    adapter = wgpu.gpu.request_adapter_sync()
    if adapter is None or adapter.info.get("backend_type") != "Null":
        raise RuntimeError(f"no null-backend adapter from this Dawn ({adapter.info if adapter else None})")
    features = [f for f in FEATURES if f in adapter.features]
    return wgpu, adapter.request_device_sync(required_features=features, required_limits=dict(adapter.limits))


def check_source(wgpu, device, code: str, beyond: list | None = None) -> list[tuple[str, str]]:
    """[(entry point or "module", Dawn's message)] for what fails to compile; [] when all compiles.
    `beyond` collects the entry points whose pipelines exceed the null adapter's limits."""
    entries = ENTRY.findall(code)
    code = tint_dialect(code)
    try:
        module = device.create_shader_module(code=code)
    except wgpu.GPUError as e:
        return [("module", str(e))]
    except Exception as e:  # wgpudawn raises its own error types for some validation failures
        return [("module", f"{type(e).__name__}: {e}")]
    failed = []
    if not entries:
        failed.append(("module", "no @compute entry point found in the module"))
    for name in entries:
        try:
            device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": name})
        except Exception as e:
            if BEYOND_LIMITS.search(str(e)):
                # a kernel planned for the recording adapter's limits (lavapipe: 1024 invocations,
                # 32 KiB of workgroup memory, more storage buffers) beyond the null adapter's, which
                # are WebGPU's defaults (256, 16 KiB, 8): Tint has compiled the module; the
                # pipeline's limits were checked by the adapter it ran on
                if beyond is not None:
                    beyond.append(name)
                continue
            failed.append((name, f"{type(e).__name__}: {e}"))
    return failed


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if not argv or any(a.startswith("-") for a in argv):
        print("usage: " + __doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    files = sorted(f for d in argv for f in glob.glob(os.path.join(d, "**", "*.wgsl"), recursive=True))
    if not files:
        print(f"tint_check: no *.wgsl under {', '.join(argv)} (was the first pass run with "
              "ATTNGEN_WGSL_RECORD set to it?)", file=sys.stderr)
        return 1
    try:
        wgpu, device = null_device()
    except Exception as e:
        print(f"tint_check: Dawn's null backend is not available: {type(e).__name__}: {e} "
              "(pip install 'wgpudawn>=0.32,<0.33')", file=sys.stderr)
        return 2
    bad = entries = 0
    beyond: list = []
    for path in files:
        with open(path) as f:
            code = f.read()
        entries += len(ENTRY.findall(code))
        failed = check_source(wgpu, device, code, beyond)
        for entry, msg in failed:
            print(f"{path}: {entry}: {msg.strip()}", file=sys.stderr)
        bad += bool(failed)
    print(f"tint_check: {len(files)} WGSL modules, {entries} entry points: "
          + (f"{bad} failed" if bad else "all compiled with Tint (Dawn, null backend)")
          + (f"; {len(beyond)} entry points beyond the null adapter's limits (their modules compiled)"
             if beyond else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
