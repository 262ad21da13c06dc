"""The markdown report of perplexity.py's JSON result."""

from __future__ import annotations

FP8_TARGET_PERCENT = 1.0        # FP8 weights: at most +1% perplexity
AGREEMENT_TARGET_PERCENT = 0.1  # the two measurements: within 0.1% of each other

LABELS = {"none": "own (bf16 file, fp32 compute)", "fp8": "FP8 (block-scaled e4m3, 128x128)"}


def _verdict(ok: bool) -> str:
    return "met" if ok else "missed"


def render_markdown(r: dict) -> str:
    engine, lm_eval = r["engine"], r["lm_eval"]
    d = r["data"]
    lines = [
        "# FP8 weights: perplexity of the embedded demo model on its held-out text",
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
    ]
    if lm_eval:
        one = next(iter(lm_eval.values()))
        lines += [
            f"- lm-eval {r.get('lm_eval_version', '?')}: `{one['lm_eval_command']}` against "
            f"`{one['server_command']}` (one server per row, started and stopped by the script); "
            f"`max_length={one['max_length']}` = the window + the one token a completion request generates. "
            "lm-eval reports word and byte perplexity; the token perplexity below is exp(-loglikelihood / tokens), "
            "its summed loglikelihood over the same token count.",
        ]
    lines += ["", "| weights | measurement | perplexity | nats/token | tokens | delta vs own weights |",
              "|---|---|---:|---:|---:|---:|"]
    for source, runs in (("engine prompt_logprobs", engine), ("lm-eval via deepinfer serve", lm_eval)):
        for q, run in runs.items():
            base = runs.get("none")
            delta = "–" if q == "none" or base is None else f"{100 * (run['perplexity'] / base['perplexity'] - 1):+.3f}%"
            lines.append(f"| {LABELS.get(q, q)} | {source} | {run['perplexity']:.4f} | {run['nats_per_token']:.6f} | "
                         f"{run['tokens']:,} | {delta} |")
    lines += ["", "## Targets", "", "| target | figure | status |", "|---|---|---|"]
    for source in ("engine", "lm_eval"):
        key = f"{source}_fp8_delta_percent"
        if key in r:
            lines.append(f"| FP8 weights <= +{FP8_TARGET_PERCENT:g}% perplexity ({source.replace('_', '-')}) | "
                         f"{r[key]:+.3f}% | {_verdict(r[key] <= FP8_TARGET_PERCENT)} |")
    for q, gap in r.get("agreement_percent", {}).items():
        lines.append(f"| engine and lm-eval agree to {AGREEMENT_TARGET_PERCENT:g}% ({LABELS.get(q, q)}) | "
                     f"lm-eval {gap:+.2e}% of the engine | {_verdict(abs(gap) <= AGREEMENT_TARGET_PERCENT)} |")
    if lm_eval:
        lines += ["", "## lm-eval's own metrics", "",
                  "| weights | loglikelihood | word perplexity | byte perplexity | bits per byte | words | seconds |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for q, run in lm_eval.items():
            lines.append(f"| {LABELS.get(q, q)} | {run['loglikelihood']:.3f} | {run['word_perplexity']:.4f} | "
                         f"{run['byte_perplexity']:.6f} | {run['bits_per_byte']:.6f} | {run['words']:,} | "
                         f"{run['seconds']} |")
    lines += ["", "## The training report's window cut", "",
              "tools/train_demo_model.py scores windows of "
              f"{r['window'] - 1} tokens each after its own BOS (no token of the text before it). The engine on that "
              "cut, as a check against `demo_model_training.md` (test perplexity 108.24):", "",
              "| weights | perplexity (report windows) |", "|---|---:|"]
    for q, run in engine.items():
        lines.append(f"| {LABELS.get(q, q)} | {run['report_windows_perplexity']:.4f} |")
    own = engine.get("none")
    if own:
        gap = 100 * (own["perplexity"] / own["report_windows_perplexity"] - 1)
        lines += ["", f"The rolling windows score {gap:+.2f}% above that cut. Their windows after the first begin with a "
                  "token of the text, not BOS: the model always had BOS at position 0 in training, "
                  "so a text token there costs a little. lm-eval's loglikelihood_rolling "
                  "cannot put BOS before every window (its later windows are conditioned on the previous token), "
                  "so both measurements above use its definition, and this cut is only the check of the reproduction."]
    return "\n".join(lines) + "\n"
