#!/usr/bin/env bash
# Install everything the tests need on a fresh Debian/Ubuntu machine, then run them.
#   bash scripts/test.sh            # the whole suite (what CI runs)
#   bash scripts/test.sh -k parse   # extra arguments go to pytest (-n 0: one process)
# Installs: the software Vulkan adapter (Mesa's lavapipe, for WGSL through wgpu), Chromium (the
# browser tests: tests/browser, which then must run: ATTNGEN_REQUIRE_BROWSER=1; its SwiftShader
# driver also runs the second pass below), a virtual environment in .venv with attngen (wgpu
# included) and its test extra (pytest, hypothesis, NVRTC for compile checks, wgpudawn). On a
# machine with a GPU and CuPy the CUDA tests run too; else they skip.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 || need_apt+=(mesa-vulkan-drivers libvulkan1)
python3 -c "import venv, ensurepip" 2>/dev/null || need_apt+=(python3-venv)
# Debian's Chromium: the browser tests run the WGSL kernels in it (headless, SwiftShader)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
    # --system-site-packages lets a GPU machine's CuPy / PyTorch be seen by the tests.
    python3 -m venv --system-site-packages .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
# PyTorch for the torch.distributed tests (tests/distributed: ring attention with gloo on the CPU):
# the CPU build that pip finds on this project's machines; a GPU machine's own torch is kept.
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q 'torch==2.13.0'
# One test process per core (pytest-xdist): the NVRTC compile checks and the lavapipe runs
# dominate and are independent. Pass -n 0 to run in one process.
export ATTNGEN_REQUIRE_BROWSER=${ATTNGEN_REQUIRE_BROWSER:-1}
status=0
.venv/bin/python -m pytest -n auto "$@" || status=$?
# The WGSL tests a second time on Dawn, the WebGPU of Chrome (Tint compiles the WGSL instead of
# naga), through wgpudawn on Chromium's SwiftShader Vulkan driver (Dawn does not take Debian 12's
# lavapipe). ATTNGEN_TINT=0 leaves this pass out.
icd=/usr/lib/chromium/vk_swiftshader_icd.json
if [ "${ATTNGEN_TINT:-1}" = 1 ] && [ -f "$icd" ]; then
    echo "-- the WGSL tests on Dawn (Tint), SwiftShader"
    ATTNGEN_WGPU=wgpudawn VK_ICD_FILENAMES=$icd .venv/bin/python -m pytest -n auto tests/backends/wgsl tests/equivalence \
        tests/cli tests/fuzz -k wgsl "$@" || status=$?
fi
exit $status
