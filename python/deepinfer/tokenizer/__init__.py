"""Tokenizers and the token-text helpers built on them.

- ``tokenizer``: :class:`Tokenizer`, DeepSeek checkpoints' tokenizer (encode, decode, chat templates).
- ``detokenizer``: :class:`IncrementalDetokenizer`, generated token ids -> text deltas.
- ``stop_strings``: :func:`find_stop` and friends, stop strings applied to those deltas.
- ``token_text``: :class:`TokenText`, one token's text and bytes, for logprobs.
"""

from deepinfer.tokenizer.detokenizer import IncrementalDetokenizer
from deepinfer.tokenizer.stop_strings import StopStringMatcher, find_stop, first_completed_stop, held_back_length
from deepinfer.tokenizer.token_text import TokenText
from deepinfer.tokenizer.tokenizer import DEEPSEEK_V3_TOKENIZER_REQUIREMENT, Tokenizer

__all__ = [
    "DEEPSEEK_V3_TOKENIZER_REQUIREMENT",
    "IncrementalDetokenizer",
    "TokenText",
    "Tokenizer",
    "StopStringMatcher",
    "find_stop",
    "first_completed_stop",
    "held_back_length",
]
