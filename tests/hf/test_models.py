"""attngen.transformers.register(): random-init models of every family run with
attn_implementation="attngen", against transformers' SDPA and eager attention.

On the CPU the kernels are the wgsl target's (the software adapter in CI), in f32; on a GPU the
cuda target's, in bf16 (logits) and f32 (generation, where bf16's near-ties would make greedy
tokens a coin toss). Criterion for logits: attngen is as close to SDPA as transformers' own eager
attention is (its spread), or within the dtype's floor. Gemma-2's SDPA path drops the soft-cap
(torch's SDPA has none), so there eager is the reference and SDPA the control."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attngen.transformers as at  # noqa: E402
from attngen.errors import LaunchError  # noqa: E402
from attngen.transformers import attention as hf_attention  # noqa: E402

from conftest import require  # noqa: E402
from tiny import FAMILY, tiny_config  # noqa: E402

FLOOR = {torch.float32: 2e-5, torch.bfloat16: 3e-2}
SOFTCAP = {"gemma2"}  # SDPA drops the soft-cap: eager is the reference there
# head dims the GPU's shapes use (the CPU's tiny ones are 16-24)
GPU = {"hidden_size": 512, "intermediate_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2}
GPU_FAMILY = {"gemma2": {"head_dim": 128, "query_pre_attn_scalar": 96},
              "gemma3_text": {"head_dim": 128, "query_pre_attn_scalar": 128},
              "qwen2": {"num_attention_heads": 6, "hidden_size": 384},
              "phi3": {"num_key_value_heads": 8},
              "deepseek_v2": {"num_key_value_heads": 8, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64},
              "deepseek_v3": {"num_key_value_heads": 8, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
                              "v_head_dim": 64}}


@pytest.fixture(scope="module", autouse=True)
def registered():
    assert at.register() == "attngen"


def _device(device: str):
    require("wgsl" if device == "cpu" else "cuda")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA GPU here")
    return torch.device(device)


def _config(family: str, device: str, **over):
    return tiny_config(family, **({**GPU, **GPU_FAMILY.get(family, {})} if device == "cuda" else {}), **over)


def _model(config, impl: str, device, dtype):
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=impl).to(device, dtype).eval()


def _rel(a, b) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("family", sorted(FAMILY))
def test_logits_within_sdpas_own_spread(family, device):
    dev = _device(device)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    config = _config(family, device)
    length = 23 if device == "cpu" else 301  # crosses the windows (9 / the GPU's 9) and the kernels' tiles
    ids = torch.randint(3, config.vocab_size, (2, length), generator=torch.Generator().manual_seed(1)).to(dev)
    logits = {}
    for impl in ("eager", "sdpa", "attngen"):
        with torch.no_grad():
            logits[impl] = _model(config, impl, dev, dtype)(ids).logits
    ref, control = ("eager", "sdpa") if family in SOFTCAP else ("sdpa", "eager")
    err, spread = _rel(logits["attngen"], logits[ref]), _rel(logits[control], logits[ref])
    assert torch.isfinite(logits["attngen"]).all()
    assert err <= max(2 * spread, FLOOR[dtype]), (err, spread)


# every family on the GPU; on the CPU (lavapipe, CI's 2 cores) one of each kind of attention
GENERATION = [(f, c, d) for d in ("cpu", "cuda") for f in sorted(FAMILY) for c in ("dynamic", "static")
              if d == "cuda" or f in ("llama", "gemma2", "deepseek_v3")]


@pytest.mark.parametrize("family, cache, device", GENERATION)
def test_greedy_generation_matches_eager(family, cache, device):
    """Batched, with left padding in one row (the masked kernels) and none in the other; the
    decode steps run the decode kernels against transformers' cache."""
    dev = _device(device)
    config = _config(family, device)
    ids = torch.randint(3, config.vocab_size, (2, 13), generator=torch.Generator().manual_seed(2)).to(dev)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    out = {}
    for impl in ("eager", "attngen"):
        model = _model(config, impl, dev, torch.float32)
        with torch.no_grad():
            out[impl] = model.generate(ids, attention_mask=mask, max_new_tokens=10, min_new_tokens=10, do_sample=False,
                                       cache_implementation=cache, pad_token_id=0)
    assert torch.equal(out["attngen"], out["eager"])
    names = set(hf_attention.cached_kernels())
    assert any(n.endswith("_decode") for n in names) and any(n.endswith("_prefill") for n in names)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_generation_without_padding_uses_the_specs_own_masks(device):
    """No padding, a dynamic cache: every call is the causal / window kernel, none a masked one."""
    dev = _device(device)
    hf_attention.clear_kernels()
    config = _config("gemma2", device)
    ids = torch.randint(3, config.vocab_size, (1, 15), generator=torch.Generator().manual_seed(3)).to(dev)
    out = {}
    for impl in ("eager", "attngen"):
        with torch.no_grad():
            out[impl] = _model(config, impl, dev, torch.float32).generate(
                ids, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(out["attngen"], out["eager"])
    names = sorted(hf_attention.cached_kernels())
    assert names == ["gemma2_global_decode", "gemma2_global_prefill", "gemma2_local_decode", "gemma2_local_prefill"]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_kernels_are_compiled_once_per_layer_type(device):
    dev = _device(device)
    hf_attention.clear_kernels()
    config = _config("gemma2", device, num_hidden_layers=6)
    model = _model(config, "attngen", dev, torch.float32)
    ids = torch.randint(3, config.vocab_size, (1, 17), generator=torch.Generator().manual_seed(4)).to(dev)
    with torch.no_grad():
        model(ids)
        kernels = hf_attention.cached_kernels()
        model(ids[:, :11])
    assert sorted(kernels) == ["gemma2_global_prefill", "gemma2_local_prefill"]  # 6 layers, 2 types
    assert hf_attention.cached_kernels() == kernels  # the second call compiled nothing


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_torch_compile_traces_the_model_without_a_graph_break(device):
    dev = _device(device)
    dtype = torch.float32
    config = _config("gemma2", device)
    model = _model(config, "attngen", dev, dtype)
    ids = torch.randint(3, config.vocab_size, (2, 19), generator=torch.Generator().manual_seed(5)).to(dev)
    with torch.no_grad():
        eager = model(ids).logits
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="aot_eager" if device == "cpu" else "inductor", fullgraph=True)(ids)
    assert _rel(compiled.logits, eager) <= FLOOR[dtype]


def test_what_attngen_does_not_compute_is_refused_clearly():
    require("wgsl")
    config = _config("llama", "cpu", attention_dropout=0.1)
    model = _model(config, "attngen", torch.device("cpu"), torch.float32).train()
    ids = torch.randint(3, config.vocab_size, (1, 7))
    with pytest.raises(LaunchError, match="attention dropout"):
        model(ids)
    model = _model(_config("llama", "cpu"), "attngen", torch.device("cpu"), torch.bfloat16)
    with pytest.raises(LaunchError, match="bfloat16 model on the CPU"):
        with torch.no_grad():
            model(ids)


def test_register_checks_the_target_name():
    with pytest.raises(ValueError, match="unknown target 'wgls'"):
        at.register(target="wgls")


def test_from_pretrained_takes_attn_implementation_attngen(tmp_path):
    """A saved model loaded with from_pretrained(..., attn_implementation="attngen") runs attngen."""
    require("wgsl")
    hf_attention.clear_kernels()
    config = _config("qwen2", "cpu")
    _model(config, "eager", torch.device("cpu"), torch.float32).save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="attngen",
                                                              dtype=torch.float32).eval()
    eager = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager",
                                                              dtype=torch.float32).eval()
    assert model.config._attn_implementation == "attngen"
    ids = torch.randint(3, config.vocab_size, (1, 21), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert _rel(model(ids).logits, eager(ids).logits) <= FLOOR[torch.float32]
    assert sorted(hf_attention.cached_kernels()) == ["qwen2_global_prefill", "qwen2_local_prefill"]


def test_the_attention_function_checks_the_ranks_and_head_dim_first():
    """(issue 41/40 review) q, k, v of rank 3 raised IndexError, a head dim of 0 ZeroDivisionError."""
    class Module(torch.nn.Module):
        is_causal = True
    q, k, v = torch.randn(1, 4, 5, 16), torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16)
    for args, words in (((q[0], k[0], v[0]), "query has shape (4, 5, 16)"), ((q, k[0], v), "key has shape"),
                        ((q[..., :0], k[..., :0], v[..., :0]), "head dim of at least 1")):
        with pytest.raises(LaunchError, match=words.replace("(", r"\(").replace(")", r"\)")):
            hf_attention.attention_forward(Module(), *args, None)
