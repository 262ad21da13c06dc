"""Streaming detokenization and stop strings."""

from __future__ import annotations

import json
import random

import pytest

from conftest import SHAREGPT_PROMPTS as PROMPTS
from conftest import V3_TOKENIZER_DIR as V3_DIR
from conftest import default_v3_tokenizer, require_asset

from deepinfer.tokenizer import (IncrementalDetokenizer, StopStringMatcher, Tokenizer, find_stop, first_completed_stop,
                                 held_back_length)

REPL = "\ufffd"


@pytest.fixture(scope="module")
def tok():
    """DeepSeek-V3's tokenizer: from the shared assets, else the packaged default (whose own errors fail)."""
    if (V3_DIR / "tokenizer.json").is_file():
        return Tokenizer.from_dir(V3_DIR)
    require_asset(V3_DIR / "tokenizer.json")  # in CI the assets are there: their absence fails
    return default_v3_tokenizer()


def _byte_token_ids(tok, data: bytes) -> list[int]:
    """Ids of the single-byte tokens spelling ``data`` (GPT-2 byte-to-unicode alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    ids = [tok.convert_tokens_to_ids(table[b]) for b in data]
    assert None not in ids
    return ids


def _stream(tok, prompt_ids, output_ids, chunks=None, skip_special_tokens=True):
    d = IncrementalDetokenizer(tok, prompt_ids, skip_special_tokens=skip_special_tokens)
    deltas, i = [], 0
    rng = random.Random(len(output_ids))
    while i < len(output_ids):
        n = 1 if chunks is None else rng.randint(1, chunks)
        deltas.append(d.step(output_ids[i:i + n]))
        i += n
    deltas.append(d.flush())
    assert "".join(deltas) == d.text
    return deltas


def _check(tok, prompt_ids, output_ids, **kw):
    deltas = _stream(tok, prompt_ids, output_ids, **kw)
    full = tok.decode(output_ids, skip_special_tokens=kw.get("skip_special_tokens", True))
    assert "".join(deltas) == full
    if REPL not in full:
        assert not any(REPL in d for d in deltas)
    return deltas


def test_sharegpt_streams(tok):
    require_asset(PROMPTS)
    prompts = [item["conversations"][0]["value"] for item in json.loads(PROMPTS.read_text(encoding="utf-8"))]
    texts = prompts[:200]
    streams = tok.encode(texts, add_special_tokens=False)
    head = tok.apply_chat_template([{"role": "user", "content": "Write something."}], tokenize=True)
    for n, ids in enumerate(streams):
        _check(tok, head, ids, chunks=None if n % 2 == 0 else 5)


MULTIBYTE = [
    "🎉🚀🔥 family 👩‍👩‍👧‍👦 and flags 🇫🇷🇯🇵🇺🇦 and skin tones 👋🏽👍🏿",
    "深度求索的模型：中文、日本語（カタカナ）、한국어、𠜎𠜱𠝹𠱓 (rare CJK, 4-byte)",
    "Привет, мир! Ελληνικά. עברית. العربية. हिन्दी. ไทย.",
    "mixed🎉text中文🎉more 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math 𝛼𝛽𝛾 ✓✗ ♠♣♥♦",
]


@pytest.mark.parametrize("text", MULTIBYTE)
def test_multibyte_split_across_tokens(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    deltas = _check(tok, [0], ids)
    if any(tok.decode(ids[:k]).endswith(REPL) for k in range(1, len(ids))):
        assert "" in deltas[:-1]  # a token ended inside a character: something was held back
    _check(tok, [], ids, chunks=3)
    # Byte-by-byte tokens: the hardest split (every multi-byte character is cut).
    byte_ids = _byte_token_ids(tok, text.encode("utf-8"))
    assert tok.decode(byte_ids) == text
    deltas = _check(tok, [0], byte_ids)
    assert "" in deltas[:-1]


def test_natural_tokens_do_split_characters(tok):
    # With the real vocabulary, emoji and rare CJK characters are cut across tokens.
    for text in (MULTIBYTE[0], MULTIBYTE[1], MULTIBYTE[3]):
        ids = tok.encode(text, add_special_tokens=False)
        assert any(tok.decode(ids[:k]).endswith(REPL) for k in range(1, len(ids))), text


def test_text_before_a_partial_character_is_emitted_at_once(tok):
    # "abc" then the first byte of an emoji in the same step: "abc" must not wait for the emoji.
    emoji = "🎉".encode("utf-8")
    d = IncrementalDetokenizer(tok, [0])
    assert d.step(tok.encode("abc", add_special_tokens=False) + _byte_token_ids(tok, emoji[:1])) == "abc"
    assert d.step(_byte_token_ids(tok, emoji[1:3])) == ""
    assert d.step(_byte_token_ids(tok, emoji[3:])) == "🎉"
    assert d.flush() == ""
    assert d.text == "abc🎉"


def test_special_tokens(tok):
    body = tok.encode("Hello <｜User｜>there<｜end▁of▁sentence｜> and <｜place▁holder▁no▁5｜>!", add_special_tokens=False)
    ids = body + [1]
    for skip in (True, False):
        _check(tok, [0], ids, skip_special_tokens=skip)
    assert "".join(_stream(tok, [0], ids)) == "Hello <｜User｜>there and !"


def test_invalid_bytes_released_without_flush(tok):
    # Lone continuation bytes never form a character: they must come out as U+FFFD eventually,
    # even before the request finishes, and the total still equals decode().
    bad = _byte_token_ids(tok, b"\x80" * 12)
    ids = tok.encode("ok ", add_special_tokens=False) + bad + tok.encode(" fine", add_special_tokens=False)
    d = IncrementalDetokenizer(tok, [0])
    deltas = [d.step([i]) for i in ids[:-2]]
    assert REPL in "".join(deltas)
    deltas += [d.step(ids[-2:]), d.flush()]
    assert "".join(deltas) == tok.decode(ids)
    # A truncated character at the very end comes out on flush.
    cut = tok.encode("end", add_special_tokens=False) + _byte_token_ids(tok, "🎉".encode("utf-8")[:2])
    _check(tok, [0], cut)


def test_random_byte_streams(tok):
    """Valid multi-byte characters, invalid bytes and truncated sequences, as byte tokens and as
    ordinary tokens, streamed in random chunks: the deltas always add up to decode()."""
    rng = random.Random(1234)
    valid = ["a", " ", "é", "ж", "中", "€", "🎉", "𝔢", "\n", "ok"]
    invalid = [b"\x80", b"\xbf", b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf0\x9f", b"\xe4\xb8", b"\xf4\x90\x80\x80"]
    for trial in range(150):
        ids: list[int] = []
        for _ in range(rng.randint(1, 25)):
            r = rng.random()
            if r < 0.45:
                ids += _byte_token_ids(tok, rng.choice(valid).encode("utf-8"))
            elif r < 0.65:
                ids += _byte_token_ids(tok, rng.choice(invalid))
            else:
                ids += tok.encode("".join(rng.choice(valid) for _ in range(rng.randint(1, 6))),
                                  add_special_tokens=False)
        _check(tok, [0], ids, chunks=1 + trial % 5)


def test_prompt_ending_inside_a_character(tok):
    emoji = _byte_token_ids(tok, "🎉".encode("utf-8"))
    prompt = tok.encode("Say", add_special_tokens=False) + emoji[:2]
    output = emoji[2:] + tok.encode(" yes", add_special_tokens=False)
    _check(tok, prompt, output)


def test_stop_string_matcher_is_find_stop_over_the_whole_text():
    """The matcher keeps only a tail, yet every delta's emitted text, the stop and its stop string are find_stop's on
    the whole text so far (and first_completed_stop's on it), for any text, stop set and chunking."""
    rng = random.Random(1)
    alphabet = "ab c\n中🎉"
    stop_sets = [["ab"], ["abc", "c\n"], ["🎉🎉", "中中中"], ["a b", "b c", "\n\n"], ["zzz"], ["", "b"], ["a"]]
    for _ in range(400):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        stops = rng.choice(stop_sets)
        include = rng.random() < 0.5
        matcher = StopStringMatcher(stops, include)
        so_far, at = "", 0
        while at < len(text) or at == 0:
            piece = text[at:at + rng.randint(0, 4)]
            at += len(piece)
            final = at >= len(text)
            expected = find_stop(so_far, piece, stops, include, final=final)
            assert matcher.feed(piece, final=final) == expected, (text, stops, include, at)
            assert len(matcher._tail) <= max(len(s) for s in stops) - 1  # a bounded window, not the text
            so_far += piece
            if expected[1]:
                assert matcher.stop_reason == first_completed_stop(so_far, stops)
                break
            if final:
                assert matcher.stop_reason is None
                break
    with pytest.raises(ValueError, match="non-empty stop string"):
        StopStringMatcher(["", ""])


def test_cost_is_linear(tok):
    """Each step decodes a short window, not the whole output."""

    class Counting:
        def __init__(self, inner):
            self.inner, self.decoded = inner, 0

        def decode(self, ids, skip_special_tokens=True):
            self.decoded += len(ids)
            return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)

    ids = tok.encode("Some long generation with 中文 and emoji 🎉 in it. " * 300, add_special_tokens=False)
    counting = Counting(tok)
    d = IncrementalDetokenizer(counting, [0, 1, 2])
    out = "".join(d.step([i]) for i in ids) + d.flush()
    assert out == tok.decode(ids)
    assert counting.decoded < 12 * len(ids)


def test_step_after_flush(tok):
    d = IncrementalDetokenizer(tok, [])
    assert d.step(6366) == "hi"
    assert d.flush() == ""
    assert d.flush() == ""
    d = IncrementalDetokenizer(tok, [])
    assert d.step(_byte_token_ids(tok, b"\xf0\x9f")) == ""
    assert d.flush() == REPL
    with pytest.raises(RuntimeError):
        d.step([6366])


# ------------------------------------------------------------------------------------------------
# Stop strings


def _stream_stop(text: str, pieces: list[int], stops, include_stop=False):
    out, so_far, pos = [], "", 0
    for n in pieces:
        delta = text[pos:pos + n]
        pos += n
        emit, stopped = find_stop(so_far, delta, stops, include_stop)
        out.append(emit)
        so_far += delta
        if stopped:
            return "".join(out), True
    emit, _ = find_stop(so_far, text[pos:], stops, include_stop, final=True)
    out.append(emit)
    return "".join(out), False


def test_find_stop_single_delta():
    assert find_stop("", "Hello STOP world", ["STOP"]) == ("Hello ", True)
    assert find_stop("", "Hello STOP world", ["STOP"], include_stop=True) == ("Hello STOP", True)
    assert find_stop("", "STOP", ["STOP"]) == ("", True)
    assert find_stop("", "no stop here", []) == ("no stop here", False)
    assert find_stop("", "no stop here", ["", "zzz"]) == ("no stop here", False)


def test_find_stop_holds_back_possible_prefix():
    stops = ["STOP"]
    assert find_stop("", "Hel", stops) == ("Hel", False)
    assert find_stop("Hel", "lo S", stops) == ("lo ", False)  # "S" held
    assert held_back_length("Hello S", stops) == 1
    assert find_stop("Hello S", "TO", stops) == ("", False)  # "STO" held
    assert find_stop("Hello STO", "P more", stops) == ("", True)
    assert find_stop("Hello STO", "P more", stops, include_stop=True) == ("STOP", True)
    # False alarm: the held text is released once it cannot be a stop string.
    assert find_stop("Hello S", "TAR", stops) == ("STAR", False)
    # The request ended for another reason: nothing is held.
    assert find_stop("Hello S", "TO", stops, final=True) == ("STO", False)


def test_find_stop_first_completed_wins():
    assert find_stop("", "abcd", ["abcd", "bc"]) == ("a", True)
    assert find_stop("", "xabcx", ["abc", "bc"]) == ("x", True)
    assert find_stop("", "1 2 END 3 STOP", ["STOP", "END"], include_stop=True) == ("1 2 END", True)
    assert find_stop("", "<｜end▁of▁sentence｜>", ["<｜end▁of▁sentence｜>"]) == ("", True)


def test_find_stop_independent_of_chunking():
    rng = random.Random(0)
    alphabet = "ab c\n中🎉"
    stop_sets = [["ab"], ["abc", "c\n"], ["🎉🎉", "中中中"], ["a b", "b c", "\n\n"], ["zzz"]]
    for _ in range(400):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        stops = rng.choice(stop_sets)
        include = rng.random() < 0.5
        one_shot = _stream_stop(text, [len(text)], stops, include)
        pieces = []
        while sum(pieces) < len(text):
            pieces.append(rng.randint(1, 4))
        chunked = _stream_stop(text, pieces, stops, include)
        by_char = _stream_stop(text, [1] * len(text), stops, include)
        assert chunked == one_shot == by_char, (text, stops, include)
        if not one_shot[1]:
            assert one_shot[0] == text


def test_detokenizer_with_stop_strings(tok):
    text = "The answer is 42.\n\nObservation: done"
    ids = tok.encode(text, add_special_tokens=False)
    d = IncrementalDetokenizer(tok, [0])
    out, stopped = "", False
    for i in ids:
        before = d.text
        delta = d.step([i])
        emit, stopped = find_stop(before, delta, ["\n\nObservation:"])
        out += emit
        if stopped:
            break
    assert stopped and out == "The answer is 42."


class _DecodeOnly:
    """The tokenizer with decode alone: the detokenizer then decodes every step (no fixed token texts)."""

    def __init__(self, inner):
        self.inner = inner

    def decode(self, ids, skip_special_tokens=True):
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)


def test_fixed_token_texts_give_the_decoded_steps(tok):
    """The shortcut for tokens whose text is fixed (Tokenizer.token_text) changes no delta: step by step the same as
    decoding every step, over ShareGPT text, special tokens, emoji and CJK split over tokens, and invalid bytes."""
    require_asset(PROMPTS)
    rng = random.Random(7)
    prompts = [item["conversations"][0]["value"] for item in json.loads(PROMPTS.read_text(encoding="utf-8"))]
    texts = prompts[:40] + MULTIBYTE + ["naïve café e\u0301", "x" * 50]
    special = [tok.bos_token_id, tok.eos_token_id]
    for i, text in enumerate(texts):
        ids = tok.encode(text, add_special_tokens=False)[:300]
        if i % 3 == 0:  # special tokens in the middle, and raw bytes that are not UTF-8
            ids = ids[:20] + [special[i % 2]] + ids[20:] + _byte_token_ids(tok, b"\xff\xfe") + ids[:5]
        for skip in (True, False):
            prompt = tok.encode(prompts[i + 1][:40], add_special_tokens=False)
            fast = _stream(tok, prompt, ids, skip_special_tokens=skip)
            slow = _stream(_DecodeOnly(tok), prompt, ids, skip_special_tokens=skip)
            assert fast == slow, (i, skip)
            chunked = _stream(tok, prompt, ids, chunks=3, skip_special_tokens=skip)
            assert "".join(chunked) == "".join(slow)
        rng.shuffle(ids)  # also random orders of the same tokens
        assert _stream(tok, [], ids) == _stream(_DecodeOnly(tok), [], ids)


def test_token_text_is_fixed_only_where_it_can_be(tok):
    hello = tok.encode(" hello", add_special_tokens=False)
    assert len(hello) == 1 and tok.token_text(hello[0]) == " hello"
    assert tok.token_text(tok.bos_token_id) is None  # an added token: decoded from its content, may be skipped
    emoji_bytes = _byte_token_ids(tok, "🙂".encode())
    assert tok.token_text(emoji_bytes[0]) is None  # a byte that ends inside a character
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import decoders, models

    wordpiece = HfTokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    wordpiece.decoder = decoders.WordPiece()
    other = Tokenizer(wordpiece, unk_token="[UNK]")
    assert other.token_text(1) is None  # not a byte-level decoder: its text depends on the neighbours
