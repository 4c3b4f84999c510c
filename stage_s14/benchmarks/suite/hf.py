"""Suite `hf` (issue 40): transformers models with attn_implementation attngen / sdpa / flex_attention.

Random-init Llama-3-8B-shaped and Gemma-2-9B-shaped models (their published widths, 4 layers:
Gemma-2's alternate sliding window 4096 and global, both soft-capped at 50), bf16 on the GPU, one
set of weights switched between implementations (model.set_attn_implementation), run as
transformers runs them:

- prefill: model(ids, use_cache=False, logits_to_keep=1), B=1, L=8192 (past Gemma-2's window);
  the median of CUDA events after warm-up (triton's do_bench, as the rest of the suite);
- decode step: one token per sequence against a DynamicCache holding the prompt (B=8, 4096
  tokens); each step gets its own copy of the cache (made outside the timing), CUDA events around
  the forward, the median of 30 steps after 5 warm-up steps.

Each row also has the relative L2 error of attngen's last-position logits against a peer's:
SDPA's for Llama; flex_attention's for Gemma-2, since transformers' SDPA path drops the
soft-cap (torch's SDPA has none), so SDPA computes another function there.
"""

from __future__ import annotations

import copy
import statistics

import torch

from variants import bench_ms, rel_err

IMPLS = ("attngen", "sdpa", "flex_attention")
PEER_KEYS = {"sdpa": "sdpa", "flex_attention": "flex"}
SHAPES = {
    "llama3_8b_shaped": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                             num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0),
    "gemma2_9b_shaped": dict(model_type="gemma2", hidden_size=3584, intermediate_size=14336, num_attention_heads=16,
                             num_key_value_heads=8, head_dim=256, vocab_size=256000, query_pre_attn_scalar=256,
                             attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window=4096),
}
LAYERS = 4
PREFILL = (1, 8192)
DECODE = (8, 4096)


def _model(name):
    import transformers
    cfg = dict(SHAPES[name])
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), num_hidden_layers=LAYERS,
                                               max_position_embeddings=16384, **cfg)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                                              dtype=torch.bfloat16)
    return model.eval()


def _decode_ms(model, ids, cache, reps=30, warm=5) -> float:
    tok = ids[:, -1:]
    times = []
    for i in range(warm + reps):
        c = copy.deepcopy(cache)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        model(tok, past_key_values=c, use_cache=True)
        end.record()
        torch.cuda.synchronize()
        if i >= warm:
            times.append(start.elapsed_time(end))
    times.sort()
    print(f"    decode steps: min {times[0]:.3f} median {statistics.median(times):.3f} max {times[-1]:.3f} ms",
          flush=True)
    return statistics.median(times)


def section(rows):
    import attngen.transformers as at
    at.register()
    for name in SHAPES:
        model = _model(name)
        g = torch.Generator(device="cuda").manual_seed(1)
        vocab = model.config.vocab_size
        ids = torch.randint(3, vocab, PREFILL, device="cuda", generator=g)
        prompt = torch.randint(3, vocab, DECODE, device="cuda", generator=g)
        pre, dec, logits = {}, {}, {}
        for impl in IMPLS:
            model.set_attn_implementation(impl)
            with torch.no_grad():
                try:
                    logits[impl] = model(ids, use_cache=False, logits_to_keep=1).logits
                    pre[impl] = bench_ms(lambda: model(ids, use_cache=False, logits_to_keep=1))
                    out = model(prompt[:, :-1], use_cache=True, logits_to_keep=1)
                    dec[impl] = _decode_ms(model, prompt, out.past_key_values)
                    del out
                except Exception as e:  # a peer that cannot run the model: reported, not fatal
                    print(f"hf {name} {impl}: {type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)
            torch.cuda.empty_cache()
        peer = "flex_attention" if SHAPES[name].get("attn_logit_softcapping") else "sdpa"
        err = rel_err(logits["attngen"], logits[peer]) if "attngen" in logits and peer in logits else None
        for phase, times, shape in (("prefill", pre, PREFILL), ("decode step", dec, DECODE)):
            row = {"suite": "hf", "case": f"{name} {LAYERS} layers {phase} B={shape[0]} L={shape[1]}",
                   "target": "cuda", "rel_err": err, "rel_err_vs": peer,
                   "attngen": {"ms": times.get("attngen")},
                   "peers": {PEER_KEYS[i]: {"ms": times[i]} for i in IMPLS[1:] if i in times}}
            rows.append(row)
            print(f"{row['case']:48s} " + "  ".join(f"{i} {times[i]:8.3f} ms" for i in IMPLS if i in times)
                  + (f"  err {err:.1e} vs {peer}" if err is not None else ""), flush=True)
        del model
        torch.cuda.empty_cache()


def latest_rows(rows):
    return list(rows)


def markdown(rows) -> str:
    out = ["", "## transformers models (suite hf)", "",
           f"Random-init models of the published widths, {LAYERS} layers, bf16; the time of one forward as "
           "transformers runs it with each attn_implementation (the whole model: projections, MLPs, norms too). "
           "Gemma-2's SDPA row drops the soft-cap (torch's SDPA has none), so it computes less than the others.", "",
           "| case | attngen ms | sdpa ms | flex_attention ms | vs sdpa | vs flex | rel. err (vs) |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        a = r["attngen"]["ms"]

        def ms(key):
            return r["peers"].get(key, {}).get("ms")

        def ratio(key):
            return f"{ms(key) / a:.2f}x" if a and ms(key) else "-"
        f = (lambda x: f"{x:.3f}" if x else "-")
        err = f"{r['rel_err']:.1e} ({r['rel_err_vs']})" if r.get("rel_err") is not None else "-"
        out.append(f"| {r['case']} | {f(a)} | {f(ms('sdpa'))} | {f(ms('flex'))} | {ratio('sdpa')} | {ratio('flex')} "
                   f"| {err} |")
    return "\n".join(out) + "\n"
