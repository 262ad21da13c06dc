"""A token's text and bytes for logprobs (deepinfer.tokenizer.TokenText), against the tokenizer's own vocabulary."""

from __future__ import annotations

import pytest

from conftest import write_tokenizer

from deepinfer.tokenizer import TokenText, Tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    write_tokenizer(path)
    return Tokenizer.from_dir(path)


def test_token_bytes_concatenate_to_the_utf8_of_the_text(tok):
    text = "Пример 中文 🙂🚀 def f(x):"
    ids = tok.encode(text, add_special_tokens=False)
    tt = TokenText(tok)
    assert b"".join(bytes(tt.get(i)[1]) for i in ids) == text.encode("utf-8")


def test_a_token_inside_a_character_has_its_bytes_and_a_replacement_text(tok):
    ids = tok.encode("🙂", add_special_tokens=False)
    tt = TokenText(tok)
    pieces = [tt.get(i) for i in ids]
    assert b"".join(bytes(raw) for _, raw in pieces) == "🙂".encode("utf-8")
    if len(ids) > 1:  # split over tokens: no piece alone is the character
        assert all(text != "🙂" for text, _ in pieces)
        assert any("\ufffd" in text for text, _ in pieces)


def test_whole_tokens_read_as_decode_and_special_tokens_as_their_text(tok):
    tt = TokenText(tok)
    for i in tok.encode("The quick brown fox", add_special_tokens=False):
        assert tt.get(i) == (tok.decode([i]), list(tok.decode([i]).encode("utf-8")))
    bos = tok.convert_tokens_to_ids("<|bos|>")
    assert tt.get(bos) == ("<|bos|>", list(b"<|bos|>"))
    assert tt.get(bos) is tt.get(bos)  # cached
