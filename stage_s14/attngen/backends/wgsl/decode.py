"""The decode kernel (templates/wgsl/decode.wgsl.j2): which specs it serves, and its shape.

The register-tiled kernel (kernel.wgsl.j2) serves split_kv with a tile of 32-128 rows that decode
fills with a handful ((query row, head in group) pairs: 4 for one query row of a GQA group of 4)
and copies every K/V tile through workgroup memory between barriers: measured on the H200 at 40-80
GB/s of cache read, a fiftieth of the GPU's bandwidth, and a quantized cache (half or a quarter of
the bytes) no faster (issue 44). The decode kernel reads the cache the way a memory-bound loop
must: no workgroup memory and no barrier in its main loop, wide loads, and no work for rows that
do not exist.

- A workgroup takes ROWS (query row, head in group) pairs of one KV head (a GQA group's rows of a
  query row: Lq = 1 needs one row block per KV head), one KV split and one sequence: the grid of
  the split schedules (attngen.plan.schedule), with tile q = ROWS.
- TEAM consecutive invocations of one subgroup take one key: each loads 16-byte items of its K and
  V rows (vec4<u32>: 16 bytes of a quantized cache, 8 f16 or 4 f32), dequantizes them in
  registers and multiplies with the rows' q it holds; the team's partial dot products are summed
  by subgroup shuffles, so every invocation of the team holds the key's scores.
- The workgroup's TEAMS teams take KEYS keys each per step (STEP = TEAMS * KEYS keys, the plan's
  tile kv), all loads first (KEYS * (CHUNKS_K + CHUNKS_V) 16-byte loads in flight per invocation),
  then the scores, an online softmax per team and row (acc rescaled only when a row's max grew),
  and P V into the invocation's own output columns (its items of V).
- At the end the teams' (m_i, l_i, acc) are merged once: maxima and sums through workgroup
  memory, acc by subgroup shuffles within the subgroup size the plan relies on and then through
  workgroup memory across those blocks; the split's normalised output and lse go to o_part /
  lse_part and the split schedules' combine merges the splits, as for the register-tiled kernel.

Which specs: `target wgsl { decode=on }`, or `decode=auto` (the default) where the profile's
`[dialect] decode_kernel` is true, for split_kv(N) / split_kv(auto) with masks none, causal and
window, soft-capping, f32 accumulators, f16 or f32 storage and any kv_dtype, contiguous, paged or
packed sequences, k_new / v_new appends (the fused append copies 16-byte items; into a quantized
cache it quantizes them, reading k_new / v_new from seq_meta), on profiles
that guarantee subgroups. decode_problems() says why a spec is not served (decode=on: the
checker's message); decode=auto then keeps the register-tiled kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from ...lang.spec import AttentionSpec
from ...plan.kernel_plan import Problem, place_buffers
from ...plan.profiles import Profile
from .tiles import WgslTiles

ITEM_BYTES = 16  # one load of K or V: vec4<u32>
_STORED_BYTES = {"f16": 2, "f32": 4}  # a cache in the spec's dtype; kv_dtype: one byte per value


@dataclass(frozen=True)
class DecodeShape:
    """The decode kernel's constants (its source's section config has each with its meaning)."""

    rows: int       # ROWS: (query row, head in group) pairs per workgroup (the plan's tile q)
    workgroup: int  # invocations
    team: int       # TEAM: invocations per key (a power of two within one subgroup)
    keys: int       # KEYS: keys per team per step
    subgroup: int   # the subgroup size the kernel relies on (the profile's guaranteed minimum)
    values: int     # values of K or V per 16-byte item
    items_qk: int   # 16-byte items of a row of K
    items_v: int    # and of V
    i8_unpack: bool = False  # kv_dtype i8 decoded by unpack4xI8 (the tile table's decode_i8_unpack)

    @property
    def teams(self) -> int:
        return self.workgroup // self.team

    @property
    def step(self) -> int:
        """Keys per workgroup step (the plan's tile kv)."""
        return self.teams * self.keys

    @property
    def chunks_k(self) -> int:
        """Items of each key's K row per invocation."""
        return self.items_qk // self.team

    @property
    def chunks_v(self) -> int:
        return self.items_v // self.team

    @property
    def groups(self) -> int:
        """vec4<f32> of values per item."""
        return self.values // 4

    @property
    def blocks(self) -> int:
        """Blocks of `subgroup` invocations (acc is summed over the teams of a block by shuffles)."""
        return self.workgroup // self.subgroup

    @property
    def registers(self) -> int:
        """f32 values of q and acc per invocation."""
        return 4 * self.rows * self.groups * (self.chunks_k + self.chunks_v)

    def summary(self) -> str:
        return (f"decode kernel: {self.rows} (query row, head) pair(s) per workgroup of {self.workgroup}, teams of "
                f"{self.team} invocation(s) per key ({self.chunks_k} + {self.chunks_v} 16-byte item(s) of K and V "
                f"each, {self.values} values an item), {self.keys} key(s) per team and step ({self.step} keys a step)")


def stored_bytes(spec: AttentionSpec) -> int:
    """Bytes per value of the cache as stored."""
    return 1 if spec.kv_dtype is not None else _STORED_BYTES.get(spec.dtype, 2)


def decode_problems(spec: AttentionSpec, profile: Profile) -> list[str]:
    """Why the decode kernel does not serve `spec` on `profile` ([]: it does)."""
    opts = spec.options("wgsl")
    why = []
    if spec.schedule.kind != "split_kv":
        why.append(f"schedule {spec.schedule.kind}: the decode kernel is a split_kv kernel (its splits merged by the "
                   "combine)")
    if spec.mask.kind not in ("none", "causal", "window"):
        why.append(f"mask {spec.mask.kind}: the decode kernel takes masks none, causal and window")
    if spec.score is not None or spec.inputs:
        why.append("score expressions and inputs are the register-tiled kernel's")
    if "f16" in (spec.acc_qk, spec.acc_pv):
        why.append("f16 accumulators: the decode kernel accumulates in f32")
    if opts.get("subgroups") == "off" or not profile.may_use_feature("subgroups"):
        without = "subgroups=off" if opts.get("subgroups") == "off" else f"profile {profile.name} has no subgroups"
        why.append(f"it sums a key's dot products over subgroup shuffles, and {without}")
    if any(x is not None for x in (spec.tile.q, spec.tile.kv, spec.tile.d)) or opts.get("prefetch") == "on":
        why.append("`tile` and prefetch=on shape the register-tiled kernel")
    for name, d in (("qk", spec.head_dim_qk), ("v", spec.head_dim_v)):
        if d * stored_bytes(spec) % ITEM_BYTES:
            why.append(f"head_dim {name}={d}: its rows are not whole 16-byte items of "
                       f"{spec.kv_dtype or spec.dtype} (a multiple of {ITEM_BYTES // stored_bytes(spec)})")
    return why


def _team(items_qk: int, items_v: int, subgroup: int) -> int:
    """Invocations per key: the largest power of two dividing both rows' items, within a subgroup."""
    common, team = gcd(items_qk, items_v), 1
    while team * 2 <= subgroup and common % (team * 2) == 0:
        team *= 2
    return team


def _layout(teams: int, rows: int, blocks: int, d_v: int):
    """Workgroup memory of the decode kernel's epilogue (the main loop uses none)."""
    return place_buffers([
        ("sM", "f32", 1, teams, rows, "each team's row max m_i, then its share of the row's sum l_i"),
        ("sBad", "u32", 1, teams, rows, "each team's row_bad (the row saw a NaN or +inf score)"),
        ("sO", "f32", 1, blocks, d_v, "acc summed over each block's teams, one output row at a time"),
    ])


def decode_shape(spec: AttentionSpec, profile: Profile, t: WgslTiles) -> DecodeShape:
    """The decode kernel's shape for `spec` (decode_problems() empty); a Problem where none fits the
    profile."""
    key = "target.wgsl"
    sg = int(profile.features.get("subgroup_min_size", 4))
    eb = stored_bytes(spec)
    values = ITEM_BYTES // eb
    items_qk, items_v = spec.head_dim_qk * eb // ITEM_BYTES, spec.head_dim_v * eb // ITEM_BYTES
    team = _team(items_qk, items_v, sg)
    groups = values // 4
    per_row = 4 * groups * (items_qk + items_v) // team
    most = min(t.decode_rows, t.decode_registers // per_row)
    if most < 1:
        raise Problem(f"decode=on: one row's q and acc take {per_row} registers per invocation (teams of {team} "
                      f"over head dims {spec.head_dim_qk} / {spec.head_dim_v}), above the {t.decode_registers} the "
                      "decode kernel allows", key=key, hint="use decode=off")
    group = spec.heads_q // spec.heads_kv if spec.heads_q else 4  # the rows of one query row
    blocks_per_group = -(-group // most)
    rows = -(-group // blocks_per_group)  # the group's rows in equal blocks
    max_inv = profile.limit("invocations_per_workgroup")
    wg = spec.options("wgsl").get("workgroup")
    unit = max(team, sg)
    if wg is not None:
        if wg % unit or wg > max_inv:
            raise Problem(f"decode kernel: workgroup={wg} is not a multiple of {unit} (teams of {team} in subgroups of "
                          f"{sg}) within {max_inv} invocations", key=key, hint=f"use a multiple of {unit}")
        sizes = [wg]
    else:
        sizes, w = [], min(t.decode_workgroup, max_inv) // unit * unit
        while w >= unit:
            sizes.append(w)
            w //= 2
    limit = profile.limit("workgroup_storage_bytes")
    for w in sizes:
        shape = DecodeShape(rows, w, team, t.decode_keys, sg, values, items_qk, items_v, t.decode_i8_unpack)
        if _layout(shape.teams, rows, shape.blocks, spec.head_dim_v)[1] <= limit:
            return shape
    raise Problem(f"decode kernel: its epilogue's workgroup memory ({_layout(unit // team, rows, 1, spec.head_dim_v)[1]}"
                  f" bytes at the least) does not fit {profile.name}'s {limit}", key=key, hint="use decode=off")


def plan_decode(spec: AttentionSpec, profile: Profile, t: WgslTiles) -> tuple[DecodeShape, tuple, int] | None:
    """(shape, workgroup buffers, bytes) of the decode kernel where it serves `spec`, else None:
    `target wgsl { decode=on }` (a Problem naming why not), or auto where the profile's `[dialect]
    decode_kernel` is true and decode_problems() finds nothing."""
    mode = spec.options("wgsl").get("decode") or "auto"
    if mode == "off":
        return None
    why = decode_problems(spec, profile)
    if mode == "auto" and (why or not profile.section("dialect").get("decode_kernel", False)
                           or spec.options("wgsl").get("workgroup") is not None):  # (a register-tiled choice)
        return None
    if why:
        raise Problem("decode=on: " + "; ".join(why), key="target.wgsl", hint="use decode=auto or off")
    try:
        shape = decode_shape(spec, profile, t)
    except Problem:
        if mode == "auto":  # the register-tiled kernel, as without the dialect's choice
            return None
        raise
    buffers, smem = _layout(shape.teams, shape.rows, shape.blocks, spec.head_dim_v)
    return shape, buffers, smem


# ---- what the source prints (emit.render_decode; templates/wgsl/decode.wgsl.j2) -------------------

# An item holds inf or NaN where (word & field) + one carries into top (per 16-bit half, byte or word).
NONFINITE = {
    "f16": ("0x7c007c00u", "0x04000400u", "0x80008000u", "an f16 with exponent 31"),
    "f32": ("0x7f800000u", "0x00800000u", "0x80000000u", "an f32 with exponent 255"),
    "e4m3": ("0x7f7f7f7fu", "0x01010101u", "0x80808080u", "an e4m3 byte s 1111 111, its NaN"),
    "e5m2": ("0x7c7c7c7cu", "0x04040404u", "0x80808080u", "an e5m2 byte with exponent 31"),
}
ITEM_DOC = {"f16": "8 f16", "f32": "4 f32", "i8": "16 int8", "e4m3": "16 e4m3 bytes", "e5m2": "16 e5m2 bytes"}


def shuffle_masks(lo: int, hi: int) -> list[int]:
    """Shuffle masks of a butterfly over lanes lo apart up to hi: hi / 2, ..., lo (none when hi <= lo)."""
    out, m = [], hi // 2
    while m >= lo:
        out.append(m)
        m //= 2
    return out


def decode_manifest(plan) -> dict:
    """The manifest's "decode": what a launcher needs to know of the decode kernel (its grid, splits and
    bindings are in the manifest's usual places)."""
    d = plan.config.decode
    return {
        "kernel": "decode", "rows": d.rows, "workgroup": d.workgroup, "team": d.team, "keys": d.keys,
        "step": d.step, "subgroup": d.subgroup,
        "note": "the decode kernel (docs/wgsl-variants.md, \"The decode kernel\"): a workgroup takes `rows` (query row, "
                "head in group) pairs of one KV head (the split schedules' grid with tile q = rows; the split rule's "
                "tile_kv is `step`, the keys of one step), teams of `team` invocations take a key each; it needs "
                "subgroups of at least `subgroup` invocations that are consecutive runs of local_invocation_index. q "
                "is read as u32 words, k, v and kv_new as 16-byte items (vec4<u32>): the same bytes as the other "
                "kernels', whose rows are whole items; with kv_dtype, k_new and v_new (an append) are in seq_meta "
                "from word meta_new, quantized by the kernel",
    }
