#!/usr/bin/env bash
# Install everything the tests need on a fresh Debian/Ubuntu machine, then run them.
#   bash scripts/test.sh            # the whole suite (what CI runs)
#   bash scripts/test.sh --quick    # the quick tier: every layer, small shapes (tests/conftest.py QUICK)
#   bash scripts/test.sh -k parse   # extra arguments go to pytest (-n 0: one process)
# Installs: the software Vulkan adapter (Mesa's lavapipe, for WGSL through wgpu), Chromium (the
# browser tests: tests/browser, which then must run: ATTNGEN_REQUIRE_BROWSER=1; its SwiftShader
# driver also runs the second pass below), a virtual environment in .venv with attngen (wgpu
# included) and its test extra (pytest, hypothesis, NVRTC for compile checks, wgpudawn). On a
# machine with a GPU and CuPy the CUDA tests run too; else they skip.
# It says what it is about to do, with the time each step takes on 2 cores, before doing it, and
# the time each step took at the end. ATTNGEN_REINSTALL=1 installs the Python packages again even
# where .venv is up to date with pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
args=()
for a in "$@"; do
    if [ "$a" = "--quick" ]; then quick=1; else args+=("$a"); fi
done
set -- "${args[@]+"${args[@]}"}"

# ---- what is to be done -------------------------------------------------------------------------
need_apt=()
ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 || need_apt+=(mesa-vulkan-drivers libvulkan1)
python3 -c "import venv, ensurepip" 2>/dev/null || need_apt+=(python3-venv)
# Debian's Chromium: the browser tests run the WGSL kernels in it (headless, SwiftShader)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)

# The Python packages are installed again only when pyproject.toml changed since the last install
# (its digest is kept in .venv): pip's own "already satisfied" pass takes half a minute.
stamp=.venv/.attngen-test-install
want_stamp=$(sha256sum pyproject.toml | cut -d' ' -f1)
pip_needed=1
if [ "${ATTNGEN_REINSTALL:-0}" != 1 ] && [ -x .venv/bin/python ] && [ -f "$stamp" ] \
        && [ "$(cat "$stamp")" = "$want_stamp" ] && .venv/bin/python -c "import torch" 2>/dev/null; then
    pip_needed=0
fi

icd=/usr/lib/chromium/vk_swiftshader_icd.json
dawn=0
if [ "$quick" = 0 ] && [ "${ATTNGEN_TINT:-1}" = 1 ]; then dawn=1; fi

if [ "$quick" = 1 ]; then
    tier="the quick tier (every layer, small shapes: the QUICK list in tests/conftest.py)"
else
    tier="the full suite (what CI runs)"
fi
echo "== scripts/test.sh: $tier; times are for 2 cores"
n=0
item() { n=$((n + 1)); echo "   $n. $1"; }
if [ ${#need_apt[@]} -gt 0 ]; then
    item "apt-get install ${need_apt[*]} (about 1-3 min, with Chromium)"
else
    item "system packages: Mesa's lavapipe, python3-venv and Chromium are here"
fi
if [ ! -x .venv/bin/python ]; then
    item "python3 -m venv .venv (a few seconds)"
fi
if [ "$pip_needed" = 1 ]; then
    item "pip: pip itself, then attngen and its test extra into .venv: pytest, pytest-xdist,"
    echo "      hypothesis, NVRTC and nvdisasm (cuda-bindings, nvidia-cuda-nvrtc, nvidia-cuda-nvdisasm),"
    echo "      jsonschema, wgpu and wgpudawn; then PyTorch's CPU build where no torch is found"
    echo "      (about 2-4 min on a fresh machine, most of it downloads; half a minute when up to date)"
else
    item "pip: .venv is up to date with pyproject.toml (ATTNGEN_REINSTALL=1 installs again)"
fi
if [ "$quick" = 1 ]; then
    item "pytest -n auto --quick: lang, plan, backends/cuda (a few NVRTC compiles), backends/wgsl"
    echo "      (a few lavapipe runs), runtime, cli, golden, equivalence (lavapipe), docs (about 2 min)"
    item "Tint (Dawn's null backend) on every WGSL module that pass compiled (seconds)"
    echo "      (no Dawn pass: the full command has it)"
else
    item "pytest -n auto over tests/ (every layer; WGSL on lavapipe, CUDA compiled with NVRTC,"
    echo "      the browser tests in Chromium) (about 9-13 min; more where Mesa's shader cache is empty)"
    item "Tint (Dawn's null backend) on every WGSL module that pass compiled (seconds)"
    if [ "$dawn" = 1 ] && [ -f "$icd" ]; then
        item "a sample of the WGSL tests a second time on Dawn (Tint), SwiftShader (about 3-5 min)"
    elif [ "$dawn" = 1 ]; then
        item "(the Dawn pass needs $icd, which Debian's chromium ships: not here, left out)"
    else
        item "(the Dawn pass: left out, ATTNGEN_TINT=0)"
    fi
fi
if [ $# -gt 0 ]; then echo "   pytest's arguments: $*"; fi

# ---- each step, timed -----------------------------------------------------------------------------
steps=()
step_start=0
begin() { step_start=$SECONDS; echo "-- $1"; }
done_step() { steps+=("$(printf '%-36s %3d:%02d' "$1" $(((SECONDS - step_start) / 60)) $(((SECONDS - step_start) % 60)))"); }
report() {
    [ ${#steps[@]} -gt 0 ] || return 0
    echo "== scripts/test.sh: time per step"
    printf '   %s\n' "${steps[@]}"
    printf '   %-36s %3d:%02d\n' "total" $((SECONDS / 60)) $((SECONDS % 60))
}
trap report EXIT

if [ ${#need_apt[@]} -gt 0 ]; then
    begin "apt-get install ${need_apt[*]}"
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need_apt[@]}" >/dev/null
    done_step "system packages"
fi

if [ ! -x .venv/bin/python ]; then
    begin "python3 -m venv .venv"
    # --system-site-packages lets a GPU machine's CuPy / PyTorch be seen by the tests.
    python3 -m venv --system-site-packages .venv
    done_step "virtual environment"
fi
if [ "$pip_needed" = 1 ]; then
    begin "pip install --upgrade pip; pip install -e '.[test]'"
    rm -f "$stamp"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e '.[test]'
    # PyTorch for the torch.distributed tests (tests/distributed: ring attention with gloo on the
    # CPU): the CPU build that pip finds on this project's machines; a GPU machine's own torch is kept.
    if ! .venv/bin/python -c "import torch" 2>/dev/null; then
        echo "-- pip install torch==2.13.0 (the CPU build: tests/distributed)"
        .venv/bin/python -m pip install -q 'torch==2.13.0'
    fi
    echo "$want_stamp" > "$stamp"
    done_step "Python packages"
fi

# One test process per core (pytest-xdist): the NVRTC compile checks and the lavapipe runs
# dominate and are independent. Pass -n 0 to run in one process. (--dist worksteal measured
# slower here: 9:36 against 8:24 for the first pass, 2026-11-28.)
export ATTNGEN_REQUIRE_BROWSER=${ATTNGEN_REQUIRE_BROWSER:-1}
# One BLAS / OpenMP thread per test process: the workers already fill the cores, and numpy's OpenBLAS
# and torch's OpenMP threads otherwise spin between calls for the CPU time the other worker needs
# (perf: about 25 s of the first pass's CPU time on 2 cores, 2026-11-29). No check depends on the count.
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# Bytecode is written (into __pycache__, which git ignores): pytest's rewritten test modules and
# attngen's own modules are then compiled once, not again in each of the ~70 Python processes the
# command starts (the xdist workers of both passes, the CLI and ring-attention subprocesses, a
# `pytest --collect-only`). A PYTHONDONTWRITEBYTECODE in the caller's environment (this project's
# machines set it) made every one of them compile them anew. No check depends on it.
unset PYTHONDONTWRITEBYTECODE
status=0
# The first pass records every WGSL module the runtime compiles (ATTNGEN_WGSL_RECORD), and Tint,
# Dawn's WGSL compiler (Chrome's), compiles each of them on Dawn's null backend afterwards
# (scripts/tint_check.py: seconds, no adapter needed): every kernel that ran on naga also passes Tint.
rec=$(mktemp -d -t attngen-wgsl-XXXXXX)
tint_check() {
    if [ $# -eq 0 ] || compgen -G "$rec/*.wgsl" >/dev/null; then  # (a -k selection may run no WGSL)
        begin "Tint on the first pass's WGSL modules (Dawn, null backend)"
        .venv/bin/python scripts/tint_check.py "$rec" || status=$?
        done_step "Tint, the recorded modules"
    fi
    rm -rf "$rec"
}
if [ "$quick" = 1 ]; then
    begin "pytest -n auto --quick $*"
    ATTNGEN_WGSL_RECORD=$rec .venv/bin/python -m pytest -n auto --quick "$@" || status=$?
    done_step "pytest, the quick tier"
    tint_check "$@"
    exit $status
fi
begin "pytest -n auto $*"
ATTNGEN_WGSL_RECORD=$rec .venv/bin/python -m pytest -n auto "$@" || status=$?
done_step "pytest"
tint_check "$@"
# The WGSL tests a second time on Dawn, the WebGPU of Chrome (Tint compiles the WGSL instead of
# naga), through wgpudawn on Chromium's SwiftShader Vulkan driver (Dawn does not take Debian 12's
# lavapipe), for Tint's generated code and its results. --tint-pass leaves out the tests whose
# outcome does not depend on the WGSL compiler (TINT_PASS_EXCEPT in tests/conftest.py) and, of each
# family of kernels, all but a sample (TINT_PASS_SAMPLED / TINT_PASS_SAMPLE): every module of the
# first pass has been through Tint above. ATTNGEN_TINT=0 leaves this pass out.
if [ "$dawn" = 1 ] && [ -f "$icd" ]; then
    begin "the WGSL tests on Dawn (Tint), SwiftShader"
    ATTNGEN_WGPU=wgpudawn VK_ICD_FILENAMES=$icd .venv/bin/python -m pytest -n auto tests/backends/wgsl tests/equivalence \
        tests/cli tests/fuzz -k wgsl --tint-pass "$@" || status=$?
    done_step "pytest on Dawn (Tint)"
fi
exit $status
