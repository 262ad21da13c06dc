"""The embedded demo model's held-out text, its tokens, and the windows that score them.

The held-out text is the demo model's test split exactly as ``tools/train_demo_model.py`` cuts it: the last 5% of
tinyshakespeare's characters, starting at the first line start at or after that point (19,056 tokens). It is tokenized
as one stream without special tokens, as the training script and lm-evaluation-harness both do.

Windows ("rolling" perplexity): the stream is scored in disjoint windows, each token predicted exactly once. A window
is what the model sees in one forward pass, ``window`` tokens: one conditioning token, then ``window - 1`` predicted
tokens. The first window is conditioned on BOS; every later one on the token just before it (the previous window's
last token); the last, shorter, window is right-aligned to the end of the stream, so it is a full ``window`` tokens
long and only its final tokens are scored. This is lm-evaluation-harness's ``loglikelihood_rolling`` definition
(``get_rolling_token_windows`` with ``context_len=1``, then ``make_disjoint_window``); with lm-eval's
``local-completions`` model and ``max_length=M`` a window is ``M - 1`` tokens (one position is kept for the token the
completion request generates), so ``window = M - 1``.

The training report's own figure (perplexity 108.24) uses a slightly different cut: windows of ``context - 1`` tokens
each after its own BOS, the last one short. ``report_windows`` gives those, to check the reproduction of that figure.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEST_FRACTION = 0.05  # tools/train_demo_model.py --test-fraction (the shipped run's value)
BOS_TOKEN_ID = 0      # the demo model's <｜begin▁of▁sentence｜>


def default_corpus() -> Path:
    """tinyshakespeare.txt from the shared assets beside the repository, else .data/ inside it."""
    for path in (REPO.parent / "shared" / "assets" / "corpora" / "tinyshakespeare.txt",
                 REPO / ".data" / "tinyshakespeare.txt"):
        if path.is_file():
            return path
    return REPO / ".data" / "tinyshakespeare.txt"


def heldout_text(corpus_text: str, test_fraction: float = TEST_FRACTION) -> str:
    """The test split of tools/train_demo_model.py's split_corpus: cut at the line start after 95% of the characters."""
    cut = int(len(corpus_text) * (1.0 - test_fraction))
    newline = corpus_text.find("\n", cut)
    return corpus_text[len(corpus_text) if newline < 0 else newline + 1:]


def tokenize(text: str, model_dir: Path) -> list[int]:
    """The text's token ids with the model's own tokenizer.json, no BOS (lm-eval's add_special_tokens=False)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(text, add_special_tokens=False).ids


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Window:
    """One forward pass: ``tokens`` are the model's input; the last ``scored`` of them are predicted and counted."""

    tokens: list[int]
    scored: int


def rolling_windows(ids: list[int], window: int, prefix_token: int = BOS_TOKEN_ID) -> list[Window]:
    """lm-eval's loglikelihood_rolling windows (see the module docstring): each token of ``ids`` scored once."""
    if window < 2:
        raise ValueError(f"a window needs a conditioning token and a predicted one: window={window}")
    predicted = window - 1
    out = [Window([prefix_token] + ids[:predicted], len(ids[:predicted]))] if ids else []
    done = len(ids[:predicted])
    while done < len(ids):
        count = min(predicted, len(ids) - done)
        end = done + count
        # The whole window ends at `end`, starts `window` tokens earlier: its first tokens are context only.
        out.append(Window(ids[max(0, end - window):end], count))
        done = end
    return out


def report_windows(ids: list[int], context: int, bos: int = BOS_TOKEN_ID) -> list[Window]:
    """The training report's windows: ``context - 1`` tokens after a BOS each, every one predicted."""
    step = context - 1
    chunks = [ids[s:s + step] for s in range(0, len(ids), step)]
    return [Window([bos] + chunk, len(chunk)) for chunk in chunks if len(chunk) >= 2]
