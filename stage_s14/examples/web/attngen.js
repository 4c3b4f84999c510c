// attngen's WGSL kernels in a web page: a dependency-free ES module that loads a generated
// .wgsl file and its manifest (`attngen build SPEC --target wgsl -o k.wgsl`, and with
// `--emit manifest -o k.wgsl.json`; `attngen serve-demo` does both beside a demo page) and runs
// the kernel exactly as the manifest says: the bindings and
// their types, the Params uniform (each field's `value` formula), the workgroup counts
// (`dispatch` formulas), the features to request. Nothing here knows attngen's Python.
//
//   import { loadKernel } from "./attngen.js";
//   const kernel = await loadKernel(await (await fetch("k.wgsl")).text(),
//                                   await (await fetch("k.wgsl.json")).json());
//   const { out, lse } = await kernel.run({ q, k, v, B, Lq, Lk, Hq, Hkv, lse: true });
//
// Several builds of one kernel (the subgroup-matrix family and the scalar one): pickKernel(adapter,
// manifests) says which the adapter runs and why not the others; requestDevice(manifest, adapter)
// makes its device, to pass to loadKernel.
//
// Inputs are contiguous (B, L, H, D) arrays: Float32Array for dtype f32, Uint16Array of f16 bits
// for dtype f16 (native or packed storage alike: the bytes are the same). This runtime covers
// the fused and split schedules over contiguous tensors, packed sequences (cu_seqlens) or a KV
// cache (kv_lens, paged, appends), and custom masks through their block-mask builder (docs/web.md).

// ---- formulas ------------------------------------------------------------------------------
// The manifest's formula grammar: integers, names, a + b, a * b, ceil(a / b).
export function evaluate(formula, sizes) {
  const text = String(formula);
  let at = 0;
  const fail = (why) => { throw new Error(`formula ${JSON.stringify(text)}: ${why} at ${at}`); };
  const space = () => { while (text[at] === " ") at++; };
  const expect = (s) => { space(); if (text.slice(at, at + s.length) !== s) fail(`expected '${s}'`); at += s.length; };
  function atom() {
    space();
    const m = /^[0-9]+|^[A-Za-z_][A-Za-z0-9_]*/.exec(text.slice(at));
    if (!m) fail("expected a number, a name or ceil(a / b)");
    at += m[0].length;
    if (/^[0-9]/.test(m[0])) return Number(m[0]);
    if (m[0] === "ceil") {
      expect("("); const a = sum(); expect("/"); const b = sum(); expect(")");
      return Math.ceil(a / b);
    }
    if (!(m[0] in sizes)) fail(`unknown symbol ${m[0]}`);
    return sizes[m[0]];
  }
  function product() { let v = atom(); for (;;) { space(); if (text[at] !== "*") return v; at++; v *= atom(); } }
  function sum() { let v = product(); for (;;) { space(); if (text[at] !== "+") return v; at++; v += product(); } }
  const value = sum();
  space();
  if (at !== text.length) fail("unexpected text");
  return value;
}

// ---- device --------------------------------------------------------------------------------
const FEATURE = { "shader-f16": "shader-f16", "subgroups": "subgroups" };

// The device limits a kernel needs (its manifest's workgroup memory and invocations).
function requiredLimits(manifest) {
  return { maxComputeWorkgroupStorageSize: manifest.workgroup_storage_bytes,
           maxComputeInvocationsPerWorkgroup: manifest.workgroup_size[0],
           maxComputeWorkgroupSizeX: manifest.workgroup_size[0] };
}

const matrixText = (c) => `${c.M}x${c.N}x${c.K} ${c.componentType} -> ${c.resultComponentType}`;

// Why `adapter` (a GPUAdapter) cannot run the kernel of `manifest`, as a sentence, or null where it
// can: the manifest's features and limits, and for a subgroup-matrix kernel (the manifest has a
// `subgroup_matrix` section) the same config (M, N, K, component and result types) among the
// adapter's `info.subgroupMatrixConfigs` (Chrome's experimental API, with the feature
// "chromium-experimental-subgroup-matrix") and subgroups of exactly the config's size
// (`info.subgroupMinSize` = `info.subgroupMaxSize`). Whatever the adapter does not report counts
// as missing, so a browser without these fields falls back to another build.
export function adapterProblem(adapter, manifest) {
  const missing = manifest.features.map((f) => FEATURE[f] || f).filter((f) => !adapter.features.has(f));
  if (missing.length) {
    return `the kernel needs ${missing.join(", ")}, which this adapter lacks` +
           (missing.includes("shader-f16") && !manifest.subgroup_matrix ? " (build it with target wgsl { f16=packed })" : "");
  }
  for (const [key, value] of Object.entries(requiredLimits(manifest))) {
    if (!(value <= adapter.limits[key])) return `the kernel needs ${key} = ${value}; the adapter has ${adapter.limits[key]}`;
  }
  const sm = manifest.subgroup_matrix;
  if (sm) {
    const info = adapter.info || {};
    const configs = Array.from(info.subgroupMatrixConfigs || []);
    const want = { M: sm.m, N: sm.n, K: sm.k, componentType: sm.component, resultComponentType: sm.result };
    const same = (c) => Object.keys(want).every((key) => String(c[key]) === String(want[key]));
    if (!configs.some(same)) {
      return `the kernel uses ${matrixText(want)} subgroup matrices; the adapter lists ` +
             (configs.length ? configs.map(matrixText).join(", ") : "no subgroup-matrix configs");
    }
    if (info.subgroupMinSize !== sm.min_subgroup_size || info.subgroupMaxSize !== sm.max_subgroup_size) {
      return `the kernel needs subgroups of exactly ${sm.max_subgroup_size} invocations; the adapter reports ` +
             (info.subgroupMinSize === undefined ? "no subgroup sizes" : `${info.subgroupMinSize} to ${info.subgroupMaxSize}`);
    }
  }
  return null;
}

// Which of several builds of one kernel to run on `adapter`: `manifests` in order of preference
// (e.g. the subgroup-matrix build, then the scalar one: `attngen serve-demo` lists them in
// builds.json). Returns { index, reasons }: the first manifest the adapter can run (-1: none), and
// for each manifest why it cannot (null where it can).
export function pickKernel(adapter, manifests) {
  const reasons = manifests.map((m) => adapterProblem(adapter, m));
  return { index: reasons.indexOf(null), reasons };
}

// In words, why `manifest` runs on an adapter that adapterProblem() passed.
export function kernelFamily(manifest) {
  const sm = manifest.subgroup_matrix;
  if (!sm) return "scalar";
  const config = { M: sm.m, N: sm.n, K: sm.k, componentType: sm.component, resultComponentType: sm.result };
  return `subgroup-matrix (${matrixText(config)} at subgroup size ${sm.max_subgroup_size})`;
}

// A device for the kernel of `manifest` on `adapter` (default: the browser's first), with the
// features and limits the manifest names; an adapter that cannot run it is an error saying why.
export async function requestDevice(manifest, adapter = null) {
  if (!adapter) {
    if (!navigator.gpu) throw new Error("this browser has no WebGPU (navigator.gpu)");
    adapter = await navigator.gpu.requestAdapter();
    if (!adapter) throw new Error("no WebGPU adapter");
  }
  const problem = adapterProblem(adapter, manifest);
  if (problem) throw new Error(problem);
  return adapter.requestDevice({ requiredFeatures: manifest.features.map((f) => FEATURE[f] || f),
                                 requiredLimits: requiredLimits(manifest) });
}

// ---- the kernel ----------------------------------------------------------------------------
const BYTES = { f16: 2, f32: 4, u32: 4, i32: 4, u8: 1 };
const MANIFEST_VERSION = 1;
// WebGPU buffer sizes: multiples of 4 bytes, at least 16 (q, k and v bind as arrays of vec4 items)
const ALIGN = (n) => Math.max(16, Math.ceil(n / 4) * 4);

// `blockMask`: the block-mask builder's WGSL (`attngen build SPEC --target wgsl --emit block-mask`),
// needed by mask custom kernels (the manifest has a block_mask section then).
export async function loadKernel(wgsl, manifest, device, { blockMask = null } = {}) {
  if (manifest.target !== "wgsl") throw new Error(`not a WGSL manifest (target ${manifest.target})`);
  if (manifest.manifest_version !== MANIFEST_VERSION) {
    throw new Error(`manifest version ${manifest.manifest_version}; this runtime reads version ${MANIFEST_VERSION} ` +
                    "(docs/manifest-wgsl.schema.json): rebuild the kernel with a matching attngen");
  }
  if (!["fused", "split_kv", "two_pass"].includes(manifest.schedule.kind)) {
    throw new Error(`schedule ${manifest.schedule.kind}: not known to this runtime (docs/web.md)`);
  }
  if (manifest.block_mask && !blockMask) {
    throw new Error("a mask custom kernel needs its block-mask builder: loadKernel(wgsl, manifest, device, " +
                    "{ blockMask }) with the output of attngen build --emit block-mask");
  }
  device = device || await requestDevice(manifest);
  const lacking = manifest.features.map((f) => FEATURE[f] || f).filter((f) => !device.features.has(f));
  if (lacking.length) throw new Error(`the device was made without ${lacking.join(", ")}, which the kernel needs`);
  const module = device.createShaderModule({ code: wgsl });
  const info = await module.getCompilationInfo();
  const errors = info.messages.filter((m) => m.type === "error");
  if (errors.length) {
    // each message with the template section its line is in (the `// ---- section: NAME` comments)
    const lines = wgsl.split("\n");
    const section = (n) => {
      for (let i = Math.min(n, lines.length) - 1; i >= 0; i--) {
        const s = /\/\/ ---- section: ([^-]+?)\s*-*$/.exec(lines[i]);
        if (s) return ` (section ${s[1]})`;
      }
      return "";
    };
    throw new Error("WGSL: " + errors.map((m) => `${m.lineNum}:${m.linePos}${section(m.lineNum)} ${m.message}`).join("; "));
  }
  const byNumber = Object.fromEntries(manifest.bindings.map((b) => [b.binding, b]));
  const entries = manifest.entry_points.map((e) => {
    const layout = device.createBindGroupLayout({
      entries: e.bindings.map((n) => ({
        binding: n, visibility: GPUShaderStage.COMPUTE,
        buffer: { type: byNumber[n].type === "uniform" ? "uniform" : byNumber[n].type },
      })),
    });
    const pipeline = device.createComputePipeline({
      layout: device.createPipelineLayout({ bindGroupLayouts: [layout] }),
      compute: { module, entryPoint: e.entry_point },
    });
    return { ...e, layout, pipeline };
  });
  let builder = null;
  if (manifest.block_mask) {
    const bmModule = device.createShaderModule({ code: blockMask });
    const layout = device.createBindGroupLayout({ entries: manifest.block_mask.bindings.map((b) => ({
      binding: b.binding, visibility: GPUShaderStage.COMPUTE, buffer: { type: b.type } })) });
    const pipelineLayout = device.createPipelineLayout({ bindGroupLayouts: [layout] });
    builder = { layout, entries: manifest.block_mask.entry_points.map((e) => ({ ...e,
      pipeline: device.createComputePipeline({ layout: pipelineLayout, compute: { module: bmModule, entryPoint: e.entry_point } }) })) };
  }
  return new Kernel(device, manifest, byNumber, entries, builder);
}

class Kernel {
  constructor(device, manifest, byNumber, entries, builder) {
    Object.assign(this, { device, manifest, byNumber, entries, builder });
  }

  // KV splits of a launch (the symbol S): 1 for fused, N for split_kv(N), else the manifest's
  // split_rule over the shapes and the device's compute units.
  splits({ B, Lq, Lk, Hq, Hkv }, computeUnits = 8) {
    const s = this.manifest.schedule;
    if (s.kind === "fused") return 1;
    if (s.splits_fixed) return s.splits_fixed;
    const r = s.split_rule;
    const blocks = r.rows_per_kv_head ? B * Hkv * Math.max(1, Math.ceil(Lq * (Hq / Hkv) / r.tile_q))
                                      : B * Hq * Math.max(1, Math.ceil(Lq / r.tile_q));
    const want = Math.max(1, Math.floor(r.blocks_per_core * computeUnits / Math.max(blocks, 1)));
    const most = Math.max(1, Math.floor(Lk / (r.min_tiles_per_split * r.tile_kv)));
    return Math.min(want, most, r.max_splits);
  }

  // Run once: {q, k, v, B, Lq, Lk, Hq, Hkv, lse: bool, computeUnits} and, for a KV cache,
  // kvLens (Int32Array, B: keys cached per sequence), blockTable (Int32Array, B x Pmax row-major)
  // with page (rows per page: k and v are then (pages, page, Hkv, D)), kNew / vNew (B, Lnew, Hkv, D)
  // with Lnew (appended to the cache in place, and seen by this call). Lk: k's rows per sequence
  // (padded), or is computed (max kvLens + Lnew). Returns {out, lse} (out as the input array type,
  // lse as Float32Array of (B, Hq, Lq) or null).
  //   Packed sequences: cuSeqlensQ (Int32Array, B + 1 offsets into q's rows) and cuSeqlensK (k's;
  //   default cuSeqlensQ): q is then (total_q, Hq, D), k and v (total_k, Hkv, D), out
  //   (total_q, Hq, Dv) and lse (Hq, total_q); Lq and Lk are computed (the longest sequence's).
  async run({ q, k, v, B, Lq, Lk, Hq, Hkv, lse = false, computeUnits = 8,
              kvLens = null, blockTable = null, Pmax = 0, page = 0, kNew = null, vNew = null, Lnew = 0,
              cuSeqlensQ = null, cuSeqlensK = null, mask = null, maskShape = null }) {
    const m = this.manifest, dev = this.device;
    const packed = cuSeqlensQ !== null;
    if (packed) {
      if (blockTable || kNew) throw new Error("packed sequences with a paged cache or an append are not supported here");
      cuSeqlensK = cuSeqlensK || cuSeqlensQ;
      B = cuSeqlensQ.length - 1;
      const longest = (cu) => Math.max(0, ...Array.from({ length: B }, (_, i) => cu[i + 1] - cu[i]));
      Lq = longest(cuSeqlensQ);
      Lk = longest(cuSeqlensK);
    }
    if (Hq % Hkv) throw new Error(`Hq = ${Hq} is not a multiple of Hkv = ${Hkv}`);
    if (blockTable && !(kvLens && page && Pmax)) throw new Error("a paged cache needs kvLens, page and Pmax");
    if ((kNew || vNew) && !(kNew && vNew && Lnew && kvLens)) throw new Error("an append needs kNew, vNew, Lnew and kvLens");
    const Dqk = m.grid_symbols.Dqk, Dv = m.grid_symbols.Dv;
    const Tq = packed ? cuSeqlensQ[B] : B * Lq;
    // rows per sequence of k (padded), rows per page (paged), or all of k's rows (packed)
    const cap = blockTable ? page : packed ? k.length / (Hkv * Dqk) : k.length / (B * Hkv * Dqk);
    if (kvLens) Lk = Math.max(...kvLens) + Lnew;
    // seq_meta: the sections of its layout in order, each right after the previous one
    const meta = [], offsets = {};
    const given = { kv_lens: kvLens, block_table: blockTable, cu_seqlens_q: cuSeqlensQ, cu_seqlens_k: cuSeqlensK };
    for (const s of this.byNumber[m.bindings.find((b) => b.name === "seq_meta").binding].layout.sections) {
      offsets[s.offset] = meta.length;
      if (given[s.name]) meta.push(...given[s.name]);
    }
    const sizes = { B, Lq, Lk, Hq, Hkv, G: Hq / Hkv, Dqk, Dv, write_lse: lse ? 1 : 0,
                    layout: blockTable ? 2 : packed ? 1 : 0, has_kv_lens: kvLens ? 1 : 0, cap, Tq, Lnew, Pmax,
                    ...offsets };
    if (this.builder && !(mask && maskShape)) throw new Error("a mask custom kernel needs mask and maskShape [Bm, Hm, Lq, Lk]");
    if (mask) {
      const [Bm, Hm, Lqm, Lkm] = maskShape;
      Object.assign(sizes, { Bm, Hm, Lqm, Lkm, mask_additive: mask instanceof Float32Array ? 1 : 0 });
    }
    sizes.S = this.splits({ B, Lq, Lk, Hq, Hkv }, computeUnits);
    const elem = BYTES[m.dtype];
    const expect = { q: Tq * Hq * Dqk };
    if (!blockTable && !packed) Object.assign(expect, { k: B * cap * Hkv * Dqk, v: B * cap * Hkv * Dv });
    for (const [name, arr] of Object.entries({ q, k, v })) {
      if (name in expect && arr.length !== expect[name]) {
        throw new Error(`${name} has ${arr.length} elements; (B, L, H, D) needs ${expect[name]}`);
      }
    }
    const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
    const upload = (arr) => {
      const buf = dev.createBuffer({ size: ALIGN(arr.byteLength), usage, mappedAtCreation: true });
      new Uint8Array(buf.getMappedRange()).set(new Uint8Array(arr.buffer, arr.byteOffset, arr.byteLength));
      buf.unmap();
      return buf;
    };
    const outBytes = Tq * Hq * Dv * elem, lseBytes = Tq * Hq * 4;
    const buffers = {
      q: upload(q), k: upload(k), v: upload(v),
      out: dev.createBuffer({ size: ALIGN(outBytes), usage }),
      lse: dev.createBuffer({ size: ALIGN(lse ? lseBytes : 4), usage }),
    };
    if (meta.length) buffers.seq_meta = upload(Uint32Array.from(meta));
    if (kNew) {
      const both = new kNew.constructor(kNew.length + vNew.length);
      both.set(kNew, 0);
      both.set(vNew, kNew.length);
      buffers.kv_new = upload(both);
    }
    // struct Params: every field's value, a formula of the shapes and the launch symbols
    const fields = this.byNumber[0].fields;
    const words = new Uint32Array(this.byNumber[0].size_bytes / 4);
    for (const f of fields) words[f.offset / 4] = evaluate(f.value, sizes);
    buffers.params = dev.createBuffer({ size: words.byteLength, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
    dev.queue.writeBuffer(buffers.params, 0, words);
    // workspaces of the split schedules: their byte formulas, filled where the manifest says
    for (const b of m.bindings) {
      if (!b.layout || !b.layout.bytes || b.name in buffers || b.name === "seq_meta" || b.name === "kv_new") continue;
      const bytes = ALIGN(evaluate(b.layout.bytes, sizes));
      buffers[b.name] = dev.createBuffer({ size: bytes, usage, mappedAtCreation: b.layout.fill_word !== undefined });
      if (b.layout.fill_word !== undefined) {
        new Uint32Array(buffers[b.name].getMappedRange()).fill(b.layout.fill_word);
        buffers[b.name].unmap();
      }
    }
    const dummy = dev.createBuffer({ size: 16, usage });  // optional bindings of a plain launch
    const encoder = dev.createCommandEncoder();
    if (mask) {  // the block-mask builder fills counts and tiles of one buffer: [counts | tiles | data]
      const bm = m.block_mask;
      const field = (name) => evaluate(bm.bindings[0].fields.find((f) => f.name === name).value, sizes);
      const head = field("data");
      const dataWords = mask instanceof Float32Array ? new Uint32Array(mask.buffer, mask.byteOffset, mask.length)
                                                     : new Uint32Array(Uint8Array.from([...mask, 0, 0, 0].slice(0, Math.ceil(mask.length / 4) * 4)).buffer);
      const words = new Uint32Array(head + dataWords.length).fill(bm.fill_word, 0, head);
      words.set(dataWords, head);
      buffers.mask = upload(words);
      const bmWords = Uint32Array.from(bm.bindings[0].fields.map((f) => evaluate(f.value, sizes)));
      const bmParams = dev.createBuffer({ size: bmWords.byteLength, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
      dev.queue.writeBuffer(bmParams, 0, bmWords);
      const group = dev.createBindGroup({ layout: this.builder.layout, entries: [
        { binding: 0, resource: { buffer: bmParams } }, { binding: 1, resource: { buffer: buffers.mask } }] });
      for (const e of this.builder.entries) {
        const pass = encoder.beginComputePass();
        pass.setPipeline(e.pipeline);
        pass.setBindGroup(0, group);
        pass.dispatchWorkgroups(...e.dispatch.map((f) => evaluate(f, sizes)));
        pass.end();
      }
    }
    for (const e of this.entries) {
      const group = dev.createBindGroup({
        layout: e.layout,
        entries: e.bindings.map((n) => ({ binding: n, resource: { buffer: buffers[this.byNumber[n].name] || dummy } })),
      });
      const pass = encoder.beginComputePass();
      pass.setPipeline(e.pipeline);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(...e.dispatch.map((f) => evaluate(f, sizes)));
      pass.end();
    }
    const read = (src, bytes) => {
      const dst = dev.createBuffer({ size: ALIGN(bytes), usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
      encoder.copyBufferToBuffer(src, 0, dst, 0, ALIGN(bytes));
      return dst;
    };
    const outRead = read(buffers.out, outBytes), lseRead = lse ? read(buffers.lse, lseBytes) : null;
    dev.queue.submit([encoder.finish()]);
    await outRead.mapAsync(GPUMapMode.READ);
    const raw = outRead.getMappedRange().slice(0, outBytes);
    const out = m.dtype === "f16" ? new Uint16Array(raw) : new Float32Array(raw);
    let lseOut = null;
    if (lseRead) {
      await lseRead.mapAsync(GPUMapMode.READ);
      lseOut = new Float32Array(lseRead.getMappedRange().slice(0, lseBytes));
    }
    for (const b of [...Object.values(buffers), dummy, outRead, lseRead]) if (b) b.destroy();
    return { out, lse: lseOut };
  }
}
