"""The WGSL backend's tile choices, as data: one frozen table (WgslTiles) and its defaults.

config.py (the logic) reads the table of the profile it plans for, `tiles_for(profile)`: the
defaults (DEFAULT), or the profile's overrides (`profile.with_overrides(max_scores=16)`;
attngen.plan.profiles.Profile.overrides). A profile's own [limits] invocation_scores and
invocation_accumulators still come first where it sets them (config.register_budget). VEC below
is a fact of the kernel (its tiles pass through workgroup memory as vec4), not a choice.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...plan.profiles import Profile, with_overrides

VEC = 4  # elements per vec4: dims of Q/K, columns of V, keys of P


@dataclass(frozen=True)
class WgslTiles:
    # an invocation's register budget, in f32 values, where the profile sets none: occupancy falls with it
    max_scores: int = 32  # scores R x C of S per invocation
    max_accumulators: int = 64  # acc R x columns per invocation; wider head dims v split over workgroups
    max_rows: int = 4  # rows of the sub-block an auto plan gives an invocation at most
    min_workgroup: int = 64  # auto plans give an invocation more rows only while the workgroup keeps this many
    row_pad: int = 4  # elements added to rows that invocations read at different rows (bank spread)
    prefetch_max_items: int = 8  # auto: prefetch where each tile costs an invocation at most this many vec4
    prefetch_limit_items: int = 16  # prefetch=on: refused past this many vec4 registers
    # the decode kernel (decode.py, templates/wgsl/decode.wgsl.j2)
    decode_workgroup: int = 128  # invocations of a decode workgroup at most (fewer where workgroup memory is short)
    decode_keys: int = 4  # keys each team loads per step: their 16-byte loads are in flight together
    decode_rows: int = 8  # (query row, head in group) pairs per decode workgroup at most
    decode_registers: int = 128  # f32 values of q and acc per decode invocation at most (rows are cut to fit)
    decode_i8_unpack: bool = False  # i8 bytes to f32 by WGSL's unpack4xI8 and a conversion, not integer operations


DEFAULT = WgslTiles()

def tiles_for(profile: Profile | None) -> WgslTiles:
    """The table a configuration of `profile` reads: DEFAULT with the profile's overrides (checked
    by name and type: attngen.plan.profiles.with_overrides)."""
    return with_overrides(DEFAULT, profile)
