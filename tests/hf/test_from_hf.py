"""attngen.transformers.from_hf / `attngen spec --from-hf`: a model's config -> its specs.

Every family against the numbers of its published config (tests/hf/configs/*.json), the text
against goldens (tests/hf/goldens/, --update-golden rewrites them), the rules against
transformers' own attention modules (built on the meta device: no weights), and every way a
config can be wrong."""

from __future__ import annotations

import importlib
import json
import math
import os

import pytest

import attngen
from attngen.cli import main
from attngen.transformers import ConfigError, from_hf, model_attention, specs_from_hf

from conftest import ROOT

HERE = os.path.join(ROOT, "tests", "hf")
CONFIGS = os.path.join(HERE, "configs")
GOLDENS = os.path.join(HERE, "goldens")

# config -> (layers, heads q, kv, head dims qk, v, dtype, {layer type: (window, count)}, softcap, scale or None=auto)
EXPECTED = {
    "llama3_8b": (32, 32, 8, 128, 128, "bf16", {"global": (None, 32)}, None, None),
    "mistral_7b": (32, 32, 8, 128, 128, "bf16", {"local": (4096, 32)}, None, None),
    "qwen2_7b": (28, 28, 4, 128, 128, "bf16", {"global": (None, 28)}, None, None),  # use_sliding_window false
    "qwen2_sliding": (24, 14, 2, 64, 64, "bf16", {"global": (None, 21), "local": (32768, 3)}, None, None),
    "phi3_mini_4k": (32, 32, 32, 96, 96, "bf16", {"local": (2047, 32)}, None, None),
    "gemma2_9b": (42, 16, 8, 256, 256, "f32", {"local": (4096, 21), "global": (None, 21)}, 50.0, None),
    "gemma2_27b": (46, 32, 16, 128, 128, "bf16", {"local": (4096, 23), "global": (None, 23)}, 50.0, 144 ** -0.5),
    "gemma3_1b": (26, 4, 1, 256, 256, "bf16", {"local": (512, 22), "global": (None, 4)}, None, None),
    "gemma3_4b": (34, 8, 4, 256, 256, "bf16", {"local": (1024, 29), "global": (None, 5)}, None, None),
    # multi-head latent attention: qk = 128 nope + 64 rope, v 128; YaRN's mscale(40, mscale_all_dim)^2
    "deepseek_v2_lite": (27, 16, 16, 192, 128, "bf16", {"global": (None, 27)}, None,
                         192 ** -0.5 * (0.1 * 0.707 * math.log(40) + 1) ** 2),
    "deepseek_v3": (61, 128, 128, 192, 128, "bf16", {"global": (None, 61)}, None,
                    192 ** -0.5 * (0.1 * 1.0 * math.log(40) + 1) ** 2),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_family_gives_the_numbers_of_its_config(name):
    layers, hq, hkv, dqk, dv, dtype, types, softcap, scale = EXPECTED[name]
    model = model_attention(os.path.join(CONFIGS, f"{name}.json"))
    assert model.known and len(model.layers) == layers
    got = {key: (la.window, len(idx)) for key, (la, idx) in model.types().items()}
    assert got == types
    for la in model.layers:
        assert (la.heads_q, la.heads_kv, la.head_dim_qk, la.head_dim_v, la.dtype, la.softcap) == \
            (hq, hkv, dqk, dv, dtype, softcap)
        assert math.isclose(la.scale or dqk ** -0.5, scale or dqk ** -0.5, rel_tol=1e-12)
    specs = specs_from_hf(os.path.join(CONFIGS, f"{name}.json"))
    assert len(specs) == 2 * len(types)  # a prefill and a decode kernel per layer type
    for spec in specs:
        window = types["local" if "_local_" in spec.name else "global"][0]
        if window is None:
            assert (spec.mask.kind, spec.mask.bottom_right) == ("causal", True)
        else:  # transformers' kv_idx > q_idx - sliding_window: the query and sliding_window - 1 keys before it
            assert (spec.mask.kind, spec.mask.left, spec.mask.right) == ("window", window - 1, 0)
        assert spec.schedule.kind == ("split_kv" if spec.name.endswith("_decode") else "fused")
        assert (spec.heads_q, spec.heads_kv, spec.head_dim_qk, spec.head_dim_v, spec.dtype) == (hq, hkv, dqk, dv, dtype)
        assert spec.softcap == softcap
        assert math.isclose(spec.scale or dqk ** -0.5, scale or dqk ** -0.5, rel_tol=1e-12)
        assert (spec.scale is None) == (scale is None or math.isclose(scale, dqk ** -0.5))  # auto where it is
        attngen.lower(spec, "cuda", "cuda-sm90")  # a kernel the cuda target builds (a SpecError otherwise)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_text_matches_its_golden(name, update_golden):
    text = from_hf(os.path.join(CONFIGS, f"{name}.json"))
    golden = os.path.join(GOLDENS, f"{name}.attn")
    if update_golden:
        os.makedirs(GOLDENS, exist_ok=True)
        with open(golden, "w") as f:
            f.write(text)
    with open(golden) as f:
        assert text == f.read(), f"{golden} differs (pytest --update-golden rewrites it; review the diff)"


_MODULES = {"llama": ("llama", "LlamaAttention"), "mistral": ("mistral", "MistralAttention"),
            "qwen2": ("qwen2", "Qwen2Attention"), "phi3": ("phi3", "Phi3Attention"),
            "gemma2": ("gemma2", "Gemma2Attention"), "gemma3_text": ("gemma3", "Gemma3Attention"),
            "deepseek_v2": ("deepseek_v2", "DeepseekV2Attention"), "deepseek_v3": ("deepseek_v3", "DeepseekV3Attention")}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_rules_are_transformers_own(name):
    """The config object gives what the JSON gives, and each layer's attention module (built on
    the meta device) passes the scale, window and softcap the spec has."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = os.path.join(CONFIGS, f"{name}.json")
    with open(path) as f:
        config = transformers.AutoConfig.for_model(**json.load(f))
    model = model_attention(path)
    assert model_attention(config).layers == model.layers
    text = config.get_text_config()
    mod, cls = _MODULES[text.model_type]
    attention = getattr(importlib.import_module(f"transformers.models.{mod}.modeling_{mod}"), cls)
    with torch.device("meta"):
        for i, la in enumerate(model.layers):
            layer = attention(text, i)
            window = getattr(layer, "sliding_window", getattr(text, "sliding_window", None))  # Mistral / Phi-3: config's
            assert window == la.window, i
            assert getattr(layer, "attn_logit_softcapping", None) == la.softcap
            assert math.isclose(layer.scaling, la.scale or la.head_dim_qk ** -0.5, rel_tol=1e-12)


def test_dtype_and_name_overrides():
    text = from_hf(os.path.join(CONFIGS, "gemma2_9b.json"), dtype="f16", name="g")
    specs = attngen.parse(text)
    assert [s.name for s in specs] == ["g_local_prefill", "g_local_decode", "g_global_prefill", "g_global_decode"]
    assert {s.dtype for s in specs} == {"f16"}
    for s in specs:
        attngen.lower(s, "wgsl")  # f16: what the wgsl target builds


def _write(tmp_path, cfg, name="config.json"):
    p = tmp_path / name
    p.write_text(json.dumps(cfg) if not isinstance(cfg, str) else cfg)
    return str(p)


LLAMA = {"model_type": "llama", "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 512,
         "num_hidden_layers": 2, "torch_dtype": "float16"}


@pytest.mark.parametrize("change, words", [
    ({"num_attention_heads": None}, "has no 'num_attention_heads'"),
    ({"model_type": None}, "has no 'model_type'"),
    ({"hidden_size": None}, "has no 'hidden_size'"),
    ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads 3"),
    ({"num_attention_heads": 2.5}, "'num_attention_heads' is 2.5: an integer is needed"),
    ({"num_attention_heads": True}, "an integer is needed"),
    ({"num_attention_heads": -8}, "must be positive"),
    ({"torch_dtype": "int8"}, "dtype 'int8' is not one attngen computes in"),
    ({"layer_types": ["full_attention", "chunked_attention"]}, "'chunked_attention': attngen builds"),
    ({"layer_types": ["full_attention"]}, "one type per layer (2)"),
    ({"layer_types": ["sliding_attention", "full_attention"]}, "no 'sliding_window'"),
    ({"attention_chunk_size": 8192}, "sets 'attention_chunk_size'"),
    ({"attn_logit_softcapping": float("inf")}, "a finite number is needed"),
    ({"num_attention_heads": "x" * 5_000_000}, "..."),
])
def test_configs_attngen_cannot_read_say_which_field(tmp_path, capsys, change, words):
    cfg = {**LLAMA, **change}
    cfg = {k: v for k, v in cfg.items() if v is not None}
    path = _write(tmp_path, cfg)
    with pytest.raises(ConfigError) as e:
        from_hf(path)
    assert words in str(e.value) and len(str(e.value)) < 400
    assert main(["spec", "--from-hf", path]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and "Traceback" not in err and len(err) < 400


def test_an_unknown_architecture_is_read_by_the_common_fields_and_says_so(tmp_path):
    text = from_hf(_write(tmp_path, {**LLAMA, "model_type": "newmodel"}))
    assert "model_type 'newmodel' is not one of the families" in text
    assert attngen.parse(text)[0].heads_q == 8


@pytest.mark.parametrize("content, words", [
    ("{", "not JSON"), ("[1, 2]", "holds one JSON object, not a list"), (b"\xff\xfe", "cannot read it"),
])
def test_files_that_are_not_configs(tmp_path, capsys, content, words):
    p = tmp_path / "config.json"
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert main(["spec", "--from-hf", str(p)]) == 1
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_cli_paths(tmp_path, capsys):
    assert main(["spec", "--from-hf", str(tmp_path / "nope.json")]) == 1
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "model").mkdir()
    _write(tmp_path / "model", LLAMA)
    out = tmp_path / "m.attn"
    assert main(["spec", "--from-hf", str(tmp_path / "model"), "-o", str(out), "--dtype", "f32", "--name", "mine"]) == 0
    specs = attngen.parse(out.read_text())
    assert [s.name for s in specs] == ["mine_global_prefill", "mine_global_decode"] and specs[0].dtype == "f32"
    assert main(["spec", "--from-hf", str(out.parent / "model"), "--name", "no good"]) == 2
    assert "--name 'no good'" in capsys.readouterr().err
    assert main(["spec"]) == 2
    assert "--from-hf" in capsys.readouterr().err


def test_a_config_object_without_transformers_installed_works_by_to_dict():
    class Config:
        model_type = "gemma2"
        layer_types = ["sliding_attention", "full_attention"]

        def to_dict(self):
            return {"model_type": "gemma2", "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
                    "num_hidden_layers": 2, "sliding_window": 16, "query_pre_attn_scalar": 32,
                    "attn_logit_softcapping": 30.0, "dtype": "bfloat16"}
    model = model_attention(Config())
    assert [la.window for la in model.layers] == [16, None] and model.layers[0].softcap == 30.0
    with pytest.raises(ConfigError, match="not int"):
        model_attention(42)


# issue 41/40 review: hostile configs give a ConfigError naming the field (no traceback, hang or wrong text)
DEEPSEEK = {"model_type": "deepseek_v2", "num_attention_heads": 4, "num_hidden_layers": 2, "qk_nope_head_dim": 32,
            "qk_rope_head_dim": 32, "v_head_dim": 32, "dtype": "float16",
            "rope_scaling": {"type": "yarn", "factor": 40, "mscale_all_dim": 1.0}}


@pytest.mark.parametrize("cfg, words", [
    ({"model_type": "gemma3", "text_config": "x"}, "'text_config' is 'x': an object"),
    ({"model_type": "gemma3", "text_config": [1]}, "'text_config' is [1]: an object"),
    ({**LLAMA, "layer_types": [["full_attention"], "full_attention"]}, "'layer_types' has ['full_attention']"),
    ({**LLAMA, "layer_types": [{"a": 1}, "full_attention"]}, "'layer_types' has {'a': 1}"),
    ({**LLAMA, "num_hidden_layers": 10**7}, "'num_hidden_layers' is 10000000: more than 65536"),
    ({**LLAMA, "num_hidden_layers": 10**9}, "more than 65536"),
    ({**DEEPSEEK, "rope_scaling": {"type": "yarn", "factor": "x", "mscale_all_dim": 1.0}}, "'factor' is 'x'"),
    ({**DEEPSEEK, "rope_scaling": {"type": "yarn", "mscale_all_dim": 1.0}}, "has no 'factor'"),
    ({**DEEPSEEK, "rope_scaling": {"type": "yarn", "factor": math.nan, "mscale_all_dim": 1.0}}, "'factor' is nan"),
    ({**DEEPSEEK, "rope_scaling": {"type": "yarn", "factor": 40, "mscale_all_dim": [1]}}, "'mscale_all_dim' is [1]"),
    ({**LLAMA, "model_type": "qwen2", "use_sliding_window": "false", "sliding_window": 8},
     "'use_sliding_window' is 'false': true or false"),
    ({**LLAMA, "use_bidirectional_attention": "no"}, "'use_bidirectional_attention' is 'no'"),
])
def test_hostile_config_fields_are_config_errors(cfg, words):
    with pytest.raises(ConfigError) as e:
        model_attention(cfg)
    assert words in str(e.value)


@pytest.mark.parametrize("name", ["1abc", "a-b", "", 3, "é", "a" * 50, "a\nattention x {"])
def test_a_name_prefix_that_is_not_an_ascii_identifier_is_a_config_error(name):
    with pytest.raises(ConfigError, match="kernel name prefix"):
        from_hf(LLAMA, name=name)
    assert attngen.parse(from_hf(LLAMA, name="a" * 49))  # the longest prefix: 64-character kernel names


def test_names_from_the_config_are_ascii_and_short_and_its_model_type_stays_in_its_comment():
    for path, want in (("Модель-7B", "m_7b"), ("/////", "llama"), ("x" * 200, "x" * 49)):
        specs = specs_from_hf({**LLAMA, "_name_or_path": path})
        assert specs[0].name == f"{want}_global_prefill"
    # a model_type with a new line wrote its second line outside the comment: here a kernel of the attacker's
    evil = "x\nattention evil { head_dim 64\n heads q=1 kv=1\n dtype f16\n mask none }\n#"
    specs = specs_from_hf({**LLAMA, "model_type": evil})
    assert len(specs) == 2 and [s.name.rsplit("_", 2)[1:] for s in specs] == [["global", "prefill"],
                                                                            ["global", "decode"]]


def test_a_null_dtype_falls_back_to_torch_dtype():
    assert model_attention({**LLAMA, "dtype": None}).layers[0].dtype == "f16"


def test_config_files_that_would_hang_or_crash_are_refused(tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    bigint = tmp_path / "bigint.json"
    bigint.write_text('{"model_type": "llama", "head_dim": ' + "9" * 5000 + "}")
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(17 * 2**20)
    (tmp_path / "dir" / "config.json").mkdir(parents=True)
    for path, words in ((fifo, "not a regular file"), ("/dev/zero", "not a regular file"),
                        (deep, "nested too deeply"), (bigint, "4300 digits"), (big, "longer than 16 MiB"),
                        (tmp_path / "dir", "not a regular file")):
        assert main(["spec", "--from-hf", str(path)]) == 1, path
        err = capsys.readouterr().err
        assert words in err and "internal error" not in err and "Traceback" not in err, err


def test_a_non_ascii_name_is_a_usage_error(tmp_path, capsys):
    """'é'.isidentifier() is true in Python, not in the language: the CLI wrote a SpecError about its own text."""
    assert main(["spec", "--from-hf", _write(tmp_path, LLAMA), "--name", "é"]) == 2
    assert "--name 'é'" in capsys.readouterr().err
