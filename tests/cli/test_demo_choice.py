"""Which build the demo page runs (examples/web/attngen.js pickKernel, adapterProblem,
requestDevice): the functions themselves, run by Node (no browser, no GPU) on the two manifests
`attngen serve-demo` writes, against made-up adapters shaped like Chrome's (features, limits,
info.subgroupMatrixConfigs as WebIDL objects whose fields are getters, info.subgroupMinSize /
MaxSize). The page in a real browser (SwiftShader: the scalar build) is tests/browser/test_chromium.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from attngen.cli import main

from conftest import ROOT

NODE = shutil.which("node") or shutil.which("nodejs")
pytestmark = pytest.mark.skipif(NODE is None, reason="no Node.js here (the choice is also run in Chromium)")

# Each case: an adapter, what pickKernel returns and, for requestDevice, what the device was asked for.
_DRIVER = r"""
import { adapterProblem, kernelFamily, pickKernel, requestDevice } from "./attngen.mjs";
import { readFileSync } from "node:fs";

class Config {  // like Chrome's GPUSubgroupMatrixConfig: fields are getters, spreading it gives {}
  #c;
  constructor(c) { this.#c = c; }
  get componentType() { return this.#c[0]; }
  get resultComponentType() { return this.#c[1]; }
  get M() { return this.#c[2]; }
  get N() { return this.#c[3]; }
  get K() { return this.#c[4]; }
}
const { manifests, adapters } = JSON.parse(readFileSync(0, "utf8"));
const out = {};
for (const [name, a] of Object.entries(adapters)) {
  const asked = [];
  const adapter = {
    features: new Set(a.features), limits: a.limits,
    info: a.info && { ...a.info, subgroupMatrixConfigs: a.info.configs && a.info.configs.map((c) => new Config(c)) },
    requestDevice: async (d) => { asked.push(d); return { features: new Set(d.requiredFeatures) }; },
  };
  const pick = pickKernel(adapter, manifests);
  let device = null;
  try {
    await requestDevice(manifests[0], adapter);
    device = asked[0];
  } catch (e) { device = "refused: " + e.message; }
  out[name] = { ...pick, family: pick.index >= 0 ? kernelFamily(manifests[pick.index]) : null, device,
                problem: adapterProblem(adapter, manifests[manifests.length - 1]) };
}
console.log(JSON.stringify(out));
"""

LIMITS = {"maxComputeWorkgroupStorageSize": 49152, "maxComputeInvocationsPerWorkgroup": 1024,
          "maxComputeWorkgroupSizeX": 1024}
F16 = ["f16", "f32", 16, 16, 16]
NVIDIA = {"features": ["shader-f16", "subgroups", "chromium-experimental-subgroup-matrix"], "limits": LIMITS,
          "info": {"subgroupMinSize": 32, "subgroupMaxSize": 32,
                   "configs": [["f16", "f16", 16, 16, 16], F16, ["i8", "i32", 16, 16, 32]]}}
ADAPTERS = {
    "nvidia": NVIDIA,
    # Chrome without the experimental feature (or SwiftShader): subgroups, no shader-f16
    "no_feature": {"features": ["subgroups"], "limits": {**LIMITS, "maxComputeWorkgroupStorageSize": 16384},
                   "info": {"subgroupMinSize": 4, "subgroupMaxSize": 4}},
    "only_int8": {**NVIDIA, "info": {**NVIDIA["info"], "configs": [["i8", "i32", 16, 16, 32]]}},
    "sizes_16_to_32": {**NVIDIA, "info": {**NVIDIA["info"], "subgroupMinSize": 16}},
    "no_sizes": {**NVIDIA, "info": {"configs": [F16]}},
    "no_info": {**NVIDIA, "info": None},
    "small_storage": {**NVIDIA, "limits": {**LIMITS, "maxComputeWorkgroupStorageSize": 32768}},
}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """serve-demo's folder for Llama-3-8B (f16, head dim 128, causal): both builds."""
    out = tmp_path_factory.mktemp("demo")
    assert main(["serve-demo", os.path.join(ROOT, "examples", "llama3_8b.attn"), "--target", "wgsl",
                 "--dir", str(out), "--no-serve"]) == 0
    return out


@pytest.fixture(scope="module")
def picked(demo):
    builds = json.loads((demo / "builds.json").read_text())["builds"]
    assert [b["kernel"] for b in builds] == ["kernel-matrix.wgsl", "kernel.wgsl"]
    manifests = [json.loads((demo / (b["kernel"] + ".json")).read_text()) for b in builds]
    shutil.copy(demo / "attngen.js", demo / "attngen.mjs")
    (demo / "driver.mjs").write_text(_DRIVER)
    res = subprocess.run([NODE, "driver.mjs"], cwd=demo, input=json.dumps({"manifests": manifests, "adapters": ADAPTERS}),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_an_adapter_with_the_feature_and_the_config_runs_the_subgroup_matrix_build(picked):
    got = picked["nvidia"]
    assert got["index"] == 0 and got["reasons"] == [None, None]
    assert got["family"] == "subgroup-matrix (16x16x16 f16 -> f32 at subgroup size 32)"
    # the device is asked for the features and limits the manifest names
    assert got["device"]["requiredFeatures"] == ["shader-f16", "subgroups", "chromium-experimental-subgroup-matrix"]
    assert got["device"]["requiredLimits"]["maxComputeWorkgroupStorageSize"] == 33808


@pytest.mark.parametrize("name, why", [
    ("no_feature", "the kernel needs shader-f16, chromium-experimental-subgroup-matrix, which this adapter lacks"),
    ("only_int8", "the kernel uses 16x16x16 f16 -> f32 subgroup matrices; the adapter lists 16x16x32 i8 -> i32"),
    ("sizes_16_to_32", "subgroups of exactly 32 invocations; the adapter reports 16 to 32"),
    ("no_sizes", "subgroups of exactly 32 invocations; the adapter reports no subgroup sizes"),
    ("no_info", "the adapter lists no subgroup-matrix configs"),
    ("small_storage", "the kernel needs maxComputeWorkgroupStorageSize = 33808; the adapter has 32768"),
])
def test_otherwise_the_scalar_build_runs_and_the_page_can_say_why(picked, name, why):
    got = picked[name]
    assert got["index"] == 1 and got["family"] == "scalar", got
    assert why in got["reasons"][0], got["reasons"][0]
    assert got["reasons"][1] is None and got["problem"] is None
    assert got["device"] == "refused: " + got["reasons"][0]  # requestDevice refuses the matrix build, saying why
