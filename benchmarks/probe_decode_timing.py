import statistics, torch, torch.nn.functional as F, cupy as cp, sys
from torch.nn.attention import SDPBackend, sdpa_kernel
sys.path.insert(0, "benchmarks")
import attngen, probe_stream as ps
B, HQ, HKV, D = 8, 32, 8, 128
L = int(sys.argv[1]) if len(sys.argv) > 1 else 32768
q = torch.randn((B, 1, HQ, D), device="cuda", dtype=torch.float16)
k = torch.randn((B, L, HKV, D), device="cuda", dtype=torch.float16)
v = torch.randn_like(k)
qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
nbytes = 2 * k.numel() * 2
text = f"attention dec {{\n head_dim {D}\n heads q={HQ} kv={HKV}\n dtype f16\n schedule split_kv(auto)\n}}"
ours = attngen.compile(attngen.parse(text)[0], target="cuda").prepared(q, k, v)
def flash():
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
def cudnn():
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
f = ps.kernels(128, 2)[0]
smem = 2 * 2 * 128 * 256 + 64
f.max_dynamic_shared_size_bytes = smem
sink = cp.zeros(1, dtype=cp.int32)
kc, vc = cp.asarray(k), cp.asarray(v)
tiles = B * HKV * (L // 128)
def stream():
    f((128,), (128,), (kc, vc, cp.int64(tiles), cp.int32(L // 128), cp.int32(HKV), cp.int64(L), sink), shared_mem=smem)
flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
for mode in ("events+flush", "back-to-back x20"):
    cells = []
    for name, fn in (("stream", stream), ("attngen", ours), ("flash", flash), ("cudnn", cudnn)):
        for _ in range(5): fn()
        ts = []
        for _ in range(30):
            if mode == "events+flush": flush.zero_()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(20 if mode.startswith("back") else 1): fn()
            b.record(); b.synchronize()
            ts.append(a.elapsed_time(b) / (20 if mode.startswith("back") else 1))
        ms = statistics.median(ts)
        cells.append(f"{name} {ms*1e3:.1f} us {nbytes / ms / 1e9:.3f} TB/s")
    print(f"Lk {L}", mode, "|", " | ".join(cells), flush=True)
