"""The markdown report of perplexity.py's JSON result."""

from __future__ import annotations

CACHES = {"auto": "fp32 (the compute dtype)", "fp8": "FP8 (e4m3 c_kv, 2^k scale per 128; bf16 k_pe)"}
SOURCES = (("engine", "engine prompt_logprobs"), ("lm_eval", "lm-eval via deepinfer serve"))


def _verdict(ok: bool) -> str:
    return "met" if ok else "missed"


def _labels(r: dict, key: str) -> tuple[str, str]:
    """A configuration's weights and latent cache, in words."""
    c = r["configurations"][key]
    return c["weights"], CACHES.get(c["kv_cache_dtype"], c["kv_cache_dtype"])


def _cells(r: dict, key: str) -> str:
    """A configuration's weights and latent cache table cells."""
    return " | ".join(_labels(r, key))


def _named(r: dict, key: str) -> str:
    """A configuration in short: "FP8 weights, fp32 cache"."""
    return r["configurations"][key]["short"]


def render_markdown(r: dict) -> str:
    engine, lm_eval = r["engine"], r["lm_eval"]
    d = r["data"]
    pages = {CACHES.get(run["kv_cache_dtype"], run["kv_cache_dtype"]).split(" ")[0]: run["cache_pages"]
             for run in engine.values()}
    lines = [
        "# Quantized weights and the FP8 latent cache: perplexity of the embedded demo model on its held-out text",
        "",
        f"- Date (UTC): {r['date_utc']}; commit {r['commit']}; machine: {r['machine']} ({r['platform']})",
        f"- Command: `{r['command']}`",
        f"- Text: the demo model's test split (the last 5% of {d['corpus']}, cut at a line start, as "
        f"tools/train_demo_model.py does): {d['heldout_characters']:,} characters, {d['heldout_bytes']:,} bytes, "
        f"{d['tokens']:,} tokens (sha256 of the text {d['heldout_sha256'][:12]}...)",
        f"- Windows: lm-eval's loglikelihood_rolling definition, {r['windows']} disjoint windows of {r['window']} tokens "
        "(what the model sees per forward pass); every held-out token is predicted once. The first window is BOS + "
        f"{r['window'] - 1} tokens; each later one starts with the token before it (conditioning only) and predicts "
        f"the next {r['window'] - 1}; the last is right-aligned to the end of the text, its earlier tokens context only.",
        "- Engine: `SamplingParams(prompt_logprobs=0, max_tokens=0)`, the scored tokens' own logprobs summed.",
        "- Configurations: the weights (the file's own; `quantization` `fp8` or `int4` applied at load; or a "
        "checkpoint made from the demo model: GPTQ by llm-compressor's oneshot, benchmarks/accuracy/calibrate_gptq.py; "
        "NVFP4 and MXFP4 by compressed-tensors, benchmarks/accuracy/quantized_checkpoints.py) and the latent cache "
        "(`kv_cache_dtype`: `auto`, on the CPU fp32, or `fp8`: c_kv in e4m3 with a power-of-two float32 scale per 128 "
        "values, k_pe in bf16, widened to fp32 as attention reads them). The prefill attends over the cached latents "
        "too, so every scored token sees the cache's values. The engine's cache at its default memory: "
        + ", ".join(f"{n:,} pages ({cache})" for cache, n in pages.items()) + ".",
    ]
    if r.get("left_out"):
        lines.append(f"- Not measured in this run: {', '.join(r['left_out'])} (see perplexity.py's options).")
    if lm_eval:
        one = next(iter(lm_eval.values()))
        lines += [
            f"- lm-eval {r.get('lm_eval_version', '?')}: `{one['lm_eval_command']}` against "
            f"`{one['server_command']}` (one server per row, started and stopped by the script); "
            f"`max_length={one['max_length']}` = the window + the one token a completion request generates. "
            "lm-eval reports word and byte perplexity; the token perplexity below is exp(-loglikelihood / tokens), "
            "its summed loglikelihood over the same token count.",
        ]
    first = next(iter(r["configurations"]))
    lines += ["", "| weights | latent cache | measurement | perplexity | nats/token | tokens | "
              f"delta vs {_named(r, first)} |", "|---|---|---|---:|---:|---:|---:|"]
    for source, name in SOURCES:
        runs = r[source]
        for key, run in runs.items():
            delta = "–" if key == first else f"{100 * (run['perplexity'] / runs[first]['perplexity'] - 1):+.3f}%"
            lines.append(f"| {_cells(r, key)} | {name} | {run['perplexity']:.4f} | {run['nats_per_token']:.6f} | "
                         f"{run['tokens']:,} | {delta} |")
    sources = [(source, name) for source, name in SOURCES if r[source]]
    lines += ["", "## Deltas", "", "| change | configuration | against | "
              + " | ".join(name for _, name in sources) + " |", "|---|---|---|" + "---:|" * len(sources)]
    for c in r["comparisons"]:
        lines.append(f"| {c['what']} | {_named(r, c['configuration'])} | {_named(r, c['baseline'])} | "
                     + " | ".join(f"{c[f'{source}_delta_percent']:+.3f}%" for source, _ in sources) + " |")
    lines += ["", "## Targets", "", "| target | figure | status |", "|---|---|---|"]
    for c in r["comparisons"]:
        if c["target_percent"] is None:
            continue
        for source, _ in sources:
            delta = c[f"{source}_delta_percent"]
            lines.append(f"| {c['what']}: <= +{c['target_percent']:g}% perplexity over {_named(r, c['baseline'])} "
                         f"({source.replace('_', '-')}) | {delta:+.3f}% | {_verdict(delta <= c['target_percent'])} |")
    for key, gap in r.get("agreement_percent", {}).items():
        lines.append(f"| engine and lm-eval agree to {r['agreement_target_percent']:g}% ({_named(r, key)}) | "
                     f"lm-eval {gap:+.2e}% of the engine | {_verdict(abs(gap) <= r['agreement_target_percent'])} |")
    if lm_eval:
        lines += ["", "## lm-eval's own metrics", "",
                  "| weights | latent cache | loglikelihood | word perplexity | byte perplexity | bits per byte | "
                  "words | seconds |", "|---|---|---:|---:|---:|---:|---:|---:|"]
        for key, run in lm_eval.items():
            lines.append(f"| {_cells(r, key)} | {run['loglikelihood']:.3f} | {run['word_perplexity']:.4f} | "
                         f"{run['byte_perplexity']:.6f} | {run['bits_per_byte']:.6f} | {run['words']:,} | "
                         f"{run['seconds']} |")
    lines += ["", "## The training report's window cut", "",
              "tools/train_demo_model.py scores windows of "
              f"{r['window'] - 1} tokens each after its own BOS (no token of the text before it). The engine on that "
              "cut, as a check against `demo_model_training.md` (test perplexity 108.24):", "",
              "| weights | latent cache | perplexity (report windows) |", "|---|---|---:|"]
    for key, run in engine.items():
        lines.append(f"| {_cells(r, key)} | {run['report_windows_perplexity']:.4f} |")
    own = engine.get(first)
    if own:
        gap = 100 * (own["perplexity"] / own["report_windows_perplexity"] - 1)
        lines += ["", f"The rolling windows score {gap:+.2f}% above that cut. Their windows after the first begin with a "
                  "token of the text, not BOS: the model always had BOS at position 0 in training, "
                  "so a text token there costs a little. lm-eval's loglikelihood_rolling "
                  "cannot put BOS before every window (its later windows are conditioned on the previous token), "
                  "so both measurements above use its definition, and this cut is only the check of the reproduction."]
    return "\n".join(lines) + "\n"
