"""The WGSL kernels in a real browser (issue 14): headless Chromium on SwiftShader (Dawn and its
Tint compiler, no shader-f16) runs generated webgpu-core kernels through examples/web/attngen.js,
the dependency-free runtime that follows only the manifest, and the results are compared with
the float64 reference. Chromium is Debian's `chromium` package (scripts/test.sh installs it);
without it these tests are skipped, unless ATTNGEN_REQUIRE_BROWSER=1 makes that a failure."""

from __future__ import annotations

import base64
import http.server
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading

import numpy as np
import pytest

import attngen
from attngen.reference import reference, relative_error, tolerance

from conftest import ROOT, random_qkv, spec_of

BROWSER = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)
if BROWSER is None and os.environ.get("ATTNGEN_REQUIRE_BROWSER") == "1":
    raise RuntimeError("ATTNGEN_REQUIRE_BROWSER=1 but no chromium on PATH")
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no chromium on PATH (scripts/test.sh installs it)")

# (name, spec body, B, Lq, Lk, Hq, Hkv): odd lengths, Lq != Lk, GQA 7, f16 packed in u32 words
CASES = [
    ("plain_f32", "head_dim 64\n dtype f32", 2, 7, 113, 4, 2),
    ("causal_gqa7_f32", "head_dim 32\n dtype f32\n mask causal(bottom_right)", 1, 13, 113, 7, 1),
    ("causal_f16_packed", "head_dim 64\n dtype f16\n mask causal\n target wgsl { f16=packed }", 2, 37, 37, 2, 2),
    ("window_softcap_f32", "head_dim 64\n dtype f32\n mask window(left=9, right=3)\n softcap 30", 1, 50, 61, 2, 1),
    ("decode_f16_packed", "head_dim 128\n dtype f16\n target wgsl { f16=packed }", 3, 1, 1023, 4, 4),
    # subgroup reductions: Tint needs `enable subgroups;` (the webgpu-core dialect), SwiftShader
    # runs subgroups of 4
    ("subgroups_f32", "head_dim 64\n dtype f32\n mask causal\n target wgsl { subgroups=on }", 2, 19, 40, 4, 2),
    # decode schedules: workspaces from the manifest's byte formulas and fill words, S from
    # split_kv(N) or the manifest's split rule, then the combine
    ("split3_gqa4_f16_packed", "head_dim 64\n dtype f16\n schedule split_kv(3)\n target wgsl { f16=packed }",
     2, 1, 301, 8, 2),
    ("two_pass_window_f32", "head_dim 32\n dtype f32\n mask window(left=50)\n schedule two_pass", 1, 3, 257, 4, 4),
    ("split_auto_gqa7_f32", "head_dim 64\n dtype f32\n mask causal(bottom_right)\n schedule split_kv(auto)",
     1, 5, 400, 7, 1),
    ("head_dim_512_f16_packed", "head_dim 512\n dtype f16\n mask causal\n target wgsl { f16=packed }", 1, 9, 30, 2, 1),
]

def _paged(rng):
    """Decode over a paged cache (attngen run's: the keys scattered over shuffled pages), with
    kv_lens and a block table, split_kv(auto)."""
    from attngen.harness.runner import runtime_inputs
    spec = spec_of(CACHE_CASES[0][1])
    q = rng.standard_normal((3, 1, 8, 64)).astype(np.float32)
    k, v = (rng.standard_normal((3, 100, 2, 64)).astype(np.float32) for _ in range(2))
    k, v, opts = runtime_inputs(spec, q, k, v, rng)
    table = opts["block_table"]
    case = {"B": 3, "Lq": 1, "Lk": 100, "Hq": 8, "Hkv": 2,
            "cache": {"kvLens": opts["kv_lens"].tolist(), "blockTable": table.reshape(-1).tolist(),
                      "Pmax": table.shape[1], "page": 16}}
    return {"q": q, "k": k, "v": v}, case, opts, (k, v)


def _append(rng):
    """A padded cache with kv_lens and three rows appended in the same call (chunked prefill)."""
    lens = np.array([0, 13, 30], np.int32)
    k, v = rng.standard_normal((3, 40, 2, 32)).astype(np.float32), rng.standard_normal((3, 40, 2, 32)).astype(np.float32)
    k_new, v_new = (rng.standard_normal((3, 3, 2, 32)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((3, 3, 4, 32)).astype(np.float32)
    k_after, v_after = k.copy(), v.copy()  # the cache the reference sees: the new rows after each sequence's
    for b, n in enumerate(lens):
        k_after[b, n:n + 3], v_after[b, n:n + 3] = k_new[b], v_new[b]
    case = {"B": 3, "Lq": 3, "Lk": 40, "Hq": 4, "Hkv": 2, "cache": {"kvLens": lens.tolist(), "Lnew": 3}}
    return ({"q": q, "k": k, "v": v, "k_new": k_new, "v_new": v_new}, case, {"kv_lens": lens + 3},
            (k_after, v_after))


def _paged_append(rng):
    """A paged cache with kv_lens and two rows appended in the same call (pages shuffled)."""
    lens, lnew, page = np.array([5, 17], np.int32), 2, 8
    per = -(-(lens + lnew) // page)
    order = rng.permutation(int(per.sum()) + 2)
    table = np.zeros((2, int(per.max())), np.int32)
    table[0, :per[0]], table[1, :per[1]] = order[:per[0]], order[per[0]:per[0] + per[1]]
    k, v = (rng.standard_normal((len(order), page, 2, 32)).astype(np.float32) for _ in range(2))
    k_new, v_new = (rng.standard_normal((2, lnew, 2, 32)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((2, lnew, 4, 32)).astype(np.float32)
    k_after, v_after = k.copy(), v.copy()
    for b in range(2):
        for i in range(lnew):
            j = int(lens[b]) + i
            k_after[table[b, j // page], j % page], v_after[table[b, j // page], j % page] = k_new[b, i], v_new[b, i]
    case = {"B": 2, "Lq": lnew, "Lk": int(lens.max()) + lnew, "Hq": 4, "Hkv": 2,
            "cache": {"kvLens": lens.tolist(), "blockTable": table.reshape(-1).tolist(), "Pmax": table.shape[1],
                      "page": page, "Lnew": lnew}}
    return ({"q": q, "k": k, "v": v, "k_new": k_new, "v_new": v_new}, case,
            {"kv_lens": lens + lnew, "block_table": table}, (k_after, v_after))


def _packed(rng):
    """Three documents of 5, 1 and 17 rows packed into one sequence (cu_seqlens), causal in each."""
    cu = np.array([0, 5, 6, 23], np.int32)
    q = rng.standard_normal((23, 4, 32)).astype(np.float32)
    k, v = (rng.standard_normal((23, 2, 32)).astype(np.float32) for _ in range(2))
    case = {"B": 3, "Lq": 17, "Lk": 17, "Hq": 4, "Hkv": 2, "Tq": 23, "cache": {"cuSeqlensQ": cu.tolist()}}
    return {"q": q, "k": k, "v": v}, case, {"cu_seqlens_q": cu}, (k, v)


# (name, spec body, inputs builder): launches with a KV cache or packed sequences
CACHE_CASES = [
    ("paged_split_f16_packed", "head_dim 64\n dtype f16\n mask causal(bottom_right)\n kv_cache paged(page=16)\n"
     " schedule split_kv(auto)\n target wgsl { f16=packed }", _paged),
    ("append_kv_lens_f32", "head_dim 32\n dtype f32\n mask causal(bottom_right)", _append),
    ("packed_documents_f32", "head_dim 32\n dtype f32\n mask causal", _packed),
    ("paged_append_f32", "head_dim 32\n dtype f32\n mask causal(bottom_right)\n kv_cache paged(page=8)",
     _paged_append),
    ("custom_documents_f32", "head_dim 32\n dtype f32\n mask custom", None),  # _custom, below
]

def _custom(rng):
    """A custom boolean mask (three documents, causal inside, holes): the block-mask builder runs
    first in the browser, then the kernel walks its tile lists."""
    from attngen.harness.runner import runtime_inputs
    q, k, v = (rng.standard_normal((1, 45, 2, 32)).astype(np.float32) for _ in range(3))
    k, v, opts = runtime_inputs(spec_of("head_dim 32\n dtype f32\n mask custom"), q, k, v, rng)
    mask = opts["mask"]
    case = {"B": 1, "Lq": 45, "Lk": 45, "Hq": 2, "Hkv": 2,
            "cache": {"mask": mask.astype(np.uint8).reshape(-1).tolist(), "maskShape": list(mask.shape)}}
    return {"q": q, "k": k, "v": v}, case, {"mask": mask}, (k, v)


CACHE_CASES[-1] = (*CACHE_CASES[-1][:2], _custom)

PAGE = """<!doctype html><meta charset="utf-8"><title>attngen browser test</title><pre id="log"></pre>
<script type="module">
import { loadKernel } from "/web/attngen.js";
const log = (s) => { document.getElementById("log").textContent += s + "\\n"; };
const b64 = (buf) => { let s = ""; const u = new Uint8Array(buf); for (let i = 0; i < u.length; i++) s += String.fromCharCode(u[i]); return btoa(s); };
const cases = await (await fetch("/cases.json")).json();
const results = {};
for (const c of cases) {
  try {
    const wgsl = await (await fetch(`/${c.name}/kernel.wgsl`)).text();
    const manifest = await (await fetch(`/${c.name}/kernel.wgsl.json`)).json();
    const blockMask = manifest.block_mask ? await (await fetch(`/${c.name}/block_mask.wgsl`)).text() : null;
    const kernel = await loadKernel(wgsl, manifest, undefined, { blockMask });  // a device with its features
    const Arr = manifest.dtype === "f16" ? Uint16Array : Float32Array;
    const get = async (n) => new Arr(await (await fetch(`/${c.name}/${n}.bin`)).arrayBuffer());
    const cache = {};  // a KV cache: kv_lens, block table, appended rows
    if (c.cache) {
      const x = c.cache;
      if (x.kvLens) cache.kvLens = Int32Array.from(x.kvLens);
      if (x.blockTable) Object.assign(cache, { blockTable: Int32Array.from(x.blockTable), Pmax: x.Pmax, page: x.page });
      if (x.Lnew) Object.assign(cache, { kNew: await get("k_new"), vNew: await get("v_new"), Lnew: x.Lnew });
      if (x.cuSeqlensQ) cache.cuSeqlensQ = Int32Array.from(x.cuSeqlensQ);
      if (x.mask) Object.assign(cache, { mask: Uint8Array.from(x.mask), maskShape: x.maskShape });
    }
    const { out, lse } = await kernel.run({ q: await get("q"), k: await get("k"), v: await get("v"),
                                            B: c.B, Lq: c.Lq, Lk: c.Lk, Hq: c.Hq, Hkv: c.Hkv, lse: true, ...cache });
    results[c.name] = { out: b64(out.buffer), lse: b64(lse.buffer) };
    log(`${c.name}: ok`);
  } catch (e) {
    results[c.name] = { error: String(e && e.message || e) };
    log(`${c.name}: ${e}`);
  }
}
await fetch("/results", { method: "POST", body: JSON.stringify(results) });
</script>
"""


def _serve(root, web, got):
    class Handler(http.server.SimpleHTTPRequestHandler):
        def translate_path(self, path):
            path = path.split("?", 1)[0]
            if path.startswith("/web/"):
                return os.path.join(web, path[len("/web/"):])
            return os.path.join(root, path.lstrip("/"))

        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            try:
                got["results"] = json.loads(body)
            except ValueError:  # the demo page posts its log as text
                got["results"] = body.decode()
            self.send_response(200)
            self.end_headers()
            got["done"].set()

        def log_message(self, *args):
            pass

    Handler.extensions_map = {**Handler.extensions_map, ".js": "text/javascript", ".wgsl": "text/plain"}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _open_in_chromium(root, web, page, timeout):
    """Serve `root` (and `web` under /web/), open `page` in headless Chromium on SwiftShader and
    wait until the page POSTs its results (got["results"]) or `timeout` seconds pass."""
    got = {"done": threading.Event()}
    server = _serve(root, web, got)
    profile_dir = tempfile.mkdtemp(prefix="attngen-chromium-")
    proc = subprocess.Popen([BROWSER, "--headless=new", "--no-sandbox", "--enable-unsafe-webgpu",
                             "--use-webgpu-adapter=swiftshader", "--enable-features=Vulkan", "--disable-gpu-sandbox",
                             f"--user-data-dir={profile_dir}", "--no-first-run",
                             f"http://127.0.0.1:{server.server_address[1]}/{page}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        got["done"].wait(timeout=timeout)
    finally:
        proc.kill()
        proc.wait()
        server.shutdown()
        shutil.rmtree(profile_dir, ignore_errors=True)
    return got


def _write_kernel(root, name, body):
    """root/name/: the webgpu-core kernel of `body`, its manifest and (mask custom) its block-mask
    builder, as the page fetches them; returns the spec."""
    spec = spec_of(body, name=name)
    em = attngen.emit(spec, target="wgsl", profile="webgpu-core")
    files = {"kernel.wgsl": em.source, "kernel.wgsl.json": json.dumps(em.manifest)}
    helper = attngen.backends.get("wgsl").helper_sources(em.plan).get("block-mask")
    if helper is not None:
        files["block_mask.wgsl"] = helper
    os.makedirs(os.path.join(root, name))
    for file, text in files.items():
        with open(os.path.join(root, name, file), "w") as f:
            f.write(text)
    return spec


@pytest.fixture(scope="module")
def browser_results():
    """Build every case, run them all in one headless Chromium, return {name: (spec, inputs, result)}."""
    tmp = tempfile.mkdtemp(prefix="attngen-browser-")
    cases, inputs = [], {}
    for name, body, b, lq, lk, hq, hkv in CASES:
        spec = _write_kernel(tmp, name, body)
        q, k, v = random_qkv(spec, b, lq, lk, heads_q=hq, heads_kv=hkv, seed=lq + lk)
        dt = np.float16 if spec.dtype == "f16" else np.float32
        for n, a in (("q", q), ("k", k), ("v", v)):
            a.astype(dt).tofile(os.path.join(tmp, name, f"{n}.bin"))
        inputs[name] = (spec, [a.astype(dt).astype(np.float32) for a in (q, k, v)], {})
        cases.append({"name": name, "B": b, "Lq": lq, "Lk": lk, "Hq": hq, "Hkv": hkv})
    for name, body, build in CACHE_CASES:
        spec = _write_kernel(tmp, name, body)
        dt = np.float16 if spec.dtype == "f16" else np.float32
        arrays, case, ref_kw, ref_kv = build(np.random.default_rng(len(name)))
        for n, a in arrays.items():
            a.astype(dt).tofile(os.path.join(tmp, name, f"{n}.bin"))
        q = arrays["q"].astype(dt).astype(np.float32)
        k, v = (a.astype(dt).astype(np.float32) for a in ref_kv)
        inputs[name] = (spec, [q, k, v], ref_kw)
        cases.append({"name": name, **case})
    with open(os.path.join(tmp, "cases.json"), "w") as f:
        json.dump(cases, f)
    with open(os.path.join(tmp, "index.html"), "w") as f:
        f.write(PAGE)
    got = _open_in_chromium(tmp, os.path.join(ROOT, "examples", "web"), "index.html", timeout=240)
    finished = got["done"].is_set()
    assert finished, "Chromium did not report back within 240 s"
    results = got["results"]
    shutil.rmtree(tmp, ignore_errors=True)
    return {name: (*inputs[name], results.get(name), c) for name, c in ((c["name"], c) for c in cases)}


@pytest.mark.parametrize("name", [c[0] for c in CASES] + [c[0] for c in CACHE_CASES])
def test_the_browser_computes_the_reference(browser_results, name):
    spec, (q, k, v), ref_kw, result, case = browser_results[name]
    assert result is not None and "error" not in result, result
    dt = np.float16 if spec.dtype == "f16" else np.float32
    out = np.frombuffer(base64.b64decode(result["out"]), dt).astype(np.float64)
    lse = np.frombuffer(base64.b64decode(result["lse"]), np.float32).astype(np.float64)
    if "Tq" in case:  # packed sequences: (total_q, Hq, Dv) and (Hq, total_q)
        out, lse = out.reshape(case["Tq"], case["Hq"], spec.head_dim_v), lse.reshape(case["Hq"], case["Tq"])
    else:
        out = out.reshape(case["B"], case["Lq"], case["Hq"], spec.head_dim_v)
        lse = lse.reshape(case["B"], case["Hq"], case["Lq"])
    ref, ref_lse = reference(spec, q, k, v, return_lse=True, **ref_kw)
    assert not np.isnan(out).any()
    assert relative_error(out, ref) <= tolerance(spec)
    empty = np.isneginf(ref_lse)
    assert np.array_equal(np.isneginf(lse), empty)
    assert np.abs(lse[~empty] - ref_lse[~empty]).max() <= 1e-2 * max(1.0, np.abs(ref_lse[~empty]).max())


def test_the_demo_page_runs_a_kernel(tmp_path):
    """examples/web/index.html as `attngen serve-demo --no-serve` writes it, for Llama-3 with f16
    packed in u32 words (SwiftShader has no shader-f16), served over HTTP: the page reports a time
    and no error."""
    from attngen.cli import main
    web = os.path.join(ROOT, "examples", "web")
    text = open(os.path.join(ROOT, "examples", "llama3_8b.attn")).read().replace(
        "    mask       causal\n", "    mask       causal\n    target     wgsl { f16=packed }\n")
    (tmp_path / "llama.attn").write_text(text)
    assert main(["serve-demo", str(tmp_path / "llama.attn"), "--target", "wgsl", "--dir", str(tmp_path / "page"),
                 "--no-serve"]) == 0
    tmp_path = tmp_path / "page"
    got = _open_in_chromium(str(tmp_path), web, "index.html?Lq=33&Lk=70&report=/results", timeout=180)
    assert got["done"].is_set(), "the page did not report back within 180 s"
    log = got["results"]
    assert "llama3_8b_prefill: f16 (packed)" in log and "B=1 Lq=33 Lk=70 Hq=32 Hkv=8:" in log, log
    assert "error" not in log, log
    # the family it runs and why: f16=packed has no subgroup-matrix build
    assert "family: scalar, kernel.wgsl" in log and "no subgroup-matrix build: " in log and "f16=packed" in log, log
    # the page's own float64 check of 16 rows (the causal mask of the spec, JavaScript)
    diff = float(re.search(r"relative difference (\S+) \(within the f16 tolerance", log).group(1))
    assert diff < 2e-3, log


def test_the_demo_page_picks_the_build_the_adapter_runs(tmp_path):
    """Llama-3 as written: serve-demo writes the subgroup-matrix build (for Chrome on NVIDIA) and the
    scalar one; SwiftShader has neither shader-f16 nor f16 subgroup matrices, so the page passes the
    first over, saying why, and runs the scalar build (f16 packed) correctly."""
    from attngen.cli import main
    assert main(["serve-demo", os.path.join(ROOT, "examples", "llama3_8b.attn"), "--target", "wgsl",
                 "--dir", str(tmp_path / "page"), "--no-serve"]) == 0
    got = _open_in_chromium(str(tmp_path / "page"), os.path.join(ROOT, "examples", "web"),
                            "index.html?Lq=33&Lk=70&report=/results", timeout=180)
    assert got["done"].is_set(), "the page did not report back within 180 s"
    log = got["results"]
    assert "error" not in log, log
    assert "family: scalar, kernel.wgsl" in log, log
    passed = re.search(r"passed over kernel-matrix.wgsl \(subgroup-matrix\): (.*)", log)
    assert passed and "the kernel needs shader-f16" in passed.group(1) and "which this adapter lacks" in passed.group(1), log
    assert re.search(r"relative difference (\S+) \(within the f16 tolerance", log), log


BROKEN_PAGE = """<!doctype html><script type="module">
import { loadKernel } from "/web/attngen.js";
let report;
try {
  const wgsl = await (await fetch("/kernel.wgsl")).text();
  const manifest = await (await fetch("/kernel.wgsl.json")).json();
  await loadKernel(wgsl, manifest);
  report = "loaded";
} catch (e) { report = String(e.message || e); }
await fetch("/results", { method: "POST", body: report });
</script>
"""


def test_a_compilation_error_names_its_line_and_section(tmp_path):
    """A kernel that Tint refuses (a line broken in the epilogue) is reported with line:col and
    the template section it is in; a manifest of another version is refused before compiling."""
    em = attngen.emit(spec_of("head_dim 32\n dtype f32"), target="wgsl", profile="webgpu-core")
    lines = em.source.split("\n")
    at = next(i for i, ln in enumerate(lines) if "section: epilogue" in ln) + 3
    lines[at] = "    let broken = ;"
    (tmp_path / "kernel.wgsl").write_text("\n".join(lines))
    (tmp_path / "kernel.wgsl.json").write_text(json.dumps(em.manifest))
    (tmp_path / "index.html").write_text(BROKEN_PAGE)
    got = _open_in_chromium(str(tmp_path), os.path.join(ROOT, "examples", "web"), "index.html", timeout=120)
    assert got["done"].is_set()
    assert got["results"].startswith(f"WGSL: {at + 1}:") and "(section epilogue" in got["results"], got["results"]
    (tmp_path / "kernel.wgsl.json").write_text(json.dumps({**em.manifest, "manifest_version": 2}))
    got = _open_in_chromium(str(tmp_path), os.path.join(ROOT, "examples", "web"), "index.html", timeout=120)
    assert "manifest version 2; this runtime reads version 1" in got["results"], got["results"]
