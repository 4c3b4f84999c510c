"""Sweep the KV split count of split_kv decode on the GPU (tuning data for attngen/plan/schedule.py).

    python3 benchmarks/tools/sweep_splits.py

B=8, Lq=1, 32 query heads over 8 KV heads, d128, f16, Lk 4096 and 32768: the kernels' launches
alone (kernel.prepared), median of triton do_bench, effective K+V TB/s. Prints one line per count.
"""
import torch, attngen
from triton.testing import do_bench
B,HQ,HKV,D=8,32,8,128
for lk in (4096, 32768):
    q=torch.randn((B,1,HQ,D),device="cuda",dtype=torch.float16)
    k=torch.randn((B,lk,HKV,D),device="cuda",dtype=torch.float16); v=torch.randn_like(k)
    nb=2*k.numel()*2
    for s in (1,2,3,4,5,6,8,12):
        kern=attngen.compile(attngen.parse(f"attention s{s} {{ head_dim {D}\n dtype f16\n heads q={HQ} kv={HKV}\n schedule split_kv({s})\n}}")[0],target="cuda")
        f=kern.prepared(q,k,v); ms=do_bench(f,warmup=25,rep=100,return_mode="median")
        print(lk, s, f"{ms:.3f} ms {nb/ms/1e9:.2f} TB/s smem {kern.plan.smem_bytes} threads {kern.plan.threads} tile {kern.plan.summary()}", flush=True)
