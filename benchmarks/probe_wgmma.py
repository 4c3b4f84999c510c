"""Probe of the wgmma descriptor conventions the Hopper family relies on (run on an sm_90 GPU).

One warpgroup computes S = Q K^T (A and B K-major, 128-byte swizzle) and O = P V (P from
registers, V MN-major), for both orders of V's descriptor offsets; prints which match numpy.
"""
import numpy as np
import cupy as cp

M, N, D = 64, 64, 128
src = r'''
typedef unsigned short elem_t;
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
template <int kRows> __device__ __forceinline__ int swizzled(int r, int col) {
    return (col / 64) * (kRows * 64) + r * 64 + ((((col / 8) % 8) ^ (r % 8)) * 8) + col % 8; }
__device__ __forceinline__ unsigned long long desc(const elem_t* p, unsigned lead, unsigned stride) {
    return (unsigned long long)((smem_addr(p) & 0x3ffffu) >> 4) | ((unsigned long long)(lead >> 4) << 16)
         | ((unsigned long long)(stride >> 4) << 32) | (1ull << 62); }
__device__ __forceinline__ unsigned pack2(float lo, float hi) { unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r; }
__device__ void ss(float (&d)[32], unsigned long long a, unsigned long long b, int sc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %32, 0;\n"
    "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
    "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %33, %34, p, 1, 1, 0, 0;\n}\n"
    : "+f"(d[0]),"+f"(d[1]),"+f"(d[2]),"+f"(d[3]),"+f"(d[4]),"+f"(d[5]),"+f"(d[6]),"+f"(d[7]),"+f"(d[8]),"+f"(d[9]),
      "+f"(d[10]),"+f"(d[11]),"+f"(d[12]),"+f"(d[13]),"+f"(d[14]),"+f"(d[15]),"+f"(d[16]),"+f"(d[17]),"+f"(d[18]),"+f"(d[19]),
      "+f"(d[20]),"+f"(d[21]),"+f"(d[22]),"+f"(d[23]),"+f"(d[24]),"+f"(d[25]),"+f"(d[26]),"+f"(d[27]),"+f"(d[28]),"+f"(d[29]),
      "+f"(d[30]),"+f"(d[31]) : "r"(sc), "l"(a), "l"(b)); }
__device__ void rs(float (&d)[64], const unsigned (&a)[4], unsigned long long b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
    "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
    "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,"
    "%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
    : "+f"(d[0]),"+f"(d[1]),"+f"(d[2]),"+f"(d[3]),"+f"(d[4]),"+f"(d[5]),"+f"(d[6]),"+f"(d[7]),"+f"(d[8]),"+f"(d[9]),
      "+f"(d[10]),"+f"(d[11]),"+f"(d[12]),"+f"(d[13]),"+f"(d[14]),"+f"(d[15]),"+f"(d[16]),"+f"(d[17]),"+f"(d[18]),"+f"(d[19]),
      "+f"(d[20]),"+f"(d[21]),"+f"(d[22]),"+f"(d[23]),"+f"(d[24]),"+f"(d[25]),"+f"(d[26]),"+f"(d[27]),"+f"(d[28]),"+f"(d[29]),
      "+f"(d[30]),"+f"(d[31]),"+f"(d[32]),"+f"(d[33]),"+f"(d[34]),"+f"(d[35]),"+f"(d[36]),"+f"(d[37]),"+f"(d[38]),"+f"(d[39]),
      "+f"(d[40]),"+f"(d[41]),"+f"(d[42]),"+f"(d[43]),"+f"(d[44]),"+f"(d[45]),"+f"(d[46]),"+f"(d[47]),"+f"(d[48]),"+f"(d[49]),
      "+f"(d[50]),"+f"(d[51]),"+f"(d[52]),"+f"(d[53]),"+f"(d[54]),"+f"(d[55]),"+f"(d[56]),"+f"(d[57]),"+f"(d[58]),"+f"(d[59]),
      "+f"(d[60]),"+f"(d[61]),"+f"(d[62]),"+f"(d[63]) : "r"(a[0]),"r"(a[1]),"r"(a[2]),"r"(a[3]), "l"(b), "r"(1)); }
extern "C" __global__ void probe(const elem_t* q, const elem_t* k, const elem_t* v, float* s_out, float* o_out,
                                 unsigned lead, unsigned stride) {
    extern __shared__ __align__(1024) unsigned char raw[];
    unsigned char* sm = raw + ((1024u - (smem_addr(raw) & 1023u)) & 1023u);
    elem_t* sQ = (elem_t*)sm; elem_t* sK = sQ + 64 * 128; elem_t* sV = sK + 64 * 128;
    for (int i = threadIdx.x; i < 64 * 128; i += 128) {
        int r = i / 128, c = i % 128;
        sQ[swizzled<64>(r, c)] = q[i]; sK[swizzled<64>(r, c)] = k[i]; sV[swizzled<64>(r, c)] = v[i];
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    float s[32];
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    for (int kk = 0; kk < 8; ++kk) {
        int at = (kk / 4) * 64, st = (kk % 4) * 16;
        ss(s, desc(sQ + at * 64 + st, 16, 1024), desc(sK + at * 64 + st, 16, 1024), kk > 0);
    }
    asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (int n = 0; n < 8; ++n) for (int e = 0; e < 4; ++e)
        s_out[(warp * 16 + g + 8 * (e / 2)) * 64 + n * 8 + 2 * t + e % 2] = s[n * 4 + e];
    float o[64];
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    for (int ks = 0; ks < 4; ++ks) {
        unsigned a[4] = {pack2(s[8*ks+0], s[8*ks+1]), pack2(s[8*ks+2], s[8*ks+3]), pack2(s[8*ks+4], s[8*ks+5]), pack2(s[8*ks+6], s[8*ks+7])};
        rs(o, a, desc(sV + ks * 16 * 64, lead, stride));
    }
    asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    for (int n = 0; n < 16; ++n) for (int e = 0; e < 4; ++e)
        o_out[(warp * 16 + g + 8 * (e / 2)) * 128 + n * 8 + 2 * t + e % 2] = o[n * 4 + e];
}
'''
mod = cp.RawModule(code=src, options=("--std=c++17", "--gpu-architecture=sm_90a"))
fn = mod.get_function("probe")
fn.max_dynamic_shared_size_bytes = 3 * 64 * 128 * 2 + 1024
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((64, 128)).astype(np.float16) * 0.5 for _ in range(3))
s_ref = q.astype(np.float64) @ k.astype(np.float64).T
o_ref = s_ref.astype(np.float16).astype(np.float64) @ v.astype(np.float64)
for lead, stride in ((64 * 128, 1024), (1024, 64 * 128)):
    s_out, o_out = cp.full((64, 64), np.nan, cp.float32), cp.full((64, 128), np.nan, cp.float32)
    fn((1,), (128,), (cp.asarray(q), cp.asarray(k), cp.asarray(v), s_out, o_out, np.uint32(lead), np.uint32(stride)),
       shared_mem=3 * 64 * 128 * 2 + 1024)
    cp.cuda.Device().synchronize()
    es = float(np.abs(s_out.get() - s_ref).max() / np.abs(s_ref).max())
    eo = float(np.abs(o_out.get() - o_ref).max() / np.abs(o_ref).max())
    print(f"probe: S (K-major) rel err {es:.2e}; O (V MN-major, lead {lead} stride {stride}) rel err {eo:.2e}")
