"""The numeric limits of attngen, once, each with its reason.

Layer 0 (docs/architecture.md): it imports nothing of attngen, and every layer that checks a
size against one of these (the language's reader and target options, the runtimes' checks of a
call, the CUDA launcher, the command's --shape) imports it from here, so that a limit cannot
differ between the place that accepts a value and the place that launches it.
tests/plan/test_limits_once.py fails when one of these numbers is written again elsewhere.
"""

from __future__ import annotations

# Integers of the language (every number a spec or a target block may give) and every entry of
# a call's integer inputs (kv_lens, cu_seqlens, block_table): the kernels hold them in int32.
INT32_MAX = 2**31 - 1

# CUDA's grid.y / grid.z and WebGPU's dispatch dimensions (the WebGPU default
# maxComputeWorkgroupsPerDimension): the batch and the heads each take one of them.
MAX_GRID_YZ = 65535

# CUDA's grid.x: the row tiles (times the KV splits) of a launch.
MAX_GRID_X = INT32_MAX

# Query and KV heads a spec may name: the heads are one grid / dispatch dimension.
MAX_HEADS = MAX_GRID_YZ

# The longest sequence (and any --shape size) the runtimes accept: it keeps the kernels' index
# arithmetic (row * heads + head, key offsets, windows) in 32 bits. Windows at least this wide
# are unbounded (attngen.plan.masks.WINDOW_CAP).
MAX_SEQ_LEN = 2**30

# The largest 32-bit unsigned word (WGSL's u32 inputs: a block table's entries past a
# sequence's pages are clipped into it).
UINT32_MAX = 2**32 - 1

# The largest TCP port (attngen serve-demo's --port; 0 asks the system for any free one).
MAX_PORT = 2**16 - 1
