"""The order of causal work items for persistent blocks, by count (no GPU): a list schedule of
the items on 132 blocks (each block takes the next item when it finishes one) in the head-major
order (each head's last row tile first) and in groups of G (batch, head) pairs taken longest first
(templates/cuda/family_producer.j2, section work items). An item's length is its K/V tiles plus a fixed cost
of 2 tiles (Q load, last P V, epilogue); L2 is not modelled (that is what the group bound is for).

    python3 benchmarks/probes/sched_order.py

Prints, per shape, the ideal (total / blocks) and each order's end, with its share of the ideal.
"""

from __future__ import annotations

import heapq
import math


def makespan(items, blocks=132, fixed=2.0):
    heap = [(0.0, i) for i in range(blocks)]
    for w in items:
        t, i = heapq.heappop(heap)
        heapq.heappush(heap, (t + w + fixed, i))
    return max(t for t, _ in heap)


def shape(name, batch, heads, length, tile_q=128, tile_kv=96, blocks=132):
    tiles = length // tile_q
    work = [math.ceil((t + 1) * tile_q / tile_kv) for t in range(tiles)]  # row tile t sees (t + 1) tile_q keys
    pairs = batch * heads
    ideal = sum(w + 2.0 for w in work) * pairs / blocks
    orders = {"head-major": [work[tiles - 1 - r] for _ in range(pairs) for r in range(tiles)]}
    for g in (4, 16):
        items = []
        for first in range(0, pairs, g):
            n = min(g, pairs - first)
            items += [work[tiles - 1 - r // n] for r in range(tiles * n)]
        orders[f"groups of {g}"] = items
    cells = ", ".join(f"{k} {makespan(v, blocks):.0f} ({ideal / makespan(v, blocks):.0%})" for k, v in orders.items())
    print(f"{name}: ideal {ideal:.0f}; {cells}")


if __name__ == "__main__":
    shape("MLA 192/128 B1 H16 L4096 (q128 kv96)", 1, 16, 4096)
    shape("Qwen2 GQA-7 B1 H28 L4096 (q128 kv96)", 1, 28, 4096)
    shape("d128 B4 H16 L4096 (q128 kv96)", 4, 16, 4096)
    shape("d256 B16 H8 L1024 (q128 kv80)", 16, 8, 1024, tile_kv=80)
    shape("d64 B16 H32 L1024 (q128 kv128)", 16, 32, 1024, tile_kv=128)
