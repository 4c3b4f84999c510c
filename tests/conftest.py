"""Shared test fixtures: which devices are here, random inputs, running a kernel on a target."""

from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import tempfile

import numpy as np
import pytest

import attngen

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sigint_default():
    """A subprocess's preexec_fn for the Ctrl-C tests: SIGINT back to its default action, so that the
    child's Python raises KeyboardInterrupt even where the tests were started in the background of a
    shell without job control (which ignores SIGINT in what it starts, and children inherit that)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# The example block of the design's "The language" (README.md shows it too), verbatim.
DESIGN_EXAMPLE = """\
# Llama-3-8B prefill: grouped-query attention, causal, half precision
attention llama3_8b_prefill {
    head_dim   128                      # or: head_dim qk=192 v=128
    heads      q=32 kv=8                # optional; omitted = any head count at run time
    dtype      f16                      # storage of q, k, v, out: f16 | bf16 | f32
    accumulate qk=f32 pv=f32            # matmul accumulators: f32 | f16 (softmax stats are f32)
    mask       causal                   # see below
    softcap    50.0                     # optional: s = c * tanh(s / c)
    scale      auto                     # auto = 1/sqrt(head_dim qk), or a number
    tile       q=128 kv=64              # rows of Q and of K/V per block; d= chunks the head dim
    schedule   fused                    # fused | split_kv(N) | split_kv(auto) | two_pass
    kv_cache   contiguous               # contiguous | paged(page=16)
    target cuda { warps=4 stages=2 }
    target wgsl { workgroup=128 subgroups=auto }
}
"""


# The suite's own disk cache: never the user's ~/.cache/attngen (nor a directory the user set).
# The first pytest process (the controller under pytest-xdist) makes a temporary directory and
# removes it at the end; the xdist workers and every subprocess a test starts inherit it.
_CACHE_OWNER = "_ATTNGEN_TEST_CACHE_OWNER"


def pytest_configure(config):
    if os.environ.get(_CACHE_OWNER) and os.environ.get("ATTNGEN_CACHE_DIR") == os.environ[_CACHE_OWNER]:
        return  # a worker: the controller's directory
    path = tempfile.mkdtemp(prefix="attngen-test-cache-")
    os.environ["ATTNGEN_CACHE_DIR"] = os.environ[_CACHE_OWNER] = path
    config._attngen_test_cache = path


def pytest_collection_finish(session):
    """The objects collection made (modules, parsed specs, several thousand items) live to the end:
    gc.freeze() leaves them out of every later garbage collection, which otherwise walks them all
    each time (half a minute of the full suite's CPU time on 2 cores, 2026-11-29)."""
    import gc
    gc.freeze()


def pytest_unconfigure(config):
    path = getattr(config, "_attngen_test_cache", None)
    if path:
        shutil.rmtree(path, ignore_errors=True)


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite tests/golden/* from the current generator")
    parser.addoption("--quick", action="store_true", default=False,
                     help="the quick tier: the tests QUICK (tests/conftest.py) names, every layer on small shapes")
    parser.addoption("--tint-pass", action="store_true", default=False,
                     help="scripts/test.sh's second pass, on Dawn: leave out TINT_PASS_EXCEPT (tests/conftest.py)")


# ---- the quick tier (bash scripts/test.sh --quick) ----------------------------------------------
# Every layer runs tests, on small shapes, in under 3 minutes on 2 cores; the full suite (what CI
# runs) runs everything. A test is in the tier when its node id matches a pattern (`*`: any text,
# nothing else special) of QUICK and none of QUICK_EXCEPT, or one of QUICK_PICKS: whole layers where they are cheap, and of
# the costly kinds (NVRTC compiles, a second or more each; lavapipe runs of large kernels; tune's
# sweeps; subprocesses) a few. The summary at the end counts what passed per layer and names a
# layer of QUICK_LAYERS where nothing did.
QUICK_LAYERS = ("lang", "plan", "backends/cuda", "backends/wgsl", "runtime", "cli", "golden", "equivalence",
                "docs")
QUICK = [
    "tests/lang/*", "tests/plan/*", "tests/golden/*", "tests/runtime/*", "tests/cli/*",
    "tests/backends/cuda/*", "tests/backends/wgsl/*", "tests/docs/*", "tests/hf/test_from_hf.py::*",
    # equivalence: the float64 reference itself, and the key-warp plans (GPU runs skip here)
    "tests/equivalence/test_reference.py::*", "tests/equivalence/test_reference_expr.py::*",
    "tests/equivalence/test_key_warps.py::*",
    # the pure functions of the distributed module (no ranks started)
    "tests/distributed/test_ring.py::test_packed_pieces", "tests/distributed/test_ring.py::test_zigzag_shards",
    "tests/distributed/test_ring.py::test_window_blocks_cover_exactly_the_window*",
    "tests/distributed/test_ring.py::test_unsupported_inputs_are_refused_before_any_communication",
]
QUICK_EXCEPT = [
    # NVRTC compile checks: QUICK_PICKS keeps a few
    "tests/backends/cuda/test_nvrtc.py::test_*_compile[*",
    "tests/backends/cuda/test_spills.py::test_default_plan_does_not_spill[*",
    "tests/backends/cuda/test_sass.py::test_hgmma_in_the_hot_loop[*",
    "tests/backends/cuda/test_head_dims.py::test_compiles[*",
    "tests/backends/cuda/test_head_dims.py::test_two_pass_chunked_compiles[*",
    "tests/backends/cuda/test_backward_source.py::test_backward_compiles[*",
    # the backward's CPU emulation (g++ and 256 threads per block): one test stays
    "tests/backends/cuda/test_backward_emulated.py::test_kv_lens_with_inf_and_nan_past_them",
    "tests/backends/cuda/test_backward_emulated.py::test_packed_sequences",
    "tests/backends/cuda/test_backward_emulated.py::test_custom_masks",
    "tests/backends/cuda/test_backward_emulated.py::test_grad_inputs_summed_through_partials[*",
    # the mma family's emulation (one test stays) and the new kernels' nvcc / NVRTC compiles
    "tests/backends/cuda/test_backward_mma_emulated.py::test_head_dims_masks_gqa_and_lengths",
    "tests/backends/cuda/test_backward_mma_emulated.py::test_kv_lens_packed_and_rows_that_see_no_key",
    "tests/backends/cuda/test_backward_expr_source.py::test_expression_backward_compiles[*",
    "tests/backends/cuda/test_backward_wide_source.py::test_it_compiles_for_sm_90a[*",
    # quantized caches' kernels on the CPU emulation (QUICK_PICKS keeps two)
    "tests/backends/cuda/test_kvquant_emulated.py::*",
    # lavapipe runs of large or many kernels
    "tests/backends/wgsl/test_wgsl_backend.py::test_prefetch_matches_the_plain_copies[*",
    "tests/backends/wgsl/test_wgsl_backend.py::test_runtime_checks_do_not_change_results[*",
    "tests/backends/wgsl/test_wgsl_hardening.py::test_too_many_splits_for_a_software_adapter_says_so",
    "tests/backends/wgsl/test_register_tiling.py::test_small_budget_plans_match_the_reference[*",
    "tests/backends/wgsl/test_register_tiling.py::test_sub_block_matches_reference[*",
    "tests/backends/wgsl/test_head_dims_wgsl.py::test_matches_reference[*",
    "tests/backends/wgsl/test_wgsl_variants.py::test_*_over_packed_sequences[*",
    # tune's sweeps; the XDG check in four subprocesses; the README's kernel runs and precompile
    "tests/cli/test_tune.py::test_tune_stores_the_fastest_and_compile_uses_it",
    "tests/cli/test_tune.py::test_tune_keeps_the_target_options_it_does_not_sweep",
    "tests/cli/test_tune.py::test_each_candidate_is_labelled_by_what_differs_between_the_plans",
    "tests/cli/test_quiet_wgsl.py::test_no_xdg_runtime_dir_complaint[*",
    "tests/docs/test_readme.py::test_readme_command[*attngen run *",
    "tests/docs/test_readme.py::test_readme_command[*attngen precompile *",
]
QUICK_PICKS = [
    "tests/backends/cuda/test_nvrtc.py::test_examples_compile[llama3_8b_prefill-*",
    "tests/backends/cuda/test_nvrtc.py::test_variants_compile[f16 d8 causal-cuda-sm80-sm_80]",
    "tests/backends/cuda/test_spills.py::test_default_plan_does_not_spill[llama3_8b_prefill-cuda-sm90-nvrtc]",
    "tests/backends/cuda/test_sass.py::test_hgmma_in_the_hot_loop[llama3_8b_prefill]",
    "tests/backends/cuda/test_backward_source.py::test_backward_compiles[f16 d64 causal-cuda-sm80-sm_80]",
    "tests/backends/cuda/test_kvquant_emulated.py::test_quantized_cache_matches_the_reference[split_kv(2)-paged-e5m2]",
    "tests/backends/cuda/test_kvquant_emulated.py::test_the_fused_append_writes_the_bytes_quantize_rows_gives[split_kv(2)-contiguous-i8]",
    "tests/backends/wgsl/test_register_tiling.py::test_sub_block_matches_reference[4x4-subgroups]",
    "tests/backends/wgsl/test_head_dims_wgsl.py::test_matches_reference[d8-f32-tile-d8-causal]",
    "tests/backends/wgsl/test_wgsl_variants.py::test_split_schedules_over_packed_sequences[whole-split_kv(2)]",
    "tests/cli/test_quiet_wgsl.py::test_no_xdg_runtime_dir_complaint[None]",
    # a few specs on the live adapter against the reference
    "tests/equivalence/test_equivalence.py::test_examples[llama3_8b_prefill-wgsl]",
    "tests/equivalence/test_equivalence.py::test_examples[phi35_mini-wgsl]",
    "tests/equivalence/test_equivalence.py::test_rows_that_see_no_key[wgsl]",
    "tests/equivalence/test_equivalence.py::test_output_is_fully_written[wgsl]",
    "tests/equivalence/test_variants.py::test_schedules[1-8-2-none-*-wgsl]",
    "tests/equivalence/test_variants.py::test_paged[1-wgsl]",
    "tests/equivalence/test_variants.py::test_custom_mask[additive-wgsl]",
    "tests/equivalence/test_variants.py::test_append[paged-wgsl]",
    # the decode kernel (issue 44): its plans and sources, and one run of each storage on the live adapter
    "tests/equivalence/test_wgsl_decode.py::test_decode_on_is_refused_where_it_does_not_apply[*",
    "tests/equivalence/test_wgsl_decode.py::test_the_shape_on_the_h100_profile[*",
    "tests/equivalence/test_wgsl_decode.py::test_the_main_loop_touches_no_workgroup_memory[*",
    "tests/equivalence/test_wgsl_decode.py::test_every_byte_decodes_as_the_reference_decodes_it[*",
    "tests/equivalence/test_wgsl_decode.py::test_the_decode_kernel_matches_the_reference[f16-i8-masknone-*",
    # random score and mask expressions on the live adapter (a handful, the same every run)
    "tests/equivalence/test_expr_fuzz.py::*",
]


@functools.lru_cache(maxsize=None)
def _pattern(p: str) -> re.Pattern:
    return re.compile(".*".join(re.escape(part) for part in p.split("*")), re.S)


def in_quick_tier(nodeid: str) -> bool:
    return (_matches(nodeid, QUICK) and not _matches(nodeid, QUICK_EXCEPT)) or _matches(nodeid, QUICK_PICKS)


# ---- the second pass, on Dawn (scripts/test.sh: ATTNGEN_WGPU=wgpudawn ... -k wgsl --tint-pass) ----
# The pass is there for Tint: the WGSL the runtime compiles goes through Dawn's compiler instead of
# naga, and runs on SwiftShader. Tint's compile of every module the first pass ran is checked
# without it (scripts/test.sh records them, scripts/tint_check.py compiles each on Dawn's null
# backend, in seconds), so this pass is for Tint's code and its results: the runtime on Dawn, the
# numerics (inf, NaN, creeping maxima, softcap), hidden keys, every byte of the quantized formats,
# and a sample of each family of kernels (TINT_PASS_SAMPLED / TINT_PASS_SAMPLE).
# Left out of it are the tests whose outcome does not depend on the WGSL compiler: those that only
# plan and emit (no device: the same bytes as in the first pass), and runs whose kernels other
# tests of the pass already send through Tint, where what the test adds is the runtime's own (the
# command line, the environment), which the first pass checks.
TINT_PASS_EXCEPT = [
    # quantized caches on Dawn: the decode kernel's and the fused schedule's appends (every kv_dtype and
    # layout) and the split_kv / fused reads keep running there; the two_pass schedule's and the
    # register-tiled split_kv appends, the same quantizer (quant_encode.j2) in other loops, run on lavapipe
    # only (a minute of the pass: the full command's 15 minutes)
    "tests/equivalence/test_wgsl_kv_quant.py::test_the_append_writes_the_bytes_quantize_rows_gives[two_pass-*",
    "tests/equivalence/test_wgsl_kv_quant.py::test_the_append_writes_the_bytes_quantize_rows_gives[split_kv(4)-*",
    "tests/equivalence/test_wgsl_kv_quant.py::test_quantized_cache_matches_the_reference[two_pass-*",
    # the WGSL backward on Dawn: its module compiles through Tint in test_backward_emit.py, and these
    # keep running there: a structured mask with softcap and scale in f16, a custom mask, packed
    # sequences (the rest, 2 minutes of the pass, runs on lavapipe only)
    "tests/equivalence/test_backward_wgsl.py::test_matches_reference[plain*",
    "tests/equivalence/test_backward_wgsl.py::test_matches_reference[causal*",
    "tests/equivalence/test_backward_wgsl.py::test_matches_reference[bottom-right*",
    "tests/equivalence/test_backward_wgsl.py::test_matches_reference[unequal*",
    "tests/equivalence/test_backward_wgsl.py::test_matches_reference[softcap-large*",
    "tests/equivalence/test_backward_wgsl.py::test_matches_reference[window-left-only*",
    "tests/equivalence/test_backward_wgsl.py::test_matches_reference[window-softcap-scale-f32]",
    "tests/equivalence/test_backward_wgsl.py::test_f16_packed_in_words*",
    "tests/equivalence/test_backward_wgsl.py::test_kv_lens", "tests/equivalence/test_backward_wgsl.py::test_custom_mask[additive]",
    "tests/equivalence/test_backward_wgsl.py::test_packed_sequences[window*",
    "tests/equivalence/test_backward_wgsl.py::test_deterministic_and_on_device_tensors",
    "tests/equivalence/test_backward_wgsl.py::test_bad_inputs_are_refused",
    "tests/equivalence/test_backward_wgsl.py::test_paged_specs_have_no_backward",
    "tests/equivalence/test_backward_wgsl.py::test_split_schedule_forward",
    "tests/equivalence/test_backward_wgsl.py::test_loops_cut_short_by_the_software_adapter_are_refused",
    # plan and emit only
    "tests/backends/wgsl/test_manifest_schema.py::*", "tests/backends/wgsl/test_manifest_values.py::*",
    "tests/backends/wgsl/test_subgroup_sizes.py::*", "tests/backends/wgsl/test_unroll.py::*",
    "tests/cli/test_directories.py::*", "tests/cli/test_cli.py::test_build_cuda_and_wgsl_source",
    "tests/fuzz/test_property.py::*",
    "tests/equivalence/test_wgsl_decode.py::test_decode_on_is_refused_where_it_does_not_apply[*",
    "tests/equivalence/test_wgsl_decode.py::test_the_shape_on_the_h100_profile[*",
    "tests/equivalence/test_wgsl_decode.py::test_the_main_loop_touches_no_workgroup_memory[*",
    "tests/equivalence/test_wgsl_decode.py::test_subgroups_off_and_auto_choices",
    # quantized caches: refusals made on the host, `attngen run`'s made-up cache (its kernels are
    # test_quantized_cache_matches_the_reference's), resident against host caches (the runtime's
    # uploads, not the compiler): lavapipe only
    "tests/equivalence/test_wgsl_kv_quant.py::test_bad_calls_are_launch_errors_naming_the_argument[*",
    "tests/equivalence/test_wgsl_kv_quant.py::test_attngen_run_quantizes_the_cache_it_makes_up[*",
    "tests/equivalence/test_wgsl_decode.py::test_resident_caches_give_the_host_caches_results[*",
    # `attngen run` of whisper_large_v3_cross: its module goes through Tint in scripts/tint_check.py
    # (the first pass runs it), the timing on Dawn in test_gpu_timing.py; SwiftShader's timestamps read ~0 ms, so each timed call repeats
    # the kernel 64 times: 60-85 s of the pass
    "tests/cli/test_cli.py::test_run_wgsl_against_the_reference",
    # the XDG_RUNTIME_DIR values: the runtime's environment, set before any device exists; one run
    # on Dawn stays, with the variable unset (vit_b16's kernel: test_examples[vit_b16-wgsl])
    "tests/cli/test_quiet_wgsl.py::test_no_xdg_runtime_dir_complaint[]",
    "tests/cli/test_quiet_wgsl.py::test_no_xdg_runtime_dir_complaint[relative/dir]",
    "tests/cli/test_quiet_wgsl.py::test_no_xdg_runtime_dir_complaint[/nonexistent/attngen-xdg]",
    # `grad` inputs' sums: the partials' source (grad_partials_add, the grads entry) and the direct
    # one go through Tint in the cases that stay (mixed-direct-and-partials, hkv-g3; the full bias
    # f32-113x7-g3; two reads through a sigmoid); the others differ in their index expressions and
    # shapes only (t5-log and h-f32-causal-g3: TINT_PASS_SAMPLED below)
    "tests/equivalence/test_wgsl_grad_tables.py::test_gradient_summed_over_pairs_matches_reference[table-*",
    "tests/equivalence/test_wgsl_grad_tables.py::test_gradient_summed_over_pairs_matches_reference[alibi-*",
    "tests/equivalence/test_wgsl_grad_tables.py::test_gradient_summed_over_pairs_matches_reference[bias-without-b]",
    "tests/equivalence/test_wgsl_grad_inputs.py::test_full_bias_gradient_matches_reference[f16-7x113-causal]",
    "tests/equivalence/test_wgsl_grad_inputs.py::test_full_bias_gradient_matches_reference[f32-1x1]",
    # refusals made on the host before any dispatch (a LaunchError from the call's arguments, or a
    # backward the checker refuses): the same Python on either runtime, so the first pass decides
    # them; what they compile first is compiled by other tests of this pass (nineteenth session)
    "tests/equivalence/test_variants.py::test_bad_input[*-wgsl]",
    "tests/equivalence/test_variants.py::test_bad_paged_input[*-wgsl]",
    "tests/equivalence/test_variants.py::test_bad_cu_seqlens[*-wgsl]",
    "tests/equivalence/test_variants.py::test_append_needs_room[wgsl]",
    "tests/equivalence/test_wgsl_kv_quant.py::test_a_quantized_cache_has_no_backward",
    "tests/equivalence/test_wgsl_kv_quant.py::test_a_scale_on_a_kernel_without_kv_dtype_is_refused",
    "tests/equivalence/test_wgsl_decode.py::test_resident_scales_are_checked_for_shape_and_dtype",
    "tests/equivalence/test_wgsl_decode.py::test_byte_tensors_are_only_a_quantized_caches",
    "tests/equivalence/test_wgsl_expr_backward.py::test_backward_keywords_beyond_the_options_are_refused",
    "tests/equivalence/test_wgsl_inputs.py::test_bad_inputs_are_launch_errors_that_name_them",
    "tests/backends/wgsl/test_wgsl_variants.py::test_block_mask_for_other_tiles_is_refused",
    "tests/backends/wgsl/test_wgsl_hardening.py::test_device_inputs_with_a_numpy_out_are_refused",
    # the patterns of these lists against a `pytest --collect-only` of the pass's directories (a
    # subprocess; no device): the first pass runs it
    "tests/backends/wgsl/test_tint_check.py::test_every_pattern_of_the_dawn_pass_names_a_test",
]


# Families of kernels of which the Dawn pass runs a sample (TINT_PASS_SAMPLE): the others of the
# family run on lavapipe, and their modules go through Tint in scripts/tint_check.py. (The pass took
# 9 minutes of the full command's 15 with every family whole, 2026-11-28.) The pass's time is
# SwiftShader building pipelines (about a CPU-second each, 82% of the pass's CPU time; Tint itself
# is under 1%), so a sample leaves out kernels, not shapes: each test function keeps at least one
# case on Dawn, and where a family's cases differ in a mask, a schedule or a dtype, the sample
# keeps each of those at least once across it (nineteenth session, branch ci-time2: the families
# from test_planted_keys down were whole until then).
TINT_PASS_SAMPLED = [
    "tests/equivalence/test_equivalence.py::test_examples[*-wgsl]",
    "tests/equivalence/test_equivalence.py::test_variants[*-wgsl]",
    "tests/equivalence/test_wgsl_kv_quant.py::test_quantized_cache_matches_the_reference[*",
    "tests/equivalence/test_wgsl_kv_quant.py::test_the_append_writes_the_bytes_quantize_rows_gives[*",
    "tests/equivalence/test_wgsl_kv_quant.py::test_an_append_to_resident_tensors_writes_them_in_place[*",
    "tests/equivalence/test_wgsl_decode.py::test_the_decode_kernel_matches_the_reference[*",
    "tests/backends/wgsl/test_head_dims_wgsl.py::test_matches_reference[*",
    "tests/backends/wgsl/test_register_tiling.py::test_sub_block_matches_reference[*",
    "tests/backends/wgsl/test_register_tiling.py::test_small_budget_plans_match_the_reference[*",
    "tests/backends/wgsl/test_wgsl_backend.py::test_matches_reference[*",
    "tests/backends/wgsl/test_wgsl_backend.py::test_prefetch_matches_the_plain_copies[*",
    "tests/backends/wgsl/test_wgsl_variants.py::test_split_schedules_over_packed_sequences[*",
    "tests/backends/wgsl/test_wgsl_variants.py::test_custom_mask_split_schedules_over_packed_sequences[*",
    "tests/equivalence/test_variants.py::test_schedules[*",
    "tests/equivalence/test_variants.py::test_kv_lens[*",
    "tests/equivalence/test_variants.py::test_packed_documents[*",
    "tests/equivalence/test_wgsl_expr.py::test_mask_expressions[*",
    "tests/equivalence/test_wgsl_expr_tiles.py::test_forward_with_skipped_and_full_tiles_matches_the_reference[*",
    "tests/equivalence/test_wgsl_expr_backward.py::test_matches_reference[*",
    "tests/equivalence/test_wgsl_expr_backward.py::test_inputs_match_reference[*",
    "tests/equivalence/test_wgsl_inputs.py::test_the_issues_examples[*",
    # Dawn keeps its runtime checks whatever the profile asks (devices.create_module): both of
    # the test's runs would be the same module
    "tests/backends/wgsl/test_wgsl_backend.py::test_runtime_checks_do_not_change_results[*",
    # whole until the nineteenth session
    "tests/equivalence/test_hidden_keys.py::test_planted_keys[*-wgsl]",
    "tests/equivalence/test_numerics.py::test_a_row_max_that_creeps_up_or_jumps_keeps_the_answer[*-wgsl]",
    "tests/equivalence/test_numerics.py::test_softcap_holds_over_its_whole_range[*-wgsl]",
    "tests/equivalence/test_expression_examples.py::test_index_only_examples_on_wgsl[*",
    "tests/equivalence/test_wgsl_expr_tiles.py::test_backward_with_skipped_and_full_blocks_matches_the_reference[*",
    "tests/equivalence/test_variants.py::test_schedules_over_paged_cache[*-wgsl]",
    "tests/equivalence/test_variants.py::test_a_cache_wide_mask_over_a_paged_cache_with_junk_past_the_pages[*-wgsl]",
    "tests/equivalence/test_variants.py::test_custom_mask_with_split_schedules[*-wgsl]",
    "tests/equivalence/test_wgsl_expr.py::test_score_expressions[*",
    "tests/equivalence/test_wgsl_grad_tables.py::test_gradient_summed_over_pairs_matches_reference[*",
    "tests/equivalence/test_wgsl_grad_inputs.py::test_full_bias_gradient_matches_reference[*",
    "tests/equivalence/test_wgsl_inputs.py::test_reads_the_language_keeps_in_bounds_are_not_flagged[*",
    "tests/equivalence/test_wgsl_inputs.py::test_split_schedules[*",
    "tests/equivalence/test_wgsl_decode.py::test_a_visible_key_whose_weight_underflows_adds_nothing_whatever_its_v[*",
    "tests/equivalence/test_wgsl_decode.py::test_appends_land_in_the_cache_and_are_attended_to[*",
    "tests/backends/wgsl/test_wgsl_hardening.py::test_a_nan_with_the_markers_bits_is_nan_out_not_an_error[*",
    "tests/backends/wgsl/test_wgsl_variants.py::test_block_mask_shader_matches_the_oracle[*",
    "tests/backends/wgsl/test_wgsl_variants.py::test_custom_mask_split_schedules_append[*",
    "tests/backends/wgsl/test_wgsl_variants.py::test_append_to_a_cache_on_the_gpu[*",
]
TINT_PASS_SAMPLE = [
    # the examples: a prefill with GQA and soft-capping, a two-pass decode. (Llama-3-8B's prefill
    # runs on Dawn as test_design_example, the same GQA 32/8 causal f16 kernel with softcap and
    # tiles given; vit_b16's kernel as test_no_xdg_runtime_dir_complaint[None], whose `attngen run`
    # holds it to the tolerance.)
    "tests/equivalence/test_equivalence.py::test_examples[gemma2_9b_global-wgsl]",
    "tests/equivalence/test_equivalence.py::test_examples[llama3_8b_decode_two_pass-wgsl]",
    # f16 accumulators (skipped where the adapter has no shader-f16: SwiftShader), unequal head dims
    # with softcap, a window (bottom-right causal: test_matches_reference[f32-d96-bottom-right-*],
    # test_planted_keys, the creeping maxima below)
    "tests/equivalence/test_equivalence.py::test_variants[f16 acc f16-wgsl]",
    "tests/equivalence/test_equivalence.py::test_variants[f16 192/128 softcap-wgsl]",
    "tests/equivalence/test_equivalence.py::test_variants[f16 d72 window-wgsl]",
    # quantized caches: each format once, both kernels (split_kv, the decode kernel), both layouts
    "tests/equivalence/test_wgsl_kv_quant.py::test_quantized_cache_matches_the_reference[split_kv(4) decode-contiguous-e4m3]",
    "tests/equivalence/test_wgsl_kv_quant.py::test_quantized_cache_matches_the_reference[split_kv(4)-paged-i8]",
    "tests/equivalence/test_wgsl_kv_quant.py::test_quantized_cache_matches_the_reference[split_kv(4)-contiguous-e5m2]",
    "tests/equivalence/test_wgsl_kv_quant.py::test_the_append_writes_the_bytes_quantize_rows_gives[fused-paged-i8]",
    "tests/equivalence/test_wgsl_kv_quant.py::test_the_append_writes_the_bytes_quantize_rows_gives[split_kv(4) decode-contiguous-e4m3]",
    "tests/equivalence/test_wgsl_kv_quant.py::test_an_append_to_resident_tensors_writes_them_in_place[split_kv(4) decode-i8]",
    # the decode kernel: f16 words (paged, bottom-right), e4m3 (a window), f32 storage with e5m2
    # (paged); its i8 decode runs in test_every_byte_decodes_as_the_reference_decodes_it[i8] and
    # test_i8_by_unpack4xi8_decodes_every_byte_too, whole on Dawn
    "tests/equivalence/test_wgsl_decode.py::test_the_decode_kernel_matches_the_reference[f16packed-*",
    "tests/equivalence/test_wgsl_decode.py::test_the_decode_kernel_matches_the_reference[f16-e4m3-*",
    "tests/equivalence/test_wgsl_decode.py::test_the_decode_kernel_matches_the_reference[f32-e5m2-*",
    "tests/backends/wgsl/test_head_dims_wgsl.py::test_matches_reference[d160-f16-causal]",
    "tests/backends/wgsl/test_head_dims_wgsl.py::test_matches_reference[192-128-f32-tile-d64]",
    # register tiles: 4x2 with subgroups, 8x2 on the core profile (without)
    "tests/backends/wgsl/test_register_tiling.py::test_sub_block_matches_reference[4x2-subgroups]",
    "tests/backends/wgsl/test_register_tiling.py::test_sub_block_matches_reference[8x2-webgpu-core]",
    # (subgroups on: test_subgroup_and_workgroup_reductions_agree and the 4x2-subgroups tiles)
    "tests/backends/wgsl/test_wgsl_backend.py::test_matches_reference[f32-d96-bottom-right-softcap-scale]",
    "tests/backends/wgsl/test_wgsl_backend.py::test_matches_reference[f16-d128-none-gqa7-webgpu-core]",
    "tests/backends/wgsl/test_wgsl_backend.py::test_matches_reference[f32-d8-window-left0]",
    "tests/backends/wgsl/test_wgsl_backend.py::test_matches_reference[f16-d64-huge-window]",
    "tests/backends/wgsl/test_wgsl_backend.py::test_prefetch_matches_the_plain_copies[head_dim 64*",
    "tests/backends/wgsl/test_wgsl_variants.py::test_split_schedules_over_packed_sequences[whole-split_kv(2)]",
    "tests/backends/wgsl/test_wgsl_variants.py::test_split_schedules_over_packed_sequences[v-blocks-two_pass]",
    "tests/backends/wgsl/test_wgsl_variants.py::test_custom_mask_split_schedules_over_packed_sequences[tile-d-two_pass]",
    # split_kv(auto) over a window (GQA 1), two_pass with bottom-right causal over 13 rows (GQA 4),
    # split_kv(auto) with GQA 7 and 8/2 (one kernel)
    "tests/equivalence/test_variants.py::test_schedules[1-4-4-window(left=50)-split_kv(auto)-wgsl]",
    "tests/equivalence/test_variants.py::test_schedules[13-8-2-causal(bottom_right)-two_pass-wgsl]",
    "tests/equivalence/test_variants.py::test_schedules[1-7-1-none-split_kv(auto)-wgsl]",
    "tests/equivalence/test_variants.py::test_schedules[1-8-2-none-split_kv(auto)-wgsl]",
    "tests/equivalence/test_variants.py::test_kv_lens[window(left=20)-wgsl]",
    "tests/equivalence/test_variants.py::test_packed_documents[causal-wgsl]",
    "tests/equivalence/test_wgsl_expr.py::test_mask_expressions[2d neighbourhood-f16]",
    "tests/equivalence/test_wgsl_expr.py::test_mask_expressions[negative floor-f32]",
    # (the `heads` mask: test_forward_with_skipped_and_full_tiles_matches_the_reference[heads-])
    "tests/equivalence/test_wgsl_expr_tiles.py::test_forward_with_skipped_and_full_tiles_matches_the_reference[heads-]",
    "tests/equivalence/test_wgsl_expr_tiles.py::test_forward_with_skipped_and_full_tiles_matches_the_reference[2d neighbourhood-]",
    # (alibi's slopes in a backward: test_inputs_match_reference[documents-and-alibi])
    "tests/equivalence/test_wgsl_expr_backward.py::test_matches_reference[tanh-cap-113]",
    "tests/equivalence/test_wgsl_expr_backward.py::test_matches_reference[2d-neighbourhood]",
    "tests/equivalence/test_wgsl_expr_backward.py::test_inputs_match_reference[documents-and-alibi]",
    "tests/equivalence/test_wgsl_inputs.py::test_the_issues_examples[documents-f16]",
    "tests/equivalence/test_wgsl_inputs.py::test_the_issues_examples[swin-f16]",
    # hidden keys: each mask once (custom: bool and additive, one kernel), each schedule once
    "tests/equivalence/test_hidden_keys.py::test_planted_keys[causal-fused-wgsl]",
    "tests/equivalence/test_hidden_keys.py::test_planted_keys[causal(bottom_right)-two_pass-wgsl]",
    "tests/equivalence/test_hidden_keys.py::test_planted_keys[window(left=9, right=3)-split_kv(3)-wgsl]",
    "tests/equivalence/test_hidden_keys.py::test_planted_keys[custom bool-split_kv(3)-wgsl]",
    "tests/equivalence/test_hidden_keys.py::test_planted_keys[custom additive-split_kv(3)-wgsl]",
    # creeping and jumping maxima: every ramp, on one kernel (the WGSL kernels rescale at every new
    # maximum, in every schedule: the ramps are the CUDA kernels' slack; the split kernel also
    # combines the splits' maxima)
    "tests/equivalence/test_numerics.py::test_a_row_max_that_creeps_up_or_jumps_keeps_the_answer[*-split_kv(3)-none-f16-wgsl]",
    # softcap: both ends of its range (tanh of huge and of tiny arguments)
    "tests/equivalence/test_numerics.py::test_softcap_holds_over_its_whole_range[1e-12-wgsl]",
    "tests/equivalence/test_numerics.py::test_softcap_holds_over_its_whole_range[1000000000000.0-wgsl]",
    # (a tanh score: test_score_expressions[tanh cap-f16])
    "tests/equivalence/test_expression_examples.py::test_index_only_examples_on_wgsl[neighbourhood_2d_w64_r7]",
    "tests/equivalence/test_wgsl_expr_tiles.py::test_backward_with_skipped_and_full_blocks_matches_the_reference[k <= q && q - k < 40]",
    "tests/equivalence/test_wgsl_expr_tiles.py::test_backward_with_skipped_and_full_blocks_matches_the_reference[abs(q // 8 - k // 8) <= 1 && abs(q % 8 - k % 8) <= 1]",
    # paged caches with split schedules: split_kv(4) here, two_pass in the cache-wide mask's
    "tests/equivalence/test_variants.py::test_schedules_over_paged_cache[split_kv(4)-wgsl]",
    "tests/equivalence/test_variants.py::test_a_cache_wide_mask_over_a_paged_cache_with_junk_past_the_pages[two_pass-wgsl]",
    # (custom masks with two_pass: test_custom_mask_split_schedules_over_packed_sequences above)
    "tests/equivalence/test_variants.py::test_custom_mask_with_split_schedules[*-split_kv(3)-wgsl]",
    "tests/equivalence/test_wgsl_expr.py::test_score_expressions[distance bias-f16]",
    "tests/equivalence/test_wgsl_expr.py::test_score_expressions[mixed-f32]",
    "tests/equivalence/test_wgsl_expr.py::test_score_expressions[tanh cap-f16]",
    "tests/equivalence/test_wgsl_grad_tables.py::test_gradient_summed_over_pairs_matches_reference[hkv-g3]",
    "tests/equivalence/test_wgsl_grad_tables.py::test_gradient_summed_over_pairs_matches_reference[mixed-direct-and-partials]",
    "tests/equivalence/test_wgsl_grad_inputs.py::test_full_bias_gradient_matches_reference[f32-113x7-g3]",
    "tests/equivalence/test_wgsl_inputs.py::test_reads_the_language_keeps_in_bounds_are_not_flagged[mask k <= q*",
    "tests/equivalence/test_wgsl_inputs.py::test_reads_the_language_keeps_in_bounds_are_not_flagged[score s + tab*",
    "tests/equivalence/test_wgsl_inputs.py::test_split_schedules[two_pass]",
    "tests/equivalence/test_wgsl_decode.py::test_a_visible_key_whose_weight_underflows_adds_nothing_whatever_its_v[f16-causal(bottom_right)]",
    "tests/equivalence/test_wgsl_decode.py::test_a_visible_key_whose_weight_underflows_adds_nothing_whatever_its_v[f32-none]",
    "tests/equivalence/test_wgsl_decode.py::test_appends_land_in_the_cache_and_are_attended_to[f16-paged]",
    "tests/equivalence/test_wgsl_decode.py::test_appends_land_in_the_cache_and_are_attended_to[f32-contiguous]",
    # a NaN with the markers' bits in q, k and v: f32 fused, f16 two_pass
    "tests/backends/wgsl/test_wgsl_hardening.py::test_a_nan_with_the_markers_bits_is_nan_out_not_an_error[f32-v]",
    "tests/backends/wgsl/test_wgsl_hardening.py::test_a_nan_with_the_markers_bits_is_nan_out_not_an_error[f32-k]",
    "tests/backends/wgsl/test_wgsl_hardening.py::test_a_nan_with_the_markers_bits_is_nan_out_not_an_error[f32-q]",
    "tests/backends/wgsl/test_wgsl_hardening.py::test_a_nan_with_the_markers_bits_is_nan_out_not_an_error[f16-two_pass-*",
    "tests/backends/wgsl/test_wgsl_variants.py::test_block_mask_shader_matches_the_oracle[shape0-*",
    "tests/backends/wgsl/test_wgsl_variants.py::test_block_mask_shader_matches_the_oracle[shape1-*",
    "tests/backends/wgsl/test_wgsl_variants.py::test_block_mask_shader_matches_the_oracle[shape3-*",
    "tests/backends/wgsl/test_wgsl_variants.py::test_custom_mask_split_schedules_append[split_kv(2)]",
    "tests/backends/wgsl/test_wgsl_variants.py::test_append_to_a_cache_on_the_gpu[paged]",
]


def in_tint_pass(nodeid: str) -> bool:
    return not _matches(nodeid, TINT_PASS_EXCEPT) and (
        not _matches(nodeid, TINT_PASS_SAMPLED) or _matches(nodeid, TINT_PASS_SAMPLE))


def _matches(nodeid: str, patterns) -> bool:
    return any(_pattern(p).fullmatch(nodeid) for p in patterns)


def pytest_collection_modifyitems(config, items):
    if config.getoption("--quick"):
        keep = [item for item in items if in_quick_tier(item.nodeid)]
    elif config.getoption("--tint-pass"):
        keep = [item for item in items if in_tint_pass(item.nodeid)]
    else:
        return
    kept = set(map(id, keep))
    dropped = [item for item in items if id(item) not in kept]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def _layer(nodeid: str) -> str:
    parts = nodeid.split("::")[0].split("/")
    return "/".join(parts[1:3]) if len(parts) > 2 and parts[1] == "backends" else parts[1] if len(parts) > 1 else "?"


def pytest_terminal_summary(terminalreporter, config):
    """The quick tier says what ran in each layer (and where nothing did)."""
    if not config.getoption("--quick"):
        return
    counts: dict = {}
    for outcome in ("passed", "failed", "skipped", "error"):
        for rep in terminalreporter.stats.get(outcome, []):
            if getattr(rep, "when", "call") in ("call", "setup") and (outcome != "passed" or rep.when == "call"):
                c = counts.setdefault(_layer(rep.nodeid), {})
                c[outcome] = c.get(outcome, 0) + 1
    if not counts:
        return
    tr = terminalreporter
    tr.section("the quick tier, by layer")
    for layer in sorted(counts):
        tr.write_line(f"{layer:15} " + ", ".join(f"{n} {k}" for k, n in sorted(counts[layer].items())))
    idle = [layer for layer in QUICK_LAYERS if not counts.get(layer, {}).get("passed")]
    if idle:
        tr.write_line(f"no test passed in: {', '.join(idle)}", red=True)


@pytest.fixture
def update_golden(request):
    return request.config.getoption("--update-golden")


@functools.lru_cache(maxsize=1)
def cuda_available() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


@functools.lru_cache(maxsize=1)
def wgsl_available() -> bool:
    try:
        from attngen.backends import wgsl
        wgsl.device()
        return True
    except Exception:
        return False


def require(target: str):
    if target == "cuda" and not cuda_available():
        pytest.skip("no CUDA GPU with CuPy here (the GPU machine runs these)")
    if target == "wgsl" and not wgsl_available():
        pytest.skip("no wgpu adapter here")


def example_specs():
    """(file, spec) for every block of every examples/*.attn file."""
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "examples", "*.attn"))):
        for spec in attngen.parse(open(path).read(), path):
            out.append((os.path.basename(path), spec))
    return out


def spec_of(body: str, name: str = "t") -> attngen.AttentionSpec:
    return attngen.parse(f"attention {name} {{\n" + body.strip() + "\n}\n")[0]


NP_DTYPE = {"f16": np.float16, "f32": np.float32, "bf16": np.float32}


def random_qkv(spec, batch, len_q, len_k, heads_q=None, heads_kv=None, seed=0, scale=1.0):
    """Random normal q, k, v (never zeros) as float32 numpy arrays; heads from the spec."""
    rng = np.random.default_rng(seed)
    hq = heads_q or spec.heads_q or 4
    hkv = heads_kv or spec.heads_kv or (hq // 2 if hq % 2 == 0 else hq)
    q = rng.standard_normal((batch, len_q, hq, spec.head_dim_qk)).astype(np.float32) * scale
    k = rng.standard_normal((batch, len_k, hkv, spec.head_dim_qk)).astype(np.float32) * scale
    v = rng.standard_normal((batch, len_k, hkv, spec.head_dim_v)).astype(np.float32)
    return q, k, v


def to_device(target, dtype, *arrays):
    """numpy float32 arrays -> what the target's kernel takes in `dtype`."""
    if target == "wgsl":
        return [a.astype(NP_DTYPE[dtype]) for a in arrays]
    if dtype == "bf16":
        import torch
        return [torch.from_numpy(a).cuda().to(torch.bfloat16) for a in arrays]
    import cupy
    return [cupy.asarray(a.astype(NP_DTYPE[dtype])) for a in arrays]


def _to_numpy(x):
    from attngen.reference import to_numpy
    return np.asarray(to_numpy(x), dtype=np.float64)


# ---- NVRTC compile checks: each source once --------------------------------------------------
def code_lines(source: str) -> str:
    """`source` without its lines that are wholly a // comment (none ending in a backslash, which
    would splice the next line into the comment): what a C++ compiler sees of it, less line numbers."""
    return "\n".join(line for line in source.split("\n")
                     if not (line.lstrip().startswith("//") and not line.endswith("\\")))


def nvrtc_compile(source: str, arch: str) -> tuple[bytes, str]:
    """NVRTC's (cubin, log) of `source` for `arch`, the log with ptxas's resource report of every
    entry point (attngen.backends.cuda.nvrtc.compile_cubin with report=True; the cubin then also
    holds its empty attngen_report_* kernel). Several tests compile-check the same source (every
    example: test_nvrtc.py that it builds without a warning, test_spills.py its report,
    test_sass.py its SASS), and each compile takes seconds: the suite compiles each (source, arch)
    once into its own cache directory, which the pytest-xdist workers share, under a lock per
    source so that two workers never compile the same one. The key leaves out the lines that are
    wholly // comments (code_lines): the source's header prints the spec, so specs that differ only
    where the code does not (a tile given that equals the default, heads that only the header names)
    give sources that compile alike, and the suite compiles those once too."""
    import fcntl
    import hashlib
    import json
    from attngen.backends.cuda import nvrtc
    code = source if nvrtc.key_extra() else code_lines(source)  # (-lineinfo: line numbers count)
    key = hashlib.sha256(json.dumps([code, arch, nvrtc.OPTIONS, nvrtc.key_extra(),
                                     list(nvrtc.version())]).encode()).hexdigest()
    folder = os.path.join(os.environ["ATTNGEN_CACHE_DIR"], "tests-nvrtc")
    os.makedirs(folder, exist_ok=True)
    base = os.path.join(folder, key)
    with open(base + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(base + ".log"):
            cubin, log = nvrtc.compile_cubin(source, arch, report=True)
            for suffix, data in ((".cubin", cubin), (".log", log.encode())):
                with open(base + suffix + ".tmp", "wb") as f:
                    f.write(data)
                os.replace(base + suffix + ".tmp", base + suffix)  # the log last: it marks a whole entry
        with open(base + ".cubin", "rb") as f:
            cubin = f.read()
        with open(base + ".log", "rb") as f:
            log = f.read().decode()
    return cubin, log


_KERNELS: dict = {}


def kernel_for(spec, target):
    key = (spec, target)
    if key not in _KERNELS:
        try:
            _KERNELS[key] = attngen.compile(spec, target=target)
        except attngen.SpecError as e:
            skip_if_adapter_refuses(e, target)
            raise
    return _KERNELS[key]


def skip_if_adapter_refuses(error, target):
    """Skip a test whose spec the live adapter cannot run, where that is the adapter's doing: f16
    arithmetic without shader-f16 (the checker refuses it; tests/equivalence/test_f16_packed.py
    checks the refusal), and, on Dawn (ATTNGEN_WGPU=wgpudawn, SwiftShader: 256 invocations per
    workgroup), tiles beyond its limits. Anywhere else a refusal fails the test."""
    if target != "wgsl":
        return
    from attngen.backends.wgsl.devices import DAWN, device_state
    msg = str(error)
    if "needs the shader-f16 feature" in msg and "shader-f16" not in device_state().features:
        pytest.skip("this adapter has no shader-f16: the checker refuses f16 accumulators here")
    if DAWN and " exceeds " in msg:
        pytest.skip(f"beyond this adapter's limits: {msg.splitlines()[0][-90:]}")


def runtime_inputs(spec, target, q, k, v, seed=0):
    """(k, v, call options, reference options) for specs that need run-time inputs (custom
    masks, paged caches: attngen.harness.runner.runtime_inputs); masks go to the GPU for cuda."""
    from attngen.harness.runner import runtime_inputs as host_inputs
    k, v, opts = host_inputs(spec, q, k, v, np.random.default_rng(seed))
    call = dict(opts)
    if "mask" in opts and target == "cuda":
        import cupy
        call["mask"] = cupy.asarray(opts["mask"])
    return k, v, call, opts


def check_against_reference(spec, target, q, k, v, *, return_lse=True, tol=None, seed=0):
    """Run the kernel and the reference on the same inputs; assert the error bounds. Specs
    that need run-time inputs (custom masks, paged caches) get them from runtime_inputs()."""
    from attngen.reference import reference, relative_error, tolerance
    kernel = kernel_for(spec, target)
    k, v, call, ref_kw = runtime_inputs(spec, target, q, k, v, seed)
    dq, dk, dv = to_device(target, spec.dtype, q, k, v)
    out, lse = kernel(dq, dk, dv, return_lse=True, **call)
    out, lse = _to_numpy(out), _to_numpy(lse)
    ref, ref_lse = reference(spec, q, k, v, return_lse=True, **ref_kw)
    assert out.shape == ref.shape
    assert not np.isnan(out).any(), "NaN in the output"
    assert not np.isnan(lse).any(), "NaN in lse"
    bound = tol if tol is not None else tolerance(spec)
    err = relative_error(out, ref)
    assert err <= bound, f"{target} {spec.name}: relative L2 error {err:.3g} > {bound:g}"
    empty = np.isneginf(ref_lse)
    assert np.array_equal(np.isneginf(lse), empty), "lse is -inf exactly where a row sees no key"
    if empty.any():
        rows = np.transpose(empty, (0, 2, 1))  # (B, Lq, Hq)
        assert np.all(out[rows] == 0), "rows that see no key output exactly 0"
    if (~empty).any():
        lerr = np.abs(lse[~empty] - ref_lse[~empty]).max()
        assert lerr <= max(bound, 1e-5) * 10 * max(1.0, np.abs(ref_lse[~empty]).max()), \
            f"lse error {lerr:.3g}"
    return err


# Spec variants that the equivalence suite runs on both targets and the NVRTC tests compile:
# (label, spec body, query heads, KV heads).
VARIANTS = [
    ("f32 d64", "head_dim 64\n dtype f32", 4, 4),
    ("f16 d8 causal", "head_dim 8\n dtype f16\n mask causal", 2, 1),
    ("f16 d40 bottom-right", "head_dim 40\n dtype f16\n mask causal(bottom_right)", 7, 1),
    ("f16 d72 window", "head_dim 72\n dtype f16\n mask window(left=5, right=2)", 8, 2),
    ("f16 d96 window0", "head_dim 96\n dtype f16\n mask window(left=0)", 3, 3),
    ("f16 192/128 softcap", "head_dim qk=192 v=128\n dtype f16\n softcap 30\n mask causal", 4, 1),
    ("f16 d256 scale", "head_dim 256\n dtype f16\n scale 0.3", 2, 2),
    ("f32 d128 causal bottom-right", "head_dim 128\n dtype f32\n mask causal(bottom_right)", 7, 7),
    ("f16 acc f16", "head_dim 64\n dtype f16\n accumulate f16\n mask causal", 4, 2),
    ("f16 acc qk f16", "head_dim 128\n dtype f16\n accumulate qk=f16 pv=f32", 4, 4),
    ("f16 small tiles", "head_dim 32\n dtype f16\n tile q=16 kv=16\n mask window(left=20, right=20)", 4, 4),
    ("bf16 d128 window softcap", "head_dim 128\n dtype bf16\n mask window(left=64)\n softcap 20", 4, 2),
    ("bf16 d256 causal", "head_dim 256\n dtype bf16\n mask causal", 2, 1),
    ("f32 d256 softcap", "head_dim 256\n dtype f32\n softcap 10", 2, 1),
    # Two 16-row fragments per warp on CUDA (FlashAttention-2's 128 rows on 4 warps).
    ("f16 two fragments per warp", "head_dim 64\n dtype f16\n mask causal\n tile q=128 kv=64\n"
     " target cuda { warps=4 }", 4, 2),
    ("f32 two fragments per warp", "head_dim 32\n dtype f32\n tile q=64 kv=16\n target cuda { warps=2 }", 2, 1),
]


# ---- the fuzz campaign (tests/fuzz) -----------------------------------------------------------
# In CI the campaign is bounded (a few minutes on 2 cores). The whole campaign runs on demand:
#     ATTNGEN_FUZZ=full ATTNGEN_FUZZ_REPORT=fuzz-count.jsonl bash scripts/test.sh tests/fuzz
# ATTNGEN_FUZZ=full multiplies every property's number of examples by FUZZ_SCALE; with
# ATTNGEN_FUZZ_REPORT each test process appends its count of cases per property (one JSON line),
# which scripts/fuzz_count.py sums. docs/fuzzing.md keeps the last whole count.
FUZZ_SCALE = 40 if os.environ.get("ATTNGEN_FUZZ") == "full" else 1
_FUZZ_COUNTS: dict = {}


def count(name: str) -> None:
    """One case of fuzz property `name` ran (called from the property's body)."""
    _FUZZ_COUNTS[name] = _FUZZ_COUNTS.get(name, 0) + 1


def pytest_sessionfinish(session):
    path = os.environ.get("ATTNGEN_FUZZ_REPORT")
    if path and _FUZZ_COUNTS:
        import json
        with open(path, "a") as f:
            f.write(json.dumps(_FUZZ_COUNTS) + "\n")


def paged_caches(caches, kv_dtype, lens, rng, page=16):
    """Contiguous quantized caches [(stored, scale)] scattered into shuffled pages with random bytes
    in the pages no sequence uses (one table for all); i8 scales travel with their rows (the CUDA
    kv-quant tests, on the GPU and emulated)."""
    pages_per = [-(-int(n) // page) for n in lens]
    n_pages = sum(pages_per) + 2
    order = rng.permutation(n_pages)
    table = np.zeros((len(lens), max(pages_per)), np.int32)
    at = 0
    for b, n in enumerate(pages_per):
        table[b, :n] = order[at:at + n]
        at += n
    out = []
    for stored, scale in caches:
        sp = rng.integers(0, 256, (n_pages, page) + stored.shape[2:], dtype=np.uint8).view(stored.dtype)
        ss = np.ones((n_pages, page) + scale.shape[2:], np.float32) if kv_dtype == "i8" else scale
        for b, n in enumerate(pages_per):
            for i in range(n):
                rows = slice(i * page, min((i + 1) * page, stored.shape[1]))
                sp[table[b, i], : rows.stop - rows.start] = stored[b, rows]
                if kv_dtype == "i8":
                    ss[table[b, i], : rows.stop - rows.start] = scale[b, rows]
        out.append((sp, ss))
    return out, table
