"""Edits for probe_backward_edits.py (benchmarks/NOTES.md, nineteenth session): what the dQ
reductions cost the fast CUDA backward, and two small changes at a block's start and end. Rows:
any of the 128-key kernel (d64, d128) or the head-dim-256 kernel; each variant applies to one of
them (the other's rows report it left out).

Kept candidates (results equal to the unedited kernel's):
  "end read" / "end read (wide)": the block's last wait for its reductions waits until the engine
      has read the staging (.read), not until the adds are done in L2: a kernel's outstanding bulk
      operations complete before the next launch on the stream starts.
  "prologue sync": the keys' non-finite flags zeroed before the wait for the first copies, one
      barrier fewer.
Diagnostics (wrong results on purpose: timing only):
  "no wait read": the step's wait for the previous reductions' reads left out (a race).
  "half reduce": only the first of each staging's two 32-column boxes is added (half the bytes).
  "no reduce": no reductions at all.

    python3 benchmarks/probes/probe_backward_edits.py benchmarks/probes/backward_edits_reduce.py \
        d64-L1024-full d128-L1024-causal d256-L16384-full
"""

_ZERO_OLD = ("        cp_async_wait_all();\n        __syncthreads();\n"
             "        // Zero the inf / NaN values of K_j and V_j (a key a row does not see contributes nothing,\n"
             "        // whatever its values: but 0 times inf is NaN in a product) and flag their keys.\n"
             "        bool seen = false;\n        if (threadIdx.x < kBlockN) bad[threadIdx.x] = 0;\n        __syncthreads();\n")
_ZERO_NEW = ("        if (threadIdx.x < kBlockN) bad[threadIdx.x] = 0;\n        cp_async_wait_all();\n        __syncthreads();\n"
             "        bool seen = false;\n")
_NARROW_WAIT = "            bulk_wait_read();  // the dQ staging buffer has been read by the bulk reductions\n"
_WIDE_WAIT = "            if (n_steps > 0 && lead) bulk_wait_read();\n"
_NARROW_SECOND = "        tma_reduce_add(dq_map, stage + 64 * 32, col0 + 32, h, seq.q_start + i0, batch);\n"
_NARROW_FIRST = "        tma_reduce_add(dq_map, stage, col0, h, seq.q_start + i0, batch);\n"
_WIDE_SECOND = "                    tma_reduce_add(dq_map, stage + 64 * 32, col + 32, h, row, map_batch);\n"
_WIDE_FIRST = "                    tma_reduce_add(dq_map, stage, col, h, row, map_batch);\n"

VARIANTS = {
    "end read": [("            bulk_wait();\n", "            bulk_wait_read();\n")],
    "end read (wide)": [("        if (lead) bulk_wait();", "        if (lead) bulk_wait_read();")],
    "prologue sync": [(_ZERO_OLD, _ZERO_NEW)],
    "no wait read": [(_NARROW_WAIT, "")],
    "no wait read (wide)": [(_WIDE_WAIT, "")],
    "half reduce": [(_NARROW_SECOND, "")],
    "half reduce (wide)": [(_WIDE_SECOND, "")],
    "no reduce": [(_NARROW_SECOND, ""), (_NARROW_FIRST, "")],
    "no reduce (wide)": [(_WIDE_SECOND, ""), (_WIDE_FIRST, "")],
}
