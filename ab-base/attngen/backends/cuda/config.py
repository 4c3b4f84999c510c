"""The CUDA tile configuration: tile sizes, warps, stages and the shared-memory layout.

The backend's configure(): the checker runs it once (a configuration that cannot work is a
Problem, with the bytes it needs and the limit) and the plan is built from what it returns.
Values the spec leaves at `auto` come from the profile's tuned defaults and are shrunk until
they fit; values the spec gives are never changed: if they do not fit, that is an error.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...lang.spec import DTYPE_BYTES, AttentionSpec
from ...plan.kernel_plan import Problem, describe_buffers as _describe, place_buffers as _layout
from ...plan.profiles import Profile
from ...plan.schedule import pack_gqa

CUDA_ROWS_PER_WARP = 16  # rows of one m16n8k16 fragment; a warp owns 1 or 2 of them
CUDA_SPILL_FACTOR = 1.5  # register estimates above this multiple of the cap are refused or shrunk
CUDA_SMEM_SKEW_BYTES = 16  # row padding that keeps ldmatrix / float4 reads free of bank conflicts
# The split schedules' mma.sync kernels (decode) with head dims 64, 128 or 256 keep their K and V
# tiles unpadded, with the 16-byte chunks of row r permuted (chunk c at c ^ (r % 8)): ldmatrix's 8
# rows stay in 8 different bank groups, and every row starts on a 128-byte line, which cp.async
# fills faster than rows that start 16 bytes further on each row (benchmarks/probe_stream.py on the
# H100: 3.05 vs 2.98 TB/s for decode's K/V stream; the decode kernel with 272-byte rows ran 3.7%
# below the same copies in 256-byte rows). _swizzle_kv says where; templates/cuda/copy.j2, kv_at.
CUDA_SWIZZLE_KV = True
CUDA_SPLIT_ROWS = 16  # default rows per block of the split schedules (split_kv, two_pass)
CUDA_SPLIT_KV = 32  # default tile kv of the split schedules (64 spilled registers: benchmarks/NOTES.md)
# ... with head dims in chunks (tile d; MLA decode: 128 query heads over one latent KV head, 576 / 512
# dims), where Q streams through shared memory again with every K/V tile: the GQA group's rows in
# up to 64 rows (4 warps) per block, so that fewer blocks re-read each K/V tile, and 64 keys per
# tile, so that Q streams half as often. H100, examples/deepseek_v3_mla_decode.attn
# (benchmarks/probe_mla_decode.py, 2026-11-27, us at B1 / B8 x Lk 4096 / 32768): q16 kv32 97 / 430 /
# 410 / 3083; q16 kv64 93 / 349 / 314 / 2276; q32 kv64 77 / 212 / 157 / 1012; q64 kv64 72 / 195 / 179 /
# 983; q128 kv64 77 / 206 / 231 / 1065; q64 kv128 94 / 213 / 217 / 1008.
CUDA_SPLIT_CHUNK_KV = 64
CUDA_SPLIT_CHUNK_MAX_ROWS = 64
# split_kv: warps that share a block's rows and divide each K/V tile's keys among them (each warp
# keeps its own m_i, l_i and acc over its keys; they are merged at the end of the block). The
# default row of the split_kv schedule, measured on the H100 (benchmarks/NOTES.md, issue 12).
CUDA_SPLIT_KEY_WARPS = 4
CUDA_MAX_DV_BLOCK = 256  # output columns one block keeps in registers; wider outputs split over blocks
# Candidates for a default `tile d` (head-dim columns per shared-memory step), largest first. The
# tensor-core path needs multiples of 16 (the k of m16n8k16), the CUDA-core path multiples of 8.
CUDA_CHUNKS = {"mma": (64, 32, 16), "fma": (64, 32, 16, 8)}
CUDA_CHUNK_ALIGN = {"mma": 16, "fma": 8}
CUDA_STEP_COST = 16  # a shared-memory step's fixed cost, in head-dim columns of math (an estimate)
# The Hopper family (math "wgmma", sm_90a): a warpgroup of 4 warps owns 64 rows of Q, and the
# shared-memory tiles use the 128-byte swizzle of the wgmma descriptors: rows of whole 64-element
# blocks, each block 1024-byte aligned (the kernel aligns its buffers at run time: 1024 bytes of
# slack in the launch's shared memory).
CUDA_WGMMA_ROWS = 64
CUDA_WGMMA_PAD = 64
CUDA_WGMMA_ALIGN = 1024
# The largest auto tile kv of the Hopper family per kind of mask (and softcap): the plain
# overlapped loop holds S, P and acc at 255 registers with tile kv 128; a window's bounds or a
# custom mask's pointers need a few more (ptxas reports, benchmarks/NOTES.md, issue 11). Custom:
# 80 also with the producer (its _varlen entry spills 16 bytes at 96; the producer entry was
# level at 96: window 1024 as a custom mask 0.385 ms either way, benchmarks/probe_custom.py).
CUDA_WGMMA_KV_CAP = {"window": 112, "custom": 80, "softcap": 96}
# Causal masks up to head dim 128 take their own tiles (tile q, tile kv) by head dim, both with
# the producer warpgroup and persistent blocks. Up to 64: q128 kv128 (H100 f16 causal,
# benchmarks/probe_persistent.py, 2026-11-25 with the bit-mask score loop, TFLOP/s at L 1k / 4k /
# 16k: 250 / 326 / 359 vs 257 / 298 / 318 for the former q64 kv64 without a producer; FA2 214 /
# 278 / 294, Flex 252 / 344 / 367). Above 64 it was q128 kv96 until 2026-11-27 (kv96 was then the
# widest whose masked consumers did not spill at 216 registers; benchmarks/quick_causal.py at
# ac32f17: d128 248 / 366 / 432 vs q64 kv64 245 / 335 / 352 and FA2 237 / 302 / 312).
# (tile q, tile kv, stages or None for the profile's): d128 causal four stages of kv96 (f16 TFLOP/s at
# L 1k / 4k / 16k, benchmarks/probe_persistent.py 2026-11-26: 339 / 478 / 549 vs 339 / 478 / 520 with
# three; d64 level with four, d128 full slower with four of kv64 or kv96). Since 2026-11-27 (fifth
# session) every causal head dim up to 128 takes q128 kv128 with three stages, as FlashAttention-3
# does: its masked consumers no longer spill at 240 registers (NVRTC 13.5 and nvcc 13.0, d80-d128,
# f16 / bf16, GQA) and the 42% fewer tiles than kv96 cost less per-tile work (Nsight Compute:
# benchmarks/NOTES.md); ab.sh A/B, H100 f16, TFLOP/s at L 1k / 4k / 16k: d128 336-344 / 476-478 /
# 530-540 -> 358-373 / 505-527 / 542-572, d96 282-283 / 383-384 / 397-433 -> 302-304 / 406-441 /
# 437-457; llama3 L4096 497 -> 530, qwen2 519 -> 545, phi35 367 -> 386 (cuDNN 499-508 / 376-379).
CUDA_WGMMA_CAUSAL_TILES = ((128, (128, 128, None)),)
# Head dims above 128 (up to 256) without a window, custom mask or softcap: tile q 128 with the
# producer, persistent blocks and the tensor copy engine (Q too: the producer no longer holds copy
# addresses, so neither it nor the consumers spill), tile kv by head dim. H100 f16,
# benchmarks/probe_persistent.py / probe_models.py, 2026-11-26, TFLOP/s at L 1k / 4k: d256 causal
# kv80 299 / 396 (kv64 289 / 374) vs the plain loop's q128 kv64 254 / 358 (FA2 246 / 283); d256
# full kv80 411 / 435 vs 385 / 443; MLA 192/128 bf16 causal L4096 kv96 310 vs 274 (cuDNN 461).
# Up to d192 three stages of kv 80 where they fit (else two of kv 96): MLA 192/128 bf16 causal
# L4096 475 TFLOP/s vs 351 for two stages of kv 96 (kv64 x 3 464, kv48 x 3 403, kv64 x 4 453;
# cuDNN 456; benchmarks/probe_models.py, 2026-11-26): the third stage hides more of each tile's copy.
# Up to d256 likewise three stages of kv 48 (else two of kv 80): f16 d256 TFLOP/s at L 1k / 4k / 16k
# (benchmarks/probe_persistent.py, same run) causal 347 / 469 / 477 vs 325 / 437 / 480, full 446 /
# 492 / 552 vs 433 / 479 / 488.
# Above 256, up to CUDA_WGMMA_MAX_D (causal, or mask none where P through memory (CUDA_STORED_P) is
# refused; no softcap): the same producer kernel
# with output column blocks. Q of the block's 128 rows stays in shared memory whole (128 KB at
# d512) and the block keeps at most CUDA_MAX_DV_BLOCK output columns of acc: the output is split
# over blocks (grid.y = Hq x v_blocks), each computing Q K^T for its own columns of P V (FFPA's
# split of the output, on wgmma). Tile kv and stages: three stages where they fit beside Q (d320
# kv48: 332 TFLOP/s vs 302 for two of kv64; d384 kv32: 307 vs 262; causal 295 vs 254, 267 vs 234;
# B1 H48 L4096, benchmarks/probe_head_dims.py, 2026-11-26). Persistent blocks, items of (row tile,
# head, column block): d320 340 vs 331 without, d384 317 vs 309, d512 level (246 / 247); their
# cleaning pass is what keeps a p = 0 key's non-finite V out of full tiles. Launches with
# per-sequence lengths take the mma.sync chunked path (_varlen).
# Above 512 Q no longer fits whole: the mma.sync family streams the head dims in chunks.
# (head dim bound, ((tile kv, stages), ...)): the first that fits the shared memory
CUDA_PRODUCER_WIDE_D_KV = ((192, ((80, 3), (96, 2))), (256, ((48, 3), (80, 2))), (320, ((48, 3), (64, 2))),
                           (384, ((32, 3), (48, 2))), (512, ((32, 2),)))
CUDA_WGMMA_MAX_D = 512
# Above CUDA_WGMMA_MAX_D (mask none, no softcap): P through memory (CudaConfig.stored_p). Neither
# Q of 64 rows beside a K/V ring nor the output of 64 rows (256 KB of f32 at d1024: the whole
# register file) fits one block any more, and output column blocks would compute Q K^T once per
# block (the mma.sync chunks: 4x at d1024, 75 TFLOP/s). So each persistent block takes a row tile
# of 128 rows in two phases (templates/cuda/stored_p.j2): A, S = Q K^T tile by tile (Q and K in
# 64-column chunks by the tensor copy engine) with the online softmax, each tile's P stored to the
# block's slot of a workspace (f16/bf16, in the accumulator layout: a thread stores and later reads
# back only its own fragments) with the running max after the tile; B, per 256 output columns,
# acc += (c_j P_j) V_j with P_j read back as wgmma's A operand and c_j = exp2(m_j - m_final).
# Q K^T once, P V once, whatever the head dim: H200 f16 d1024 B1 H48 L4096 548 TFLOP/s vs 134 for
# SDPA memory-efficient (benchmarks/probe_stored_p.py, 2026-11-26). (tile q, phase A keys, tile kv,
# output columns per pass, stages)
CUDA_STORED_P = (128, 256, 64, 256, 4)
# ... and above this head dim already (mask none, no softcap, auto tiles), where it beats Q whole in
# shared memory with output column blocks or split Q K^T (B1 H48 L4096 f16, H200, same run,
# benchmarks/probe_head_dims.py 2026-11-26: d320 365 vs 331 TFLOP/s, d384 420 vs 305, d512 501 vs
# 242, d768 508; SDPA mem-eff 134-143). The cost is its workspace: 264 bytes per key per block
# (min(SM, items) blocks), 143 MB at Lk 4096 on 132 multiprocessors, 1.1 GB at Lk 32768.
CUDA_STORED_P_ABOVE = 256
# Split Q K^T (head dims of 512, and qk head dims of whole 128-column halves beside a v head dim of
# 512): the block's two consumer warpgroups own the same 64 rows; each computes Q K^T over half of
# the head dim and P V for half of the block's output columns (up to 256 each: one block holds 512),
# and the halves of S are summed through shared memory (sX) once per tile. Each Q K^T column is
# computed once, where column blocks compute it once per block; but a block reads its K and V
# tiles for 64 rows, not 128. Tile kv by what fits (d512: 32). H100 f16 B1 H48 L4096 TFLOP/s
# (benchmarks/probe_head_dims.py, 2026-11-26): d512 233 vs 218 for column blocks (causal 216 vs
# 192); d384 205 vs 262 (kv 32 vs 48): d384 keeps column blocks.
CUDA_WGMMA_SPLIT_QK = True
CUDA_WGMMA_SPLIT_QK_MIN_D = 512
# (tile kv, stages) of split Q K^T: the first that fits. Deeper rings beat wider tiles here too: d512
# 248 TFLOP/s with four stages of kv 16, 241 with three, 235 with two of kv 32 (SDPA mem-eff 120;
# column blocks with three stages of kv 16: 200; benchmarks/probe_head_dims.py, 2026-11-26).
CUDA_WGMMA_SPLIT_TILES = ((16, 4), (64, 2), (48, 2), (32, 2), (16, 2))
# Head dims up to 64 without a mask or softcap take three consumer warpgroups (tile q 192, the
# producer with the tensor copy engine, 32 / 160 registers; FlashAttention-3's d64 rows): H100
# f16, benchmarks/probe_persistent.py, 2026-11-25, TFLOP/s at L 1k / 4k / 16k: q192 kv128 347 /
# 401 / 404 vs q128 kv128 350 / 382 / 390 (FA2 285 / 296 / 304); kv96 330 / 375 / 401, kv64 302 /
# 316 / 363; kv144 and wider spill at 160 registers. Causal tiles of q192 were slower (kv64 212 /
# 287 / 320 vs q128 kv128 265 / 338 / 361) and spill from kv96.
CUDA_WGMMA_WIDE_TILE = (64, (192, 128))
# Up to this head dim the profile's tile q 128 pays only with the producer warpgroup (and its
# persistent blocks); auto tiles that get no producer (softcap, producer=off) keep
# tile q 64 (H100 f16, benchmarks/probe_persistent.py: d64 full 352 / 395 TFLOP/s at L1k / 16k
# with it vs 317 / 355 for q64; d64 softcap 30 at q128 without it 149 / 182 vs 173 / 192 for q64).
CUDA_WGMMA_Q128_WITH_PRODUCER_ONLY = 64
# The widest tile kv at which the producer's masked consumers stay free of spills (ptxas -v, 216
# registers): auto puts a producer in window blocks only up to it (and window tiles of q 128
# take it as their auto tile kv); causal blocks take it up to their CUDA_WGMMA_CAUSAL_TILES kv.
CUDA_PRODUCER_MASKED_KV = 96
# Head dims above 128 (up to 256) with a window or custom mask or softcap: auto puts a producer
# (with persistent blocks and the tensor copy engine) in their tile q 128 blocks up to this tile kv
# (their auto tile: kv 64, two stages, CUDA_WGMMA_KV_CAP), where they had the plain loop until
# 2026-11-27 (third session). No spills (ptxas 13.0 and 13.5, d160-d256, bf16 / f16, softcap 50
# with a window or causal, custom d192). H100 f16, benchmarks/probe_persistent.py, TFLOP/s at
# L 1k / 4k, plain loop -> producer: window 1024 d192 238 / 272 -> 286 / 361, d256 253 / 288 ->
# 296 / 357; d256 softcap 30 full 292 / 334 -> 315 / 350, causal 210 / 284 -> 257 / 326.
CUDA_PRODUCER_WIDE_MASKED_KV = 64
# ... and their auto tile: the first (tile kv, stages) that fits the shared memory. Three stages of
# kv 64 fit up to d192 (H100 f16, probe_persistent.py, 2026-11-27, third session, TFLOP/s at L 1k /
# 4k, two stages -> three): window 1024 d192 286 / 360 -> 348 / 397; softcap 30 d192 full 283 /
# 300 -> 338 / 366, causal 222 / 276 -> 263 / 335.
CUDA_PRODUCER_WIDE_MASKED_TILES = ((64, 3), (64, 2))
# Launches with per-sequence lengths (cu_seqlens, kv_lens, an append: the _varlen entry point) of
# producer kernels up to this head dim run the producer kernel too: the main entry's tiles,
# persistent blocks (work items over the launch's longest sequence; an item past its sequence's
# rows, or of a sequence whose integers fail the device check, reads and writes nothing), Q, K and
# V by cp.async. Above it the cp.async producer spills (d192 64 bytes, d256 140), and the entry
# keeps the overlapped loop without a producer (tile kv 32).
CUDA_VARLEN_PRODUCER_MAX_D = 128
# Its tile kv at most (CUDA_VARLEN_PRODUCER_KV_OTHER for other head dims: d112 spilled 60 bytes at
# kv 96, qk 128 / v 64 12; none at 64).
CUDA_VARLEN_PRODUCER_KV = 96
CUDA_VARLEN_PRODUCER_KV_DIMS = (32, 48, 64, 80, 96, 128)
CUDA_VARLEN_PRODUCER_KV_OTHER = 64
CUDA_VARLEN_PRODUCER_KV_NARROW = 128  # head dims up to 64: the main entry's tile kv 128 (no spills)
# ... its producer's registers after setmaxnreg (the consumers get 196): the per-sequence state of
# the copies (key rows in the cache or k_new, packed offsets) spilled 90-150 bytes at 72 and 4-60
# at 104 (ptxas 13.0 and 13.5, d96 / d128); none at 112 with tile kv at most 96.
CUDA_VARLEN_PRODUCER_REGS = 112
# Softcap up to head dim 128: auto puts the producer (persistent, tensor copy engine) in its tile
# q 128 blocks too, as in unmasked ones (their auto tiles: d128 q128 kv96, d64 q128 kv96 / causal
# kv128; no spills, ptxas 13.0 and 13.5). Before persistent blocks it was level ("292 either way",
# d128 causal); now H100 f16 softcap 30, TFLOP/s at L 1k / 4k (benchmarks/probe_persistent.py,
# 2026-11-27, third session), overlapped loop without it -> with it: d128 full 230 / 259 -> 296 /
# 312, causal 181 / 242 -> 225 / 293; d64 full 168 / 188 -> 172 / 187 (q64 -> q128), causal 141 /
# 162 -> 157 / 190.
CUDA_PRODUCER_SOFTCAP = True
# Warp specialisation of the Hopper family (`target cuda { producer=on }`, FlashAttention-3
# section 3.1): one more warpgroup that only copies (Q once, then the K/V ring, signalling each
# tile on an mbarrier), so the consumer warpgroups never meet at a block-wide barrier; with two
# consumer warpgroups `setmaxnreg` moves registers from the copier to them and the two take
# turns on the tensor cores (ping-pong). Registers per thread after the reallocation:
CUDA_PRODUCER_THREADS = 128
# The launch gives each of the 384 threads the compiled count, capped at 65536 / 384 = 168, and
# setmaxnreg only moves registers inside that: 128 P + 256 C <= 384 x 168 = 64512, or the
# consumers' setmaxnreg.inc waits forever (it hung on the H100 with 48 / 232). FlashAttention-3's
# TMA producer keeps 24 (C = 240); this one computes cp.async addresses and spilled below 72
# (ptxas -v, d128 and d256 mask none: 0 bytes at 72 / 216; benchmarks/NOTES.md). With one
# consumer warpgroup (256 threads, up to 255 registers each) no registers are moved.
CUDA_PRODUCER_REGS = 72
CUDA_CONSUMER_REGS = 216
assert CUDA_PRODUCER_THREADS * CUDA_PRODUCER_REGS + 256 * CUDA_CONSUMER_REGS <= 384 * (65536 // 384 // 8 * 8)
# Tiles by the tensor copy engine (`target cuda { tma=auto|on|off }`, FlashAttention-3 section 3.1):
# the producer's first thread issues one cp.async.bulk.tensor per 64-column block of a K or V tile
# from a tensor map built on the host (attngen/backends/cuda/tensor_maps.py), completing on the
# stage's mbarrier; Q comes the same way (CudaConfig.tma_q: one box of the block's rows), so the
# producer keeps few registers and the consumers more. auto = on for every producer kernel's main
# entry point (its _varlen entry keeps cp.async: packed and appended rows are not one dense tensor
# per batch). The producer's registers then depend on its other work (ptxas -v, sm_90a, no spill at
# these; one step lower spills): copies only 24 (the consumers get FlashAttention-3's 240); the
# cleaning of hidden keys' values in partial tiles (causal, window) 32 (24 spills 38 bytes in
# persistent blocks of two consumer warpgroups); a custom mask's list and words 40 (32: 38 bytes
# with three). With Q by cp.async these were 40 and 56: Q's copy loop kept its addresses.
# Persistent blocks' producer takes CUDA_TMA_CLEANING_REGS at least, for the cleaning pass.
CUDA_TMA_REGS = {"none": 24, "causal": 32, "window": 32, "custom": 40}
CUDA_TMA_KV_ONLY_REGS = {"none": 24, "causal": 40, "window": 40, "custom": 56}  # Q by cp.async (no tma_q)
# Every kernel cleans V's non-finite values where a row must not take them in (templates/cuda/
# nonfinite.j2): keys a row does not see (a mask's partial tiles) and keys it sees with weight 0
# (a score of -inf, or one that exp2 underflows: about 87 below the row's maximum in f32), whose
# 0 * inf would be NaN. Finite inputs pay only a check of acc per block or work item; a block
# whose acc ends non-finite runs its tiles again, cleaning every tile (the second pass). False
# drops all of it (wrong for such inputs: benchmarks/probe_persistent.py --rewrite noclean times
# what it costs).
CUDA_CLEAN_VALUES = True
# The plain loop (mma.sync, CUDA cores: cuda-sm80, split_kv, two_pass, head dims in chunks, the
# _varlen entry of head dims above 256; and wgmma without a producer or the overlapped loop, e.g.
# d256 with softcap) has no second pass: every form of one spilled (benchmarks/
# NOTES.md, 2026-11-26, sixth session). It cleans V in its one pass instead, after the softmax,
# in every tile where some real row gives a key a weight of exactly 0 (only there can 0 * inf
# arise in P V): warps over keys each decide and scan their own keys' rows, other kernels decide
# as a block. Measured (benchmarks/probe_plain_clean.py, H100): split_kv decode level, two_pass
# +3%, cuda-sm80 d128 prefill +2-5%, f32 d64 0-2%. False: partial tiles only (a key of weight 0
# in a full tile then gives NaN with inf or NaN in its V); a probe's switch, read at emit time
# (give such a kernel a spec name of its own: the plan, not the source, keys the disk cache).
CUDA_CLEAN_EVERY_TILE = True
# The producer of persistent blocks re-inserts an item whose result was not finite and copies its
# tiles again, cleaning V (mask none too since 2026-11-26): at 24 registers that spilled 14 bytes
# (d128) and 6 (d256) in the producer's loop; so 32, and the consumers of mask none get 232
# (FlashAttention-3's 240 before). Measured against 24 (probe_persistent.py, H100): level; the
# cleaning pass's cost was the consumers' code, now two copies of their loop (benchmarks/NOTES.md,
# 2026-11-26, sixth session).
CUDA_TMA_CLEANING_REGS = 32
# Three consumer warpgroups (tile q 192, FlashAttention-3's d64 tiles): 512 threads, 128
# registers each at the launch; the consumers get what the producer gives up (d64 mask none:
# 160, FlashAttention-3's figure).
CUDA_MAX_CONSUMER_GROUPS = 3
# Persistent blocks (`target cuda { persistent=auto|on|off }`, FlashAttention-3's tile scheduler):
# a producer kernel's grid is one block per multiprocessor (grid symbol SM), and each block takes
# work items (row tile, head, batch; causal: the longest row tiles of a head first) until none is
# left: its first item is blockIdx.x, the next ones come from a counter in memory (atomicInc,
# which wraps the counter back to zero at the launch's last fetch). The producer copies the next
# item's Q as soon as the consumers' last Q K^T is done and its K/V tiles into the same ring, so
# the consumers go from one item to the next without the launch of a new block, the wait for its
# Q and first tiles, or an idle multiprocessor at the end of each block. auto = on for every
# producer kernel; their packed launches take the _varlen entry point (custom masks too: it keeps
# their tiles). off: the same work-item code on a grid of one block per item
# (CudaConfig.item_per_block), so that an item whose result is not finite is still done again,
# cleaned. Since 2026-11-27 (third session) this includes the producer kernels that had kept one
# block per row tile without that pass: cp.async copies (tma=off) and, with producer=on given, the
# window, custom and softcap kernels above head dim 128. The work-item code does not spill there
# (ptxas 13.0 and 13.5; d48-d112 tma=off: 0 bytes where the older loop spilled 144 at d96, 64 at
# d80), except d192 / d256 with tma=off (64 / 140 bytes; the older loop 152 / 0). Measured
# (benchmarks/probe_persistent.py, H100 f16, TFLOP/s at L 1k / 4k / 16k, older loop -> work items):
# d96 tma=off full 299 / 379 / 409 -> 364 / 401 / 423, causal 172 / 304 / 368 -> 254 / 341 / 375;
# d80 tma=off full 248 / 324 / 352 -> 315 / 355 / 362, causal 136 / 261 / 320 -> 217 / 299 / 323;
# d192 producer=on tma=off (L 1k / 4k) full 285 / 321 -> 317 / 367, causal 208 / 303 -> 257 / 347;
# d256 producer=on tma=off full 373 / 433 -> 367 / 398 (the spills), causal 229 / 338 -> 290 / 400.
# mask custom with the producer: a partial tile's words of a boolean mask (the 256 keys of the
# two 128-key chunks a tile of up to 128 keys touches) are copied with its K and V into shared
# memory, so the consumers read their bits there instead of waiting for global loads in the
# softmax (H100, benchmarks/probe_custom.py). Rows of 12 words: 16-byte copies, and the 8 rows a
# warp's lanes read fall in different banks.
CUDA_MASK_STAGE_WORDS = 12
# The output through shared memory with a tensor store (FlashAttention-3's epilogue; CudaConfig.tma_store):
# each consumer warpgroup writes its 64 rows of the normalised output into a staging buffer sO (64-column
# blocks, not swizzled: the swizzle's addresses spilled registers in the three-warpgroup d64 kernel),
# and one of its threads stores them with cp.async.bulk.tensor (a tensor
# map over out, boxes of 64 columns x 64 rows; rows past Lq are clipped by the engine) while the
# warpgroup goes on to its next item. Producer kernels whose Q comes by the tensor copy engine (the
# main entry point: padded launches), with the whole head dim v in one block, where sO fits beside
# the ring, for head dims v above CUDA_TMA_STORE_ABOVE: auto tiles leave room in d128's custom and
# window kernels (kv 80 / 96; the d128 full and causal rings and those above d128 take the shared
# memory, 224 KB, and their output is stored from registers). H100, benchmarks/run_gpu.py at 05ae039
# against b0ce5f5 (stores from registers), ms at L16384 d128 H16: window 1024 as a custom mask 0.357 vs
# 0.370, analytic window 0.336 vs 0.354, document-causal 0.442 vs 0.464. Head dim 64 (q192 kv128 and
# q128 kv128 have room) keeps the stores from registers: its dense rows came out 2-5% slower with the
# tensor store in the same comparison (f16 d64 L1024 causal 277 vs 285 TFLOP/s, L4096 full 460 vs 477,
# L16384 full 483 vs 508; the d128 / d256 rows, unchanged, within +-3%), though a B1 H32 A/B in one
# process had it level (probe_head_dims.py: full L4096 451 / 455 vs 452 / 451, causal L1024 186 / 181
# vs 181 / 180): its items are short, and the store's copies share the multiprocessor's copy engine
# with the next item's loads.
CUDA_TMA_STORE = True
CUDA_TMA_STORE_ABOVE = 64
CUDA_PERSISTENT_BLOCKS = "SM"  # blocks of a persistent grid (at most the work items: lower.grid)
# Causal work items of persistent blocks go longest first within groups of (batch, head) pairs whose
# K and V take at most this many bytes together (templates/cuda/body.j2, section work items): long
# items first for the balance, few heads at once for L2 (the H100 has 50 MB).
CUDA_CAUSAL_ORDER_BYTES = 16 << 20
# The online softmax's lazy rescale (as FlashAttention-4 does): a row keeps its max m_i until a tile's
# max passes it by more than this (log2 domain), so P <= 2^8 and most tiles skip acc's rescale (one
# multiply per accumulator of the row, on the path between a tile's P V and the next: measured in
# benchmarks/NOTES.md, 2026-11-27, fourth session: d256 +2-10%, d128 causal +1-4%, d64 causal -1 to
# -7%, so only from CUDA_RESCALE_SLACK_MIN_DV output columns, where acc is large). Not with f16
# accumulators (their sums and the score bound assume P <= 1) nor two_pass (pass 2 recomputes P
# from pass 1's merged max).
CUDA_RESCALE_SLACK = 8.0
CUDA_RESCALE_SLACK_MIN_DV = 128


@dataclass(frozen=True)
class CudaConfig:
    math: str  # "wgmma" (Hopper warpgroup tensor cores), "mma" (tensor cores, f16/bf16) or "fma" (CUDA cores, f32)
    tile_q: int
    tile_kv: int
    warps: int  # per block: (tile_q / 16 / frags) row warps x key_warps
    stages: int
    d_qk: int
    d_v: int
    d_qk_pad: int  # head dims padded for the math (mma: multiple of 16)
    d_v_pad: int
    q_in_registers: bool
    buffers: tuple
    smem_bytes: int
    registers_estimate: int
    registers_cap: int
    # tile d: head-dim columns per shared-memory step, or None when the whole head dims sit in
    # shared memory at once. With a chunk, Q, K and V stream through shared memory chunk by chunk.
    chunk: int | None = None
    chunk_given: bool = False  # from the spec's `tile d=` (else chosen: the whole head dim did not fit)
    v_blocks: int = 1  # blocks per (batch, query head) along the output columns: grid.y = Hq * v_blocks
    d_v_block: int = 0  # output columns per block: a whole number of chunks (chunked), or d_v_pad (wgmma)
    # The plain kernel (fused, contiguous cache, structured mask, whole head dims) has a padded-only
    # path for launches without per-sequence lengths (no cu_seqlens, kv_lens or append): it keeps
    # the registers of the plain algorithm. Launches with them take `varlen`: the same tiles with
    # one 16-row fragment per warp (a block of warps x 16 rows), a separate entry point, so that
    # the extra per-sequence state does not spill registers; None: one entry point serves both.
    fast_path: bool = False
    varlen: "CudaConfig | None" = None
    # Why a profile that has the Hopper family (wgmma) does not use it for this spec ('' when it
    # does, or when the profile has none): `attngen check` shows it, never a silent fallback.
    family_note: str = ""
    # split_kv: warps over keys (CUDA_SPLIT_KEY_WARPS): every tile of tile_kv keys is divided
    # among key_warps warps that own the same rows; 1 everywhere else.
    key_warps: int = 1
    # Blocks one multiprocessor holds at once by shared memory (the profile's per-block limit
    # stands for the multiprocessor's): split_kv(auto) plans one wave of them.
    resident_blocks: int = 1
    # Hopper family: a producer warpgroup copies the tiles (warp specialisation, see
    # CUDA_PRODUCER_THREADS); `warps` counts the consumer warps only.
    producer: bool = False
    # Persistent blocks (every producer kernel): one block per multiprocessor takes work items
    # (row tile, head, batch) one after the other, so that its producer copies the next item's Q
    # and first K/V tiles while its consumers finish the current one (CUDA_PERSISTENT_BLOCKS).
    persistent: bool = False
    # ... with a grid of one block per work item (`persistent=off`): each block does its one row
    # tile, and again, cleaned, if its result is not finite.
    item_per_block: bool = False
    # Producer kernels: the K and V tiles come by the tensor copy engine (CUDA_TMA_REGS).
    tma: bool = False
    # ... and Q too: one box of tile q rows of one query head (not where a block's rows span a
    # GQA group's heads, pack_gqa, nor with head dims in chunks).
    tma_q: bool = False
    # Split Q K^T (CUDA_WGMMA_SPLIT_QK): the two consumer warpgroups own the same tile q rows, each
    # with half of Q K^T's head dim and d_v_pad (= d_v_block / 2) of the block's output columns.
    split_qk: bool = False
    # mma.sync: the K and V tiles in 128-byte rows with permuted 16-byte chunks (CUDA_SWIZZLE_KV).
    swizzle_kv: bool = False
    # Head dims above CUDA_WGMMA_MAX_D on the Hopper family: P through memory, two phases per row
    # tile (CUDA_STORED_P); d_v_block is then the output columns of one pass of phase B.
    stored_p: bool = False
    # The output through shared memory with a tensor store (CUDA_TMA_STORE): a buffer sO and a
    # tensor map over out (tmap_o).
    tma_store: bool = False
    # The producer's registers after setmaxnreg where not producer_registers' rule (0): the _varlen
    # entry's producer, CUDA_VARLEN_PRODUCER_REGS.
    producer_regs: int = 0

    def __post_init__(self):
        # Every producer kernel runs the work-item code (templates/cuda/body.j2 has no other producer
        # loop since 2026-11-27, third session): its redo is the cleaning pass of a key of weight 0.
        if self.producer and not self.persistent:
            raise AssertionError("a producer kernel without the work-item code (CudaConfig.persistent)")

    @property
    def chunked(self) -> bool:
        return self.chunk is not None

    @property
    def chunk_summary(self) -> str:
        """How the head dims are tiled, in words (attngen check, source headers); '' unchunked."""
        if not self.chunked:
            return ""
        why = "from the spec" if self.chunk_given else "chosen: the whole head dim does not fit"
        text = f"tile d={self.chunk} ({why}): Q, K and V stream through shared memory {self.chunk} columns at a time"
        if self.v_blocks > 1:
            text += f"; out split over {self.v_blocks} blocks of {self.d_v_block} columns (grid.y = Hq x {self.v_blocks})"
        return text

    @property
    def overlap(self) -> bool:
        """The Hopper family's main loop that runs the softmax of a tile while the tensor cores do
        the previous tile's P V (it needs a third K/V stage, or the producer warpgroup's ring of
        two: docs/cuda-variants.md)."""
        return self.math == "wgmma" and (self.stages >= 3 or self.producer)

    @property
    def threads(self) -> int:
        return self.warps * 32 + (CUDA_PRODUCER_THREADS if self.producer else 0)

    @property
    def frags(self) -> int:
        """16-row fragments of Q per warp (1 or 2)."""
        return self.tile_q // (self.warps // self.key_warps // (2 if self.split_qk else 1) * CUDA_ROWS_PER_WARP)

    @property
    def smem_summary(self) -> str:
        text = _describe(self.buffers)
        if self.math == "wgmma":
            text += f" + {CUDA_WGMMA_ALIGN} bytes to align them to {CUDA_WGMMA_ALIGN}"
        if not self.chunked and self.v_blocks > 1:
            return (f"{text}; out split over {self.v_blocks} blocks of {self.d_v_block} columns (grid.y = Hq x "
                    f"{self.v_blocks}), each with Q K^T over the whole head dim")
        if self.split_qk:
            return f"{text}; sX: the two warpgroups' halves of S, summed once per tile"
        return f"{text}; {self.chunk_summary}" if self.chunked else text

    def summary(self) -> str:
        """One line a person reads in `attngen check` and in source headers."""
        if self.stored_p:
            _, keys_a, _, _, _ = CUDA_STORED_P
            return (f"tile q={self.tile_q} kv={self.tile_kv}, {self.warps} consumer warps + a producer warpgroup "
                    f"({self.threads} threads), {self.stages} stage(s), Hopper tensor cores (wgmma m64n{keys_a}k16 and "
                    f"m64n{self.d_v_block}k16, 2 warpgroups of 64 rows, sm_90a); P through memory: phase A computes "
                    f"S = Q K^T in tiles of {keys_a} keys (Q and K in 64-column chunks by the tensor copy engine) and "
                    f"stores P to the block's workspace slot, phase B reads it back for P V, {self.d_v_block} output "
                    "columns at a time; persistent: one block per multiprocessor takes the row tiles in turn")
        math = {"wgmma": f"Hopper tensor cores (wgmma m64n{self.tile_kv}k16 and m64n{self.d_v_pad}k16, "
                         + (f"2 warpgroups over the same 64 rows, each with half of Q K^T's head dim (S summed "
                            f"through shared memory) and {self.d_v_pad} output columns, sm_90a" if self.split_qk else
                            f"{self.warps // 4} warpgroup{'s' if self.warps > 4 else ''} of 64 rows, sm_90a")
                         + ("; softmax overlapped with P V" if self.overlap else "")
                         + ("; a producer warpgroup copies the tiles ("
                            + (("Q, K and V" if self.tma_q else "K and V") + " by the tensor copy engine, "
                               if self.tma else "") + "mbarriers, setmaxnreg"
                            + (", ping-pong" if self.warps >= 8 and not self.split_qk else "") + ")"
                            if self.producer else "") + ")",
                "mma": "tensor cores (mma.sync m16n8k16)", "fma": "CUDA cores (fma)"}[self.math]
        who = f"{self.warps} warps ({self.threads} threads), {self.stages} K/V stage(s), {math}"
        if self.producer:
            who = (f"{self.warps} consumer warps + a producer warpgroup ({self.threads} threads), {self.stages} K/V "
                   f"stage(s), {math}")
            if self.item_per_block:
                who += ("; one block per row tile (persistent=off), by the work-item code: a row tile whose result is "
                        "not finite is done again, cleaned")
            elif self.persistent:
                who += "; persistent: one block per multiprocessor takes the row tiles in turn"
        if self.key_warps > 1:
            who = (f"{self.warps} warps ({self.threads} threads; {self.key_warps} warps over the keys of each "
                   f"tile, {self.tile_kv // self.key_warps} keys each, merged at the end), {self.stages} K/V "
                   f"stage(s), {math}")
        return f"tile q={self.tile_q} kv={self.tile_kv}, {who}"

    @property
    def varlen_summary(self) -> str:
        """Which entry point a launch with per-sequence lengths takes, in words ('' when none)."""
        if self.varlen is None:
            return ""
        v = self.varlen
        if v.math != self.math:
            return (f"launches with cu_seqlens, kv_lens or an append: entry point _varlen on the mma.sync family, "
                    f"tile q={v.tile_q} kv={v.tile_kv}" + (f", {v.chunk_summary}" if v.chunked else "")
                    + f" ({v.smem_bytes} bytes of shared memory)")
        if v.math == "wgmma":
            return (f"launches with cu_seqlens, kv_lens or an append: entry point _varlen, tile q={v.tile_q} "
                    f"kv={v.tile_kv} ({v.smem_bytes} bytes of shared memory)")
        return (f"launches with cu_seqlens, kv_lens or an append: entry point _varlen, tile q={v.tile_q} "
                f"({v.frags} fragment per warp, {v.smem_bytes} bytes of shared memory)")


def cuda_math(spec: AttentionSpec, profile: Profile | None = None) -> str:
    if spec.dtype == "f32":
        return "fma"
    return "wgmma" if profile is not None and wgmma_refusal(spec, profile) is None else "mma"


def wgmma_refusal(spec: AttentionSpec, profile: Profile) -> str | None:
    """Why the Hopper family (wgmma) does not serve this spec on this profile; None when it does.
    ('' when the profile has no such family: nothing to explain.) What it leaves to the mma.sync
    family is listed in docs/cuda-variants.md."""
    if not profile.features.get("wgmma"):
        return ""
    if spec.dtype == "f32":
        return "f32 storage runs on CUDA cores"
    if "f16" in (spec.acc_qk, spec.acc_pv):
        return "accumulate f16: the wgmma family accumulates in f32"
    if spec.schedule.is_split:
        return f"schedule {spec.schedule.kind}: the split decode schedules stay on mma.sync"
    if spec.kv_cache.is_paged:
        return "a paged KV cache: gathered pages stay on mma.sync"
    dmax = max(spec.head_dim_qk, spec.head_dim_v)
    if spec.tile.d is not None:
        return "tile d: head dims in chunks stream on mma.sync"
    if dmax > CUDA_WGMMA_MAX_D:
        why = _stored_p_refusal(spec)
        if why is not None:
            return (f"head dims above {CUDA_WGMMA_MAX_D} take the wgmma family only with P through memory, for mask "
                    f"none without softcap and with the planner's own tiles ({why}): they stream in chunks on "
                    "mma.sync")
        return None
    if dmax > 256:
        opts = spec.options("cuda")
        why = ("a window or custom mask" if spec.mask.kind not in ("none", "causal") else
               "softcap" if spec.softcap is not None else
               "producer=off" if opts.get("producer") == "off" else
               "tma=off" if opts.get("tma") == "off" else
               f"tile q={spec.tile.q}" if spec.tile.q not in (None, 2 * CUDA_WGMMA_ROWS) else
               f"warps={opts.get('warps')}" if opts.get("warps") not in (None, 8) else None)
        if why is not None:
            return (f"head dims above 256 on the wgmma family take the producer warpgroup with the tensor copy "
                    f"engine and tile q 128, for mask none or causal without softcap ({why}): they stream in "
                    "chunks on mma.sync")
    q, warps = spec.tile.q, spec.options("cuda").get("warps")
    if q is not None and q % CUDA_WGMMA_ROWS:
        return f"tile q={q} is not a multiple of {CUDA_WGMMA_ROWS} (a warpgroup owns 64 rows)"
    if warps is not None and (warps % 4 or (q is not None and q != warps * CUDA_ROWS_PER_WARP)):
        return f"warps={warps}: the wgmma family has whole warpgroups of 4 warps, 16 rows each"
    return None


def _stored_p_refusal(spec: AttentionSpec) -> str | None:
    """Why a head dim above CUDA_STORED_P_ABOVE cannot take P through memory (CUDA_STORED_P); None
    when it can (above CUDA_WGMMA_MAX_D the mma.sync chunks serve what it cannot; below, the producer
    kernel with Q whole in shared memory). (f32, f16 accumulators, split schedules and paged caches are refused before.)"""
    opts = spec.options("cuda")
    given = [f"tile {k}={v}" for k, v in (("q", spec.tile.q), ("kv", spec.tile.kv)) if v is not None]
    given += [f"{k}={opts[k]}" for k in ("warps", "stages") if opts.get(k) is not None]
    given += [f"{k}=off" for k in ("producer", "tma", "persistent") if opts.get(k) == "off"]
    if spec.mask.kind != "none":
        return f"mask {spec.mask.kind}"
    if spec.softcap is not None:
        return "softcap"
    if given:
        return ", ".join(given)
    return None


def _stored_p_config(spec: AttentionSpec, profile: Profile) -> CudaConfig:
    """The configuration of P through memory (CUDA_STORED_P): the stages that fit the profile's
    shared memory, and the mma.sync chunks for launches with per-sequence lengths (_varlen)."""
    tile_q, keys_a, tile_kv, cols, stages = CUDA_STORED_P
    d_qk_pad = _round_up(spec.head_dim_qk, CUDA_WGMMA_PAD)
    d_v_pad = _round_up(spec.head_dim_v, CUDA_WGMMA_PAD)
    limit = profile.limit("shared_memory_bytes")
    while True:
        buffers, smem = _layout([
            ("sRing", spec.dtype, stages, tile_q + keys_a, CUDA_WGMMA_PAD,
             f"a stage: phase A a 64-column chunk of Q ({tile_q} rows) and of K ({keys_a} keys), phase B a V tile "
             f"({tile_kv} keys x {cols} columns; 128-byte swizzle)"),
            ("sSync", "u32", 1, 1, 4 * stages, "mbarriers: full and empty per stage"),
        ])
        smem += CUDA_WGMMA_ALIGN
        if smem <= limit or stages == 2:
            break
        stages -= 1
    if smem > limit:
        raise Problem(f"P through memory (head dims above {CUDA_WGMMA_MAX_D}) needs {smem} bytes of shared memory "
                      f"for 2 stages ({_describe(buffers)}), but {profile.name} allows {limit}")
    _, consumer = producer_registers(True, "none", 8, True)
    return CudaConfig("wgmma", tile_q, tile_kv, 8, stages, spec.head_dim_qk, spec.head_dim_v, d_qk_pad, d_v_pad,
                      False, buffers, smem, 2 * cols // 4 + 48, consumer, v_blocks=1, d_v_block=cols,
                      fast_path=True, varlen=_cuda_config(spec, profile, "mma"), resident_blocks=1, producer=True,
                      persistent=True, tma=True, tma_q=True, stored_p=True)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def producer_registers(tma: bool, mask_kind: str, consumer_warps: int = 8, tma_q: bool = True,
                       persistent: bool = False, given: int = 0) -> tuple[int, int]:
    """(producer, consumer) registers per thread after setmaxnreg in a producer kernel with
    `consumer_warps` consumer warps: the launch gives each thread 65536 / threads (a multiple of
    8) and the consumers share what the producer gives up (2 warpgroups, cp.async: 72 / 216; with
    the tensor copy engine 24 / 240, 40 / 232; 3 warpgroups 32 / 160, 40 / 152 with a custom mask;
    `tma_q` False: Q by cp.async, CUDA_TMA_KV_ONLY_REGS; persistent blocks with the tensor copy
    engine: CUDA_TMA_CLEANING_REGS at least; `given`: the configuration's own, CudaConfig.producer_regs). One consumer
    warpgroup moves none: its threads keep what the launch gives (up to 255). The producer keeps
    the registers that would not raise the consumers' count (a multiple of 8)."""
    if consumer_warps <= 4:
        return 255, 255
    threads = consumer_warps * 32 + CUDA_PRODUCER_THREADS
    per_thread = min(255, 65536 // threads) // 8 * 8

    def consumer(p):
        return min((per_thread * threads - p * CUDA_PRODUCER_THREADS) // (consumer_warps * 32) // 8 * 8, 255)

    producer = (CUDA_TMA_REGS if tma_q else CUDA_TMA_KV_ONLY_REGS)[mask_kind] if tma else CUDA_PRODUCER_REGS
    if tma and persistent and CUDA_CLEAN_VALUES:
        producer = max(producer, CUDA_TMA_CLEANING_REGS)
    producer = given or producer
    while consumer(producer + 8) == consumer(producer) and producer + 8 <= per_thread:
        producer += 8  # registers the consumers could not use anyway (3 warpgroups: 32 for 24)
    return producer, consumer(producer)


def _swizzle_kv(spec: AttentionSpec, math: str, chunk: int | None) -> bool:
    """Whether an mma.sync kernel keeps K and V in unpadded 128-byte rows (CUDA_SWIZZLE_KV)."""
    # (a paged tile is copied page by page: pages of a multiple of 8 keys keep the pattern)
    # The split (decode) schedules, where it was measured, with head dims 64, 128 and 256 (ptxas on
    # split_kv: d128 240 registers vs 249, d256 8 bytes of spills vs 36; d192 spilled more, 224
    # bytes vs 168).
    return (CUDA_SWIZZLE_KV and math == "mma" and chunk is None and spec.schedule.is_split
            and spec.head_dim_qk in (64, 128, 256) and spec.head_dim_v in (64, 128, 256)
            and (not spec.kv_cache.is_paged or spec.kv_cache.page % 8 == 0))


def _cuda_layout(spec, math, tile_q, tile_kv, stages, chunk, producer=False, persistent=False, tma=False,
                 d_v_cols=None, split_qk=False, o_stage=False):
    """Shared-memory buffers: the whole head dims (chunk None), or one chunk per pipeline stage.
    d_v_cols: the V columns of a block (wgmma output column blocks), when not the whole head dim;
    o_stage: the staging buffer of the tensor store (CUDA_TMA_STORE)."""
    elem = spec.dtype
    if math == "wgmma":  # swizzled, no skew; whole 64-element blocks; 1024 bytes of alignment slack
        d_qk_pad = _round_up(spec.head_dim_qk, CUDA_WGMMA_PAD)
        d_v_pad = d_v_cols or _round_up(spec.head_dim_v, CUDA_WGMMA_PAD)
        entries = [
            ("sQ", elem, 1, tile_q, d_qk_pad, "the block's rows of Q (128-byte swizzle)"),
            ("sK", elem, stages, tile_kv, d_qk_pad, "K tiles, one per pipeline stage (128-byte swizzle)"),
            ("sV", elem, stages, tile_kv, d_v_pad, "V tiles, one per pipeline stage (128-byte swizzle)"),
        ]
        if split_qk:  # two tiles' halves of S from each warpgroup, f32 (CUDA_WGMMA_SPLIT_QK)
            entries.append(("sX", "f32", 2, 2 * tile_q, tile_kv,
                            "each warpgroup's half of S = Q K^T, alternating by tile (split Q K^T)"))
        if o_stage:  # the output tile staged for the tensor store (CUDA_TMA_STORE)
            entries.append(("sO", elem, 1, tile_q, d_v_pad, "the output tile, staged for the tensor store (64-column blocks)"))
        if producer and spec.mask.is_custom:  # a boolean mask's words of each stage's partial tile
            entries.append(("sMask", "u32", stages, tile_q, CUDA_MASK_STAGE_WORDS,
                            "a boolean mask's words of each stage's partial tile (8 per row: 256 keys, padded)"))
        if producer:  # mbarriers (8 bytes: Q, then full and empty per stage) and each stage's bad-key bits;
            # persistent blocks: one more mbarrier (Q free), four item slots of 4 words, four redo
            # flags and two more mbarriers (the items' checks)
            # (with the tensor copy engine, a third mbarrier per stage after the bits: a cleaned tile's landing)
            words = 2 * (1 + 2 * stages) + (26 if persistent else 0) + stages * -(-tile_kv // 32)
            if tma:
                words += 1 + 2 * stages
            entries.append(("sSync", "u32", 1, 1, words,
                            "mbarriers of the copies" + (", the work items" if persistent else "")
                            + " and each stage's keys with non-finite values"))
        buffers, smem = _layout(entries)
        return buffers, smem + CUDA_WGMMA_ALIGN
    skew = CUDA_SMEM_SKEW_BYTES // DTYPE_BYTES[elem]
    if chunk is None:
        pad = 16 if math == "mma" else 1
        d_qk_pad, d_v_pad = _round_up(spec.head_dim_qk, pad), _round_up(spec.head_dim_v, pad)
        swz = _swizzle_kv(spec, math, chunk)
        kv_skew, kv_note = (0, "; 128-byte rows, chunks permuted") if swz else (skew, "")
        entries = [
            ("sQ", elem, 1, tile_q, d_qk_pad + skew, "the block's rows of Q"),
            ("sK", elem, stages, tile_kv, d_qk_pad + kv_skew, "K tiles, one per pipeline stage" + kv_note),
            ("sV", elem, stages, tile_kv, d_v_pad + kv_skew, "V tiles, one per pipeline stage" + kv_note),
        ]
    else:
        entries = [
            ("sQ", elem, stages, tile_q, chunk + skew, "a chunk of the block's rows of Q, one per stage"),
            ("sKV", elem, stages, tile_kv, chunk + skew,
             "a chunk of the K tile (Q K^T steps) or of the V tile (P V steps), one per stage"),
        ]
    if math == "fma":
        entries.append(("sP", "f32", 1, tile_q, tile_kv + 4, "probabilities P of the current tile"))
    return _layout(entries)


def _cuda_registers(math, frags, tile_kv, d_qk_pad, d_v_pad, q_in_registers):
    """Estimated 32-bit registers per thread, calibrated on ptxas -v reports for sm_90.

    Per 16-row fragment: the accumulator (16 rows x d_v over 32 lanes), the scores and their
    exponentials, the Q fragments when they stay in registers; the K rows the CUDA-core path
    holds per step; and about 48 for addresses, loop state and the softmax statistics.
    """
    if math == "wgmma":  # S, P packed in pairs, acc: 16 rows of each over a warp's 32 lanes
        return tile_kv // 2 + tile_kv // 4 + d_v_pad // 2 + 80  # (242 measured at d128 kv128)
    acc = frags * d_v_pad // 2
    scores = frags * tile_kv * 3 // 2
    q = frags * d_qk_pad // 4 if q_in_registers else 0
    k_rows = tile_kv if math == "fma" else 0
    return acc + scores + q + k_rows + 48


def cuda_register_cap(profile: Profile, threads: int) -> int:
    """Registers one thread may use when `threads` threads share the block's register file."""
    per_thread = profile.limit("registers_per_block") // threads // 8 * 8
    return min(profile.limit("registers_per_thread"), per_thread)


def _cuda_rows(given_q, given_w, row):
    """(tile_q, warps) from the spec's tile q and warps (else the profile's default row): each
    warp owns 16 or 32 rows."""
    if given_q is not None and given_q % CUDA_ROWS_PER_WARP:
        raise Problem(f"tile q={given_q} is not a multiple of {CUDA_ROWS_PER_WARP} (a warp owns "
                          f"whole {CUDA_ROWS_PER_WARP}-row fragments of Q)", hint="try tile q=64 or q=128")
    if given_q is not None and given_w is not None:
        if given_q % given_w or (given_q // given_w) not in (16, 32):
            raise Problem(f"tile q={given_q} over warps={given_w} gives {given_q / given_w:g} rows per "
                              "warp; each warp owns 16 or 32 rows of Q", key="target.cuda",
                              hint=f"use warps={given_q // 16} or warps={given_q // 32}"
                              if given_q % 32 == 0 else f"use warps={given_q // 16}")
        return given_q, given_w
    if given_w is not None:
        return given_w * CUDA_ROWS_PER_WARP, given_w
    if given_q is None and "warps" in row:
        return row["tile_q"], row["warps"]
    tile_q = given_q if given_q is not None else row["tile_q"]
    # Up to 8 warps of one fragment each; larger tiles give each warp two fragments.
    frags = 2 if tile_q > 128 and tile_q % 32 == 0 else 1
    return tile_q, tile_q // (CUDA_ROWS_PER_WARP * frags)


def _smaller(*options) -> str | None:
    """A hint naming only the changes that are still possible: (words, possible) pairs."""
    words = [w for w, ok in options if ok]
    return "use " + (", or ".join(words)) if words else None


def _cuda_v_split(d_v: int, chunk: int, cap: int) -> tuple[int, int]:
    """(v_blocks, d_v_block): the output columns over the fewest blocks of at most `cap` columns,
    each a whole number of chunks (the last block's columns past d_v are computed, not stored)."""
    cap = max(chunk, cap // chunk * chunk)
    blocks = -(-d_v // cap)
    d_v_block = _round_up(-(-d_v // blocks), chunk)
    return -(-d_v // d_v_block), d_v_block


def _cuda_default_chunk(spec: AttentionSpec, math: str) -> int:
    """The candidate chunk with the least estimated work: the head-dim columns computed (padding
    to whole chunks, Q K^T once per output block) plus, per shared-memory step, a fixed cost
    (barriers, copy latency) of about CUDA_STEP_COST columns. Ties go to the larger chunk."""
    def work(chunk):
        v_blocks, d_v_block = _cuda_v_split(spec.head_dim_v, chunk, CUDA_MAX_DV_BLOCK)
        columns = v_blocks * (_round_up(spec.head_dim_qk, chunk) + d_v_block)
        return columns * (chunk + CUDA_STEP_COST) / chunk
    return min(CUDA_CHUNKS[math], key=work)


def _cuda_check_chunk(spec: AttentionSpec, math: str, chunk: int) -> None:
    """A `tile d` the spec gives is used as is, or refused with the reason."""
    align = CUDA_CHUNK_ALIGN[math]  # (the language already wants a multiple of 8, at most the head dim)
    if chunk % align:
        why = ("the k of the tensor-core product m16n8k16" if math == "mma"
               else "the 8-column output tiles of the CUDA-core path")
        widest = max(spec.head_dim_qk, spec.head_dim_v)
        hint = (f"leave d out: head dim {widest} fits whole" if chunk >= widest
                else f"try tile d={max(align, chunk // align * align)} or d=64")
        raise Problem(f"tile d={chunk} is not a multiple of {align} ({why})", hint=hint)
    if chunk > CUDA_MAX_DV_BLOCK:
        raise Problem(f"tile d={chunk} is too large (at most {CUDA_MAX_DV_BLOCK}: a block keeps at most "
                          f"{CUDA_MAX_DV_BLOCK} output columns in registers, a whole number of chunks)",
                          hint="try tile d=64")


def _cuda_producer(spec: AttentionSpec, tile_q: int, tile_kv: int, stages: int) -> bool:
    """Whether the Hopper family's block gets a producer warpgroup: the spec's `producer`, else
    auto = on for blocks of two consumer warpgroups (tile q = 128) with a ring of 2+ stages, up to
    head dim 128, without softcap, for no mask or a causal or window one up to tile kv
    CUDA_PRODUCER_MASKED_KV (H100, benchmarks/NOTES.md: d128 L4096 full 429 -> 496 TFLOP/s, causal
    q128 kv96 366 vs the plain loop's 317 at kv128; window 1024 at L16384 286 vs 199 without it and
    170 for the former q128 kv112; d256 with its two stages of kv 64 445 -> 415; softcap 30 causal
    292 either way; custom masks, q128 kv80: window 1024 0.385 ms vs 0.68 without it, the mask's
    words staged with K and V, benchmarks/probe_custom.py)."""
    given = spec.options("cuda").get("producer")
    if given == "off":
        return False
    if given == "on" and tile_q > CUDA_MAX_CONSUMER_GROUPS * CUDA_WGMMA_ROWS:
        raise Problem(f"producer=on with tile q={tile_q}: the producer serves one to three consumer warpgroups "
                      f"(tile q 64, 128 or 192; {tile_q // CUDA_WGMMA_ROWS} would leave them too few registers "
                      "after setmaxnreg)", key="target.cuda", hint="use tile q=128 or 192")
    if stages < 2:
        if given == "on":
            raise Problem("producer=on needs 2 or more K/V stages (the copier fills one tile while the "
                          "consumers still read the previous one)", key="target.cuda", hint="use stages=2")
        return False
    if spec.mask.is_custom and tile_kv > 128 and given == "on":
        raise Problem(f"producer=on with mask custom and tile kv={tile_kv}: the producer stages a partial tile's "
                      "mask words for up to 128 keys (two 128-key chunks of a row)", key="target.cuda",
                      hint="use tile kv=128 or less, or leave producer out")
    dmax = max(spec.head_dim_qk, spec.head_dim_v)
    # causal blocks take the producer up to their own auto tile kv (CUDA_WGMMA_CAUSAL_TILES)
    causal_kv = next((tile[1] for d, tile in CUDA_WGMMA_CAUSAL_TILES if dmax <= d), None)
    masked_kv = causal_kv if spec.mask.kind == "causal" and causal_kv is not None else CUDA_PRODUCER_MASKED_KV
    masked_ok = spec.mask.kind == "none" or (spec.mask.kind in ("causal", "window", "custom")
                                             and tile_kv <= masked_kv)
    # three consumer warpgroups: auto only unmasked (causal q192 no longer spills, but was not faster)
    if tile_q == 3 * CUDA_WGMMA_ROWS:
        return given == "on" or (spec.mask.kind == "none" and spec.softcap is None and dmax <= 128)
    if dmax > 256:  # output column blocks exist only in the producer kernel (wgmma_refusal checked the rest)
        return True
    if dmax > 128:  # CUDA_PRODUCER_WIDE_D_KV: with the tensor copy engine, no mask but causal, its tile kv at most
        wide_kv = _producer_wide_d_kv(spec)
        if _producer_wide_masked(spec):
            wide_kv = CUDA_PRODUCER_WIDE_MASKED_KV
        return given == "on" or (tile_q == 2 * CUDA_WGMMA_ROWS and wide_kv is not None and tile_kv <= wide_kv)
    # (softcap too since 2026-11-27, third session: CUDA_PRODUCER_SOFTCAP)
    return given == "on" or (tile_q == 2 * CUDA_WGMMA_ROWS and masked_ok
                             and (spec.softcap is None or CUDA_PRODUCER_SOFTCAP))


def _producer_wide_masked(spec: AttentionSpec) -> bool:
    """A head dim above 128, up to 256, with a window or custom mask or softcap, whose tiles come
    by the tensor copy engine: the producer with CUDA_PRODUCER_WIDE_MASKED_KV and its tiles
    (CUDA_PRODUCER_WIDE_MASKED_TILES), where CUDA_PRODUCER_WIDE_D_KV has none."""
    dmax = max(spec.head_dim_qk, spec.head_dim_v)
    return (128 < dmax <= 256 and _producer_wide_d_kv(spec) is None and spec.options("cuda").get("tma") != "off"
            and (spec.mask.kind in ("window", "custom") or spec.softcap is not None))


def _split_qk(spec: AttentionSpec) -> bool:
    """Whether a head dim above 256 on the Hopper family splits Q K^T between its two consumer
    warpgroups (CUDA_WGMMA_SPLIT_QK): a padded qk head dim of whole 128-column halves."""
    d_qk_pad = _round_up(spec.head_dim_qk, CUDA_WGMMA_PAD)
    d_pad = _round_up(max(spec.head_dim_qk, spec.head_dim_v), CUDA_WGMMA_PAD)
    return (CUDA_WGMMA_SPLIT_QK and d_pad >= CUDA_WGMMA_SPLIT_QK_MIN_D
            and d_qk_pad % (2 * CUDA_WGMMA_PAD) == 0 and _producer_wide_d_kv(spec) is not None)


def _producer_wide_d_tile(spec: AttentionSpec, profile: Profile, masked: bool = False) -> tuple[int, int]:
    """(tile kv, stages) of the auto tile of a producer kernel above head dim 128: the first of
    CUDA_PRODUCER_WIDE_D_KV's options for the head dim whose buffers fit (up to d256, where the
    whole head dims sit in shared memory; above, the only option, which _cuda_fit places);
    `masked`: a window, custom mask or softcap, CUDA_PRODUCER_WIDE_MASKED_TILES."""
    dmax = max(spec.head_dim_qk, spec.head_dim_v)
    options = (CUDA_PRODUCER_WIDE_MASKED_TILES if masked
               else next(opts for d, opts in CUDA_PRODUCER_WIDE_D_KV if dmax <= d))
    d_v_cols = None  # (above 256: the block's output columns)
    if _round_up(spec.head_dim_v, CUDA_WGMMA_PAD) > CUDA_MAX_DV_BLOCK:
        d_v_cols = _cuda_v_split(spec.head_dim_v, CUDA_WGMMA_PAD, CUDA_MAX_DV_BLOCK)[1]
    for kv, stages in options[:-1]:
        if _cuda_layout(spec, "wgmma", 2 * CUDA_WGMMA_ROWS, kv, stages, None, True, True, True,
                        d_v_cols)[1] <= profile.limit("shared_memory_bytes"):
            return kv, stages
    return options[-1]


def _producer_wide_d_kv(spec: AttentionSpec) -> int | None:
    """The auto tile kv of a producer kernel for head dims above 128 (CUDA_PRODUCER_WIDE_D_KV), or
    None where such head dims keep the plain loop (window, custom, softcap, tma=off, above 256)."""
    dmax = max(spec.head_dim_qk, spec.head_dim_v)
    if (spec.mask.kind not in ("none", "causal") or spec.softcap is not None
            or spec.options("cuda").get("tma") == "off"):
        return None
    return next((max(kv for kv, _ in opts) for d, opts in CUDA_PRODUCER_WIDE_D_KV if dmax <= d), None)


def _persistent_refusal(spec: AttentionSpec, producer: bool) -> str | None:
    """Why a Hopper-family configuration cannot run persistent blocks (None: it can)."""
    if not producer:
        return "persistent blocks belong to the producer warpgroup's kernels, and this plan has no producer"
    return None


def cuda_config(spec: AttentionSpec, profile: Profile) -> CudaConfig:
    """Resolve tiles for CUDA; raise Problem if the spec's own choices cannot work.

    Head dims up to CUDA_MAX_DV_BLOCK sit in shared memory whole when they fit; otherwise (or
    when the spec gives `tile d`) they stream through it in chunks.
    """
    math = cuda_math(spec, profile)
    note = wgmma_refusal(spec, profile) or ""
    for opt, what in (("producer", "the producer warpgroup"), ("persistent", "persistent blocks"),
                      ("tma", "the tensor copy engine's tiles")):
        if math != "wgmma" and spec.options("cuda").get(opt) == "on":
            why = note or f"{profile.name} has no Hopper wgmma family"
            raise Problem(f"{opt}=on: {what} belong{'s' if opt == 'producer' else ''} to the Hopper wgmma family, "
                          f"which this spec does not use on {profile.name} ({why})", key="target.cuda",
                          hint=f"leave {opt} out, or build for cuda-sm90")
    dmax = max(spec.head_dim_qk, spec.head_dim_v)
    if math == "wgmma" and dmax > CUDA_STORED_P_ABOVE and (dmax > CUDA_WGMMA_MAX_D or _stored_p_refusal(spec) is None):
        return _stored_p_config(spec, profile)
    if math == "wgmma":
        kv = rows = None
        opts = spec.options("cuda")
        row = profile.default_row(dmax, math)
        if spec.tile.kv is None:  # masks with more per-element state take a narrower tile kv
            cap = CUDA_WGMMA_KV_CAP.get("softcap" if spec.softcap is not None else spec.mask.kind)
            if (spec.mask.kind == "window" and spec.softcap is None and dmax <= 128 and spec.tile.q is None
                    and row["tile_q"] == 2 * CUDA_WGMMA_ROWS and opts.get("producer") != "off"):
                cap = CUDA_PRODUCER_MASKED_KV  # the widest tile kv with which auto adds the producer
            if cap is not None and row["tile_kv"] > cap:
                kv = (cap, opts.get("stages"))
        if (spec.mask.kind == "causal" and dmax <= CUDA_WGMMA_CAUSAL_TILES[-1][0] and spec.tile.q is None
                and spec.tile.kv is None and opts.get("warps") is None):
            tq, tkv, tst = next(tile for d, tile in CUDA_WGMMA_CAUSAL_TILES if dmax <= d)
            rows, kv = (tq, tq // CUDA_ROWS_PER_WARP), (tkv, opts.get("stages") or tst)
        wide_d_kv = _producer_wide_d_kv(spec) if dmax > 128 else None
        masked_wide = _producer_wide_masked(spec)
        if ((wide_d_kv is not None or masked_wide) and spec.tile.q is None and spec.tile.kv is None
                and opts.get("warps") is None and opts.get("producer") != "off"):
            tkv, stages = _producer_wide_d_tile(spec, profile, masked=masked_wide)
            rows, kv = (2 * CUDA_WGMMA_ROWS, 2 * CUDA_WGMMA_ROWS // CUDA_ROWS_PER_WARP), (tkv, opts.get("stages") or stages)
        wide_d, (wide_q, wide_kv) = CUDA_WGMMA_WIDE_TILE
        if (spec.mask.kind == "none" and spec.softcap is None and dmax <= wide_d and spec.tile.q is None
                and spec.tile.kv is None and opts.get("warps") is None and opts.get("producer") != "off"
                and opts.get("tma") != "off"):
            rows, kv = (wide_q, wide_q // CUDA_ROWS_PER_WARP), (wide_kv, opts.get("stages"))
        if (_split_qk(spec) and spec.tile.q is None and spec.tile.kv is None and opts.get("warps") is None
                and opts.get("stages") is None):
            # the first tile kv and stages (CUDA_WGMMA_SPLIT_TILES) that fit beside Q and the halves of S
            # (a spec's own tiles are kept: they take the column blocks below)
            cfg = None
            for cand, st in CUDA_WGMMA_SPLIT_TILES:
                try:
                    cfg = _cuda_fit(spec, profile, math, None, rows=rows, kv=(cand, st), producer=True,
                                    split_qk=True)
                except Problem:
                    continue
                if cfg.producer:
                    break
            if cfg is None:  # none fits this profile's shared memory: the column blocks' Problem says why
                cfg = _cuda_fit(spec, profile, math, None, rows=rows, kv=kv, producer=True)
        else:
            cfg = _cuda_fit(spec, profile, math, None, rows=rows, kv=kv, producer=True)
        if (dmax <= CUDA_WGMMA_Q128_WITH_PRODUCER_ONLY and spec.tile.q is None
                and opts.get("warps") is None and cfg.tile_q > CUDA_WGMMA_ROWS and not cfg.producer):
            # tile q 128 pays only with the producer: without it (softcap, producer=off) q64, and
            # the causal tiles by head dim (rows set above) q64 kv64, their former default
            if rows is not None:
                kv = (CUDA_WGMMA_ROWS, opts.get("stages"))
            rows = (CUDA_WGMMA_ROWS, CUDA_WGMMA_ROWS // CUDA_ROWS_PER_WARP)
            cfg = _cuda_fit(spec, profile, math, None, rows=rows, kv=kv, producer=True)
        if dmax > 256 and not cfg.producer:
            raise Problem(f"head dim {dmax} on the wgmma family needs the producer warpgroup, which needs 2 K/V stages; "
                          f"tile q={cfg.tile_q} kv={cfg.tile_kv} fits {cfg.stages}", key="target.cuda",
                          hint="leave tile kv and stages out (the planner picks the widest tile kv that fits two stages)")
        if opts.get("tma") == "on" and not cfg.tma:
            raise Problem("tma=on: the tensor copy engine brings the producer warpgroup's tiles, and this plan "
                          "has no producer", key="target.cuda", hint="add producer=on, or leave tma out")
        if opts.get("persistent") == "on" and not cfg.persistent:
            why = _persistent_refusal(spec, cfg.producer)
            raise Problem(f"persistent=on: {why}", key="target.cuda",
                          hint="add producer=on, or leave persistent out")
        if spec.mask.is_custom:
            if not cfg.producer:  # one general instantiation serves every launch
                return cfg
            # The producer kernel takes launches without per-sequence lengths; the _varlen entry
            # keeps the same tiles (a BlockMask is classified for the kernel's tile q x tile kv)
            # on the plain overlapped loop.
            varlen = _cuda_fit(spec, profile, math, None, rows=(cfg.tile_q, cfg.warps), kv=(cfg.tile_kv, cfg.stages))
            return replace(cfg, fast_path=True, varlen=varlen)
        if dmax > 256:
            # Head dims above 256 (CUDA_PRODUCER_WIDE_D_KV): launches with per-sequence lengths take
            # the mma.sync family's chunked head dims in the _varlen entry point.
            return replace(cfg, fast_path=True, varlen=_cuda_config(spec, profile, "mma"))
        if cfg.producer and dmax <= CUDA_VARLEN_PRODUCER_MAX_D:
            # Launches with per-sequence lengths (CUDA_VARLEN_PRODUCER_MAX_D): the same tiles with the
            # producer, persistent blocks, and copies by cp.async (packed rows are not one tensor map)
            # (three consumer warpgroups, q192, were measured with the tensor copy engine only: q128)
            vrows = (cfg.tile_q, cfg.warps) if cfg.tile_q <= 2 * CUDA_WGMMA_ROWS else (
                2 * CUDA_WGMMA_ROWS, 2 * CUDA_WGMMA_ROWS // CUDA_ROWS_PER_WARP)
            kv_max = (CUDA_VARLEN_PRODUCER_KV if spec.head_dim_qk == spec.head_dim_v
                      and spec.head_dim_qk in CUDA_VARLEN_PRODUCER_KV_DIMS else CUDA_VARLEN_PRODUCER_KV_OTHER)
            if dmax <= 64:
                kv_max = CUDA_VARLEN_PRODUCER_KV_NARROW
            varlen = _cuda_fit(spec, profile, math, None, rows=vrows,
                               kv=(min(cfg.tile_kv, kv_max), cfg.stages), producer=True, tma_ok=False)
            if varlen.producer:
                return replace(cfg, fast_path=True, varlen=replace(varlen, producer_regs=CUDA_VARLEN_PRODUCER_REGS))
        # Launches with per-sequence lengths take the _varlen entry point: the same family with
        # a smaller tile kv (64, or 32 above head dim 128), so that the per-sequence state does
        # not spill registers (ptxas reports, benchmarks/NOTES.md).
        kv_cap = 64 if max(cfg.d_qk_pad, cfg.d_v_pad) <= 128 else 32
        vrows = (cfg.tile_q, cfg.warps)
        if rows is not None or (dmax <= CUDA_WGMMA_Q128_WITH_PRODUCER_ONLY and spec.tile.q is None
                                and opts.get("warps") is None):
            # auto causal tiles, and head dims that take q128 only with the producer: the entry
            # point (which has none) keeps q64
            vrows = (CUDA_WGMMA_ROWS, CUDA_WGMMA_ROWS // CUDA_ROWS_PER_WARP)
        # (above d128 two stages: the main entry's third stage (CUDA_PRODUCER_WIDE_D_KV) would turn the
        # _varlen entry's plain loop into the overlapped one, which spills there)
        vstages = min(cfg.stages, 2) if dmax > 128 and opts.get("stages") is None else cfg.stages
        varlen = _cuda_fit(spec, profile, math, None, rows=vrows, kv=(min(cfg.tile_kv, kv_cap), vstages))
        return replace(cfg, fast_path=True, varlen=varlen)
    if note:
        return replace(_cuda_config(spec, profile, math), family_note=note)
    return _cuda_config(spec, profile, math)


def _cuda_config(spec: AttentionSpec, profile: Profile, math: str) -> CudaConfig:
    if spec.tile.d is not None:
        _cuda_check_chunk(spec, math, spec.tile.d)
        return _cuda_fit(spec, profile, math, spec.tile.d)
    chunk = _cuda_default_chunk(spec, math)
    if max(spec.head_dim_qk, spec.head_dim_v) > CUDA_MAX_DV_BLOCK:
        return _cuda_fit(spec, profile, math, chunk)
    try:
        cfg = _cuda_fit(spec, profile, math, None)
    except Problem as whole:
        try:
            return _cuda_fit(spec, profile, math, chunk)
        except Problem:
            raise whole from None  # chunks do not help either: report the plain configuration
    one_frag = None  # the configuration with one 16-row fragment per warp
    if cfg.frags > 1:
        one_frag = _cuda_fit(spec, profile, math, None, rows=(cfg.warps * CUDA_ROWS_PER_WARP, cfg.warps),
                             kv=(cfg.tile_kv, cfg.stages))
    if spec.schedule.is_split or spec.kv_cache.is_paged or spec.mask.is_custom:
        # One general instantiation serves every launch of these kinds; with its per-sequence state,
        # two fragments per warp spill registers, so auto tiles take one (the spec's own are kept).
        auto_rows = spec.tile.q is None and spec.options("cuda").get("warps") is None
        return one_frag if one_frag is not None and auto_rows else cfg
    return replace(cfg, fast_path=True, varlen=one_frag)


def _cuda_fit(spec: AttentionSpec, profile: Profile, math: str, chunk: int | None, rows=None,
              kv=None, producer=False, split_qk=False, tma_ok=True) -> CudaConfig:
    """Tiles for one way of holding the head dims (whole, or `chunk` columns at a time); `rows`
    (tile q, warps) and `kv` (tile kv, stages) fix those instead of the spec (the varlen path);
    `producer`: the Hopper family may take a producer warpgroup (_cuda_producer decides);
    `tma_ok` False: its copies by cp.async (the _varlen entry: rows of packed sequences)."""
    big = max(spec.head_dim_qk, spec.head_dim_v)
    row = profile.default_row(big, math)
    if spec.schedule.is_split:
        # Split schedules serve decode: a block's rows are (query row, head in group) pairs, a few
        # per KV head, so one warp of CUDA_SPLIT_ROWS rows; the splits give the parallelism.
        row = {**row, "tile_q": CUDA_SPLIT_ROWS, "warps": 1, "tile_kv": CUDA_SPLIT_KV, "stages": 2}
        if chunk is not None:  # head dims in chunks: CUDA_SPLIT_CHUNK_KV
            group_rows = CUDA_ROWS_PER_WARP * -(-(spec.group_size or 1) // CUDA_ROWS_PER_WARP)
            group_rows = min(CUDA_SPLIT_CHUNK_MAX_ROWS, group_rows)
            row.update(tile_q=group_rows, warps=group_rows // CUDA_ROWS_PER_WARP, tile_kv=CUDA_SPLIT_CHUNK_KV)
    opts = spec.options("cuda")
    given_q, given_kv, given_w, given_st = spec.tile.q, spec.tile.kv, opts.get("warps"), opts.get("stages")
    if rows is not None:
        given_q, given_w = rows
    if kv is not None:
        given_kv, given_st = kv

    key_warps = _cuda_key_warps(spec, math, chunk, opts.get("key_warps"))
    if key_warps > 1 and given_kv is None:
        given_kv = row["tile_kv"] * key_warps  # each warp keeps the one-warp tile's keys
    if given_kv is not None and given_kv % (16 * key_warps):
        raise Problem(f"tile kv={given_kv} over key_warps={key_warps} gives {given_kv / key_warps:g} keys per "
                      "warp; each warp's keys must be a multiple of 16 (the k of P V)", key="target.cuda",
                      hint=f"use tile kv={16 * key_warps * max(1, given_kv // (16 * key_warps))}")
    if given_kv is not None and given_kv % 16:
        raise Problem(f"tile kv={given_kv} is not a multiple of 16 (the k dimension of the "
                          "tensor-core product P V)", hint="try tile kv=32 or kv=64")
    if given_kv is not None and given_kv > 256:
        raise Problem(f"tile kv={given_kv} is too large (at most 256)", hint="try tile kv=64")
    if math == "wgmma":  # one 16-row fragment per warp, whole warpgroups
        tile_q = given_q if given_q is not None else (given_w * CUDA_ROWS_PER_WARP if given_w else row["tile_q"])
        warps = tile_q // CUDA_ROWS_PER_WARP
        if split_qk:  # two consumer warpgroups over the same 64 rows (CUDA_WGMMA_SPLIT_QK)
            tile_q, warps = CUDA_WGMMA_ROWS, 2 * CUDA_WGMMA_ROWS // CUDA_ROWS_PER_WARP
    else:
        tile_q, warps = _cuda_rows(given_q, given_w, row)
    threads_limit = min(profile.limit("threads_per_block"), 512)
    if warps * 32 > threads_limit or tile_q > 256:
        raise Problem(f"tile q={tile_q} with warps={warps} needs {warps * 32} threads; at most "
                      f"{threads_limit} threads and 256 rows per block",
                      key="tile" if given_q else "target.cuda",
                      hint=f"use warps={min(threads_limit // 32, 256 * warps // tile_q)} or fewer"
                      if given_w and not given_q else "use tile q=128 or less")
    if warps * key_warps * 32 > threads_limit:
        raise Problem(f"key_warps={key_warps} gives {warps * key_warps} warps ({warps * key_warps * 32} threads); "
                      f"at most {threads_limit} threads per block", key="target.cuda",
                      hint=f"use key_warps={max(1, threads_limit // 32 // warps)} or less")
    tile_kv = given_kv if given_kv is not None else row["tile_kv"]
    stages = given_st if given_st is not None else row["stages"]
    if stages > 4:
        raise Problem(f"stages={stages}: at most 4 K/V pipeline stages", key="target.cuda")

    v_cap = CUDA_MAX_DV_BLOCK  # output columns per block; shrinks (more blocks) as a last resort
    while True:
        frags = 1 if split_qk else tile_q // (warps * CUDA_ROWS_PER_WARP)
        if chunk is None:
            pad = {"wgmma": CUDA_WGMMA_PAD, "mma": 16, "fma": 1}[math]
            d_qk_pad, d_v_pad = _round_up(spec.head_dim_qk, pad), _round_up(spec.head_dim_v, pad)
            v_blocks, d_v_block = 1, d_v_pad
            if split_qk:  # each warpgroup half of the block's columns (CUDA_WGMMA_SPLIT_QK)
                v_blocks, d_v_block = _cuda_v_split(spec.head_dim_v, 2 * CUDA_WGMMA_PAD, 2 * CUDA_MAX_DV_BLOCK)
                d_v_pad = d_v_block // 2  # a warpgroup's columns: its acc and the N of its P V
            elif math == "wgmma" and d_v_pad > CUDA_MAX_DV_BLOCK:  # output column blocks (CUDA_WGMMA_MAX_D)
                v_blocks, d_v_block = _cuda_v_split(spec.head_dim_v, CUDA_WGMMA_PAD, CUDA_MAX_DV_BLOCK)
                d_v_pad = d_v_block  # the block's columns: its V tiles, acc and the N of P V
            q_in_regs = math == "mma" and frags * _round_up(spec.head_dim_qk, 16) <= 128
        else:  # Q streams through shared memory with K; the block keeps d_v_block output columns
            v_blocks, d_v_block = _cuda_v_split(spec.head_dim_v, chunk, v_cap)
            d_qk_pad, d_v_pad = _round_up(spec.head_dim_qk, chunk), v_blocks * d_v_block
            q_in_regs = False
        ws = producer and math == "wgmma" and _cuda_producer(spec, tile_q, tile_kv, stages)
        # Every producer kernel runs the work-item code (CUDA_PERSISTENT_AUTO): persistent blocks,
        # or with persistent=off a grid of one block per item, so that a block whose result is not
        # finite still does its item again, cleaned (docs/language.md, "A key of weight 0 adds nothing")
        persist = bool(ws) and _persistent_refusal(spec, ws) is None
        item_per_block = persist and opts.get("persistent") == "off"
        tma = ws and opts.get("tma") != "off" and tma_ok
        tma_q = tma and chunk is None and not pack_gqa(spec)
        buffers, smem = _cuda_layout(spec, math, tile_q, tile_kv, stages, chunk, ws, persist, tma,
                                     d_v_block if chunk is None else None, split_qk)
        regs = _cuda_registers(math, frags, tile_kv // key_warps, d_qk_pad, d_v_pad if split_qk else d_v_block,
                               q_in_regs)
        # with a producer warpgroup, setmaxnreg gives the consumers their registers (producer_registers)
        reg_cap = (producer_registers(tma, spec.mask.kind, warps, tma_q, persist)[1] if ws
                   else cuda_register_cap(profile, warps * key_warps * 32))
        # A little spilling is slower, not wrong: the profile's measured defaults and the spec's
        # own choices may exceed the estimate's cap, but not pathologically (CUDA_SPILL_FACTOR).
        if smem <= profile.limit("shared_memory_bytes") and regs <= reg_cap * CUDA_SPILL_FACTOR:
            break
        if given_kv is None and tile_kv > 16 * key_warps:
            tile_kv //= 2
        elif given_st is None and stages > 1:
            stages -= 1
        elif given_q is None and given_w is None and tile_q > (CUDA_WGMMA_ROWS if math == "wgmma" else 16):
            tile_q //= 2
            warps = tile_q // CUDA_ROWS_PER_WARP
        elif chunk is not None and d_v_block > chunk:
            v_cap = d_v_block - chunk
        else:
            break
    limit = profile.limit("shared_memory_bytes")
    dims = f"head_dim qk={spec.head_dim_qk} v={spec.head_dim_v}"
    if chunk is not None:
        dims += f" in chunks of d={chunk}"
    if smem > limit:
        raise Problem(
            f"tile q={tile_q} kv={tile_kv} with {stages} stage(s) and {dims} "
            f"needs {smem} bytes of shared memory ({_describe(buffers)}), but "
            f"{profile.name} allows {limit}",
            hint=_smaller(("a smaller tile kv", tile_kv > 16), ("a smaller tile q", tile_q > 16),
                          (f"fewer stages (target cuda {{ stages={stages - 1} }})", stages > 1),
                          ("a smaller tile d", chunk is not None and chunk > CUDA_CHUNK_ALIGN[math])))
    if regs > reg_cap * CUDA_SPILL_FACTOR:
        cols = f"head_dim v={spec.head_dim_v}" if chunk is None else f"{d_v_block} output columns per block"
        raise Problem(
            f"tile q={tile_q} kv={tile_kv} on {warps} warps with {cols} needs "
            f"about {regs} registers per thread for scores and accumulators, but {warps * 32} "
            f"threads may use at most {reg_cap} each (more than {CUDA_SPILL_FACTOR:g}x would spill "
            "most of them to local memory)",
            hint=_smaller(("a smaller tile kv", tile_kv > 16), ("more warps (16 rows each)", tile_q // warps > 16))
            or "use a smaller head dim v or tile d")
    tma_store = False
    # (three consumer warpgroups with a mask keep the direct stores: at 160 registers the staging
    # spilled 4-8 bytes, causal q192 kv128 with producer=on)
    if (CUDA_TMA_STORE and tma_q and v_blocks == 1 and not split_qk and chunk is None
            and spec.head_dim_v > CUDA_TMA_STORE_ABOVE
            and not (tile_q == 3 * CUDA_WGMMA_ROWS and spec.mask.kind != "none")):
        o_buffers, o_smem = _cuda_layout(spec, math, tile_q, tile_kv, stages, chunk, ws, persist, tma, d_v_block,
                                         split_qk, o_stage=True)
        if o_smem <= limit:  # (never at the cost of a smaller tile: only where sO fits beside it)
            buffers, smem, tma_store = o_buffers, o_smem, True
    return CudaConfig(math, tile_q, tile_kv, warps * key_warps, stages, spec.head_dim_qk, spec.head_dim_v,
                      d_qk_pad, d_v_pad, q_in_regs, buffers, smem, regs, reg_cap, tma_store=tma_store,
                      chunk=chunk, chunk_given=spec.tile.d is not None, v_blocks=v_blocks,
                      d_v_block=d_v_block, key_warps=key_warps, resident_blocks=max(1, limit // smem),
                      producer=ws, persistent=persist, item_per_block=item_per_block, tma=tma,
                      tma_q=tma_q, split_qk=split_qk, swizzle_kv=_swizzle_kv(spec, math, chunk))


def _cuda_key_warps(spec: AttentionSpec, math: str, chunk: int | None, given: int | None) -> int:
    """Warps over the keys of each tile (split_kv only): the spec's `key_warps`, else the
    default; a given value the kernel cannot honour is refused with the reason."""
    why = None
    if not spec.schedule.is_split:
        why = "warps over keys serve the split decode schedules (split_kv), whose blocks have one warp of rows"
    elif spec.schedule.is_two_pass:
        why = "schedule two_pass keeps one warp per block (its passes store per-row statistics)"
    elif chunk is not None:
        why = "head dims streamed in chunks (tile d) keep one warp per block"
    elif math != "mma":
        why = "f32 storage (CUDA cores) keeps one warp per block"
    if why is not None:
        if given is not None and given > 1:
            raise Problem(f"key_warps={given}: {why}", key="target.cuda", hint="leave key_warps out")
        return 1
    return given if given is not None else CUDA_SPLIT_KEY_WARPS


configure = cuda_config  # the backend's configure() (attngen.backends.base.Backend)


def rescale_slack(plan) -> float:
    """kRescaleSlack of the plan's kernels: CUDA_RESCALE_SLACK, or 0 (rescale at every new max) with
    f16 accumulators, the two_pass schedule, or fewer than CUDA_RESCALE_SLACK_MIN_DV output columns."""
    if ("f16" in (plan.acc_qk, plan.acc_pv) or plan.spec.schedule.is_two_pass
            or plan.d_v < CUDA_RESCALE_SLACK_MIN_DV):
        return 0.0
    return CUDA_RESCALE_SLACK
