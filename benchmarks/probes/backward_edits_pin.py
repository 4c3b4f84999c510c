"""Edits for probe_backward_edits.py (benchmarks/NOTES.md, eighteenth session): the dQ staging's
per-thread base pinned in a register before the wait for dQ's product (an empty asm), against the
kept form that leaves its place to the compiler. Measured: level at d64 and d256; at d128 -1.4% to
+1.1% across two runs (the noise of a row). Rows: any of the 128-key kernel (d64, d128) or the
head-dim-256 kernel.

    python3 benchmarks/probes/probe_backward_edits.py benchmarks/probes/backward_edits_pin.py \
        d64-L16384-full d128-L1024-causal d128-L16384-full d256-L4096-full
"""

_BASE = "    return 512 * wi + 32 * g + 2 * (t & 1) + 4 * ((t >> 1) ^ g);\n"
_PINNED = ("    unsigned base = 512 * wi + 32 * g + 2 * (t & 1) + 4 * ((t >> 1) ^ g);\n"
           "    asm volatile(\"\" : \"+r\"(base));\n"
           "    return base;\n")

VARIANTS = {"pinned": [(_BASE, _PINNED)]}
