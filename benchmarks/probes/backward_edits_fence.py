"""Edits for probe_backward_edits.py (benchmarks/NOTES.md, nineteenth session): the proxy fence
before a dQ reduction (fence.proxy.async, MEMBAR.ALL.CTA in SASS) also waits for the thread's
cp.async copies still in flight, and the next step's copies were issued just before it. Nsight
Compute's source page of the head-dim-256 kernel put 6-9% of its warp samples on those fences
(long scoreboard) and 14% on the step's last barrier.

Narrow kernel (d64 / d128; correct results):
  "prefetch after dQ" / "prefetch after dQ (128)": the next step's copies issued after the
      previous step's dQ is staged and fenced (64-row / 128-row steps), with "no mid fence":
      the fence after dS's transposed stores left out (the step's last fence, after the wait
      for the copies, orders them before the next step's dQ product reads them).
  "no mid fence": that alone.
Wide kernel (d256):
  "copies after part 0": the next step's copies issued after dQ's first part is fenced.
  "rows at the end": lse_i / D_i read at the end of the step, not beside the copies.
Diagnostics (wrong on purpose, timing only): "no staging fence" (narrow) / "(wide)".
"""

_TOP = "            prefetch();\n            const elem_t* sQ"
_AFTER64 = "            } else {\n                issue_scores(s, dp, sK, sV, sQ, sDO, w);\n            }\n"
_AFTER128 = "            } else {\n                issue_s(s, sK, sQ, w);\n            }\n"
_MID = "            }\n            fence_async_shared();\n            wgmma_wait<0>();  // dV, dK done"
_NO_MID = "            }\n            wgmma_wait<0>();  // dV, dK done"
_N_FENCE = "    stage_dq(dq, stage, base);\n    fence_async_shared();  // the engine reads the staged rows through the async proxy\n"
_W_FENCE = "                fence_async_shared();  // the engine reads the staged rows through the async proxy\n"
_W_LOAD = "            if (more) load_step(smem, st ^ 1, a, seq, b, hk * a.group + nxt.g, nxt.i0, j0);\n"
_W_SYNC = "                named_sync(1 + w, 128);\n                if (lead) {\n                    const int col"
_W_SYNC_LOAD = ("                named_sync(1 + w, 128);\n"
                "                if (part == 0 && more) load_step(smem, st ^ 1, a, seq, b, hk * a.group + nxt.g, nxt.i0, j0);\n"
                "                if (lead) {\n                    const int col")
_W_SPLIT_OLD = "    cp_async_commit();\n    float* lse2 = reinterpret_cast<float*>(smem + kOffsetRows) + st * 2 * kBlockM;\n"
_W_SPLIT_NEW = ("    cp_async_commit();\n}\n"
                "__device__ __forceinline__ void load_rows(unsigned char* smem, int st, const Args& a, const Seq& seq, int b, int h,\n"
                "                                          int i0) {\n"
                "    const int rows = seq.len_q - i0;\n    const long long row0 = seq.q_start + i0;\n"
                "    float* lse2 = reinterpret_cast<float*>(smem + kOffsetRows) + st * 2 * kBlockM;\n")
_W_FIRST = "        load_step(smem, 0, a, seq, b, hk * a.group + cur.g, cur.i0, j0);\n"
_W_FIRST_ROWS = _W_FIRST + "        load_rows(smem, 0, a, seq, b, hk * a.group + cur.g, cur.i0);\n"
_W_END = "            cp_async_wait_all();\n            fence_async_shared();\n            __syncthreads();  // the next stage has landed"
_W_END_ROWS = "            if (more) load_rows(smem, st ^ 1, a, seq, b, hk * a.group + nxt.g, nxt.i0);\n" + _W_END

VARIANTS = {
    "no mid fence": [(_MID, _NO_MID)],
    "prefetch after dQ": [(_TOP, "            const elem_t* sQ"), (_AFTER64, _AFTER64 + "            prefetch();\n"),
                          (_MID, _NO_MID)],
    "prefetch after dQ (128)": [(_TOP, "            const elem_t* sQ"), (_AFTER128, _AFTER128 + "            prefetch();\n"),
                                (_MID, _NO_MID)],
    "no staging fence": [(_N_FENCE, "    stage_dq(dq, stage, base);\n")],
    "copies after part 0": [(_W_LOAD, ""), (_W_SYNC, _W_SYNC_LOAD)],
    "rows at the end": [(_W_SPLIT_OLD, _W_SPLIT_NEW), (_W_FIRST, _W_FIRST_ROWS), (_W_END, _W_END_ROWS)],
    "no staging fence (wide)": [(_W_FENCE, "")],
}
