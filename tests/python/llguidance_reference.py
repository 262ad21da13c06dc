"""llguidance's matcher through its own C interface (ctypes), configured as the engine configures it: the reference
the structured-output tests drive transformers' greedy decoding with.

Why not llguidance's Python tokenizer: it tokenizes forced text with the checkpoint's BPE and then allows only that
(canonical) tokenization, while the C interface has no BPE, so the engine's matcher (llguidance's greedy tokenizer)
allows any tokenization of forced text. The masks are the library's either way; this one is the engine's semantics."""

from __future__ import annotations

import ctypes


class _TokenizerInit(ctypes.Structure):
    _fields_ = [("vocab_size", ctypes.c_uint32), ("tok_eos", ctypes.c_uint32), ("token_lens", ctypes.c_void_p),
                ("token_bytes", ctypes.c_void_p), ("tokenizer_json", ctypes.c_char_p),
                ("tokenize_assumes_string", ctypes.c_bool), ("tokenize_fn", ctypes.c_void_p),
                ("use_approximate_greedy_tokenize_fn", ctypes.c_bool), ("tokenize_user_data", ctypes.c_void_p),
                ("slices", ctypes.c_void_p)]


class _ParserLimits(ctypes.Structure):
    _fields_ = [("max_items_in_row", ctypes.c_size_t), ("initial_lexer_fuel", ctypes.c_uint64),
                ("step_lexer_fuel", ctypes.c_uint64), ("step_max_items", ctypes.c_size_t),
                ("max_lexer_states", ctypes.c_size_t), ("max_grammar_size", ctypes.c_size_t),
                ("precompute_large_lexemes", ctypes.c_bool), ("verbose_errors", ctypes.c_bool)]


class _ConstraintInit(ctypes.Structure):
    _fields_ = [("tokenizer", ctypes.c_void_p), ("log_buffer_level", ctypes.c_uint32),
                ("log_stderr_level", ctypes.c_uint32), ("ff_tokens_ok", ctypes.c_bool),
                ("backtrack_ok", ctypes.c_bool), ("limits", _ParserLimits)]


class Matcher:
    """One grammar's matcher over `tokenizer_json` (a tokenizer.json text) with `vocab_size` mask bits."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_id: int, kind: str, grammar: str):
        import llguidance._lib

        lib = self._lib = ctypes.CDLL(llguidance._lib.__file__)
        lib.llg_new_tokenizer.restype = ctypes.c_void_p
        lib.llg_new_matcher.restype = ctypes.c_void_p
        lib.llg_matcher_get_error.restype = ctypes.c_char_p
        lib.llg_matcher_get_mask_byte_size.restype = ctypes.c_size_t
        lib.llg_matcher_is_stopped.restype = ctypes.c_bool
        self._json = tokenizer_json.encode()  # the library reads it during llg_new_tokenizer only
        init = _TokenizerInit(vocab_size=vocab_size, tok_eos=eos_token_id, tokenizer_json=self._json,
                              use_approximate_greedy_tokenize_fn=True)
        error = ctypes.create_string_buffer(1024)
        self._tokenizer = lib.llg_new_tokenizer(ctypes.byref(init), error, 1024)
        assert self._tokenizer, error.value.decode()
        constraint = _ConstraintInit()
        lib.llg_constraint_init_set_defaults(ctypes.byref(constraint), ctypes.c_void_p(self._tokenizer))
        constraint.log_stderr_level = 0
        self._matcher = ctypes.c_void_p(lib.llg_new_matcher(ctypes.byref(constraint), kind.encode(), grammar.encode()))
        assert lib.llg_matcher_get_error(self._matcher) is None, lib.llg_matcher_get_error(self._matcher)
        self._bytes = lib.llg_matcher_get_mask_byte_size(self._matcher)
        self.vocab_size = vocab_size

    def allowed(self) -> list[bool]:
        words = (ctypes.c_uint32 * (self._bytes // 4))()
        assert self._lib.llg_matcher_compute_mask_into(self._matcher, words, ctypes.c_size_t(self._bytes)) == 0
        return [bool((words[t // 32] >> (t % 32)) & 1) for t in range(self.vocab_size)]

    def consume(self, token: int) -> None:
        assert self._lib.llg_matcher_consume_token(self._matcher, ctypes.c_uint32(token)) == 0, \
            self._lib.llg_matcher_get_error(self._matcher)

    def is_stopped(self) -> bool:
        return bool(self._lib.llg_matcher_is_stopped(self._matcher))

    def __del__(self) -> None:
        lib = getattr(self, "_lib", None)
        if lib is not None and getattr(self, "_matcher", None):
            lib.llg_free_matcher(self._matcher)
        if lib is not None and getattr(self, "_tokenizer", None):
            lib.llg_free_tokenizer(ctypes.c_void_p(self._tokenizer))
