"""Chat templates render exactly as transformers' apply_chat_template does."""

from __future__ import annotations

from datetime import datetime

import pytest

from conftest import V3_TOKENIZER_DIR as V3_DIR
from conftest import require_asset, require_module

from deepinfer.chat import ChatTemplateError, render_chat_template, select_chat_template
from deepinfer.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def ours():
    require_asset(V3_DIR / "tokenizer.json")
    return Tokenizer.from_dir(V3_DIR)


@pytest.fixture(scope="module")
def hf():
    require_asset(V3_DIR / "tokenizer.json")
    transformers = require_module("transformers")
    transformers.logging.set_verbosity_error()
    return transformers.AutoTokenizer.from_pretrained(str(V3_DIR))


SYSTEM_USER = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
MULTI_TURN = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Hi!"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Translate 'cat' into Russian and Chinese."},
    {"role": "assistant", "content": "кошка / 猫"},
    {"role": "user", "content": "Thanks 🎉"},
]
TWO_SYSTEMS = [
    {"role": "system", "content": "First rule."},
    {"role": "user", "content": "q1"},
    {"role": "system", "content": "Second rule."},
    {"role": "user", "content": "q2"},
]
USER_ONLY = [{"role": "user", "content": "  spaces  \n\n and newlines\t"}]
TOOL_RESULTS = [  # tool outputs and a final answer (no None values)
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": "Let me check."},
    {"role": "tool", "content": '{"temp": 21}'},
    {"role": "tool", "content": '{"temp": 25}'},
    {"role": "assistant", "content": "Paris 21°C, Rome 25°C."},
    {"role": "user", "content": "And tomorrow?"},
]
ENDS_WITH_TOOL = TOOL_RESULTS[:4]
TOOL_CALLS = [  # OpenAI-style: the assistant turn carries only tool calls, content is null
    {"role": "system", "content": "You can call tools."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
    ]},
    {"role": "tool", "content": '{"temp": 21}'},
    {"role": "tool", "content": '{"temp": 25}'},
    {"role": "assistant", "content": "Paris 21°C, Rome 25°C."},
]

CONVERSATIONS = {
    "system_user": SYSTEM_USER,
    "multi_turn": MULTI_TURN,
    "two_systems": TWO_SYSTEMS,
    "user_only": USER_ONLY,
    "tool_results": TOOL_RESULTS,
    "ends_with_tool": ENDS_WITH_TOOL,
}


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_deepseek_v3_template_matches_transformers(ours, hf, name, add_generation_prompt):
    msgs = CONVERSATIONS[name]
    expected = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt)
    got = ours.apply_chat_template(msgs, add_generation_prompt=add_generation_prompt)
    assert got == expected
    ids = ours.apply_chat_template(msgs, add_generation_prompt=add_generation_prompt, tokenize=True)
    hf_ids = hf.apply_chat_template(msgs, tokenize=True, return_dict=False,
                                    add_generation_prompt=add_generation_prompt)
    assert ids == list(hf_ids)
    assert ids[0] == 0 and ids[1] != 0  # the template writes BOS once


def test_default_generation_prompt_and_known_output(ours):
    assert ours.apply_chat_template(SYSTEM_USER) == (
        "<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>What is the capital of France?<｜Assistant｜>"
    )


def test_tool_calls_match_transformers_renderer(ours, hf):
    # transformers 5's apply_chat_template drops None-valued keys, which makes DeepSeek's
    # `content is none` test fail (UndefinedError); its renderer (render_jinja_template) keeps
    # them, like transformers 4. That renderer is the reference for tool-call turns.
    from transformers.utils.chat_template_utils import render_jinja_template

    for add_gen in (True, False):
        expected, _ = render_jinja_template(
            conversations=[TOOL_CALLS], chat_template=hf.chat_template, add_generation_prompt=add_gen,
            **hf.special_tokens_map,
        )
        assert ours.apply_chat_template(TOOL_CALLS, add_generation_prompt=add_gen) == expected[0]
    rendered = ours.apply_chat_template(TOOL_CALLS)
    assert ("<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
            '```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜>') in rendered
    assert "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>" in rendered


# A template exercising the environment's features (not DeepSeek's): compared with transformers.
FEATURE_TEMPLATE = """
{%- set ns = namespace(n=0) -%}
{{ bos_token }}
{% for m in messages %}
  {% if loop.index > 3 %}{% break %}{% endif %}
  {% if m.role == 'skip' %}{% continue %}{% endif %}
  {% set ns.n = ns.n + 1 %}
[{{ m.role }}] {{ m.content | trim }}
{% endfor %}
tools={{ tools | tojson }}
tools_pretty={{ tools | tojson(indent=2) }}
docs={{ documents | tojson(sort_keys=true, separators=(',', ':')) }}
html_chars={{ {'a': '<b>&"\\'</b>'} | tojson }}
count={{ ns.n }} extra={{ extra_flag }} eos={{ eos_token }}
d={{ dict(a=1, b=[1, 2]) | tojson }} year={{ strftime_now('%Y') }}
{%- if add_generation_prompt %}
GEN{% endif %}
"""


def test_feature_template_matches_transformers(ours, hf):
    msgs = [
        {"role": "user", "content": "  one  "},
        {"role": "skip", "content": "ignored"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "past the break"},
    ]
    tools = [{"type": "function", "function": {"name": "f", "description": "héllo ✓",
                                               "parameters": {"type": "object", "properties": {}}}}]
    docs = [{"title": "Doc", "text": "Body <tag>"}]
    for add_gen in (True, False):
        expected = hf.apply_chat_template(msgs, chat_template=FEATURE_TEMPLATE, tools=tools, documents=docs,
                                          tokenize=False, add_generation_prompt=add_gen, extra_flag=True)
        got = ours.apply_chat_template(msgs, chat_template=FEATURE_TEMPLATE, tools=tools, documents=docs,
                                       add_generation_prompt=add_gen, extra_flag=True)
        assert got == expected
    assert f"year={datetime.now().year}" in got or f"year={datetime.now().year - 1}" in got


def test_continue_final_message_matches_transformers(ours, hf):
    msgs = SYSTEM_USER + [{"role": "assistant", "content": "The capital is"}]
    expected = hf.apply_chat_template(msgs, tokenize=False, continue_final_message=True)
    got = ours.apply_chat_template(msgs, add_generation_prompt=False, continue_final_message=True)
    assert got == expected
    assert got.endswith("<｜Assistant｜>The capital is")
    with pytest.raises(ValueError):
        ours.apply_chat_template(msgs, add_generation_prompt=True, continue_final_message=True)


def test_reasoning_aliases_and_objects():
    from dataclasses import dataclass

    @dataclass
    class Msg:
        role: str
        content: str
        reasoning: str | None = None

    tpl = "{% for m in messages %}{{ m.role }}:{{ m.content }}|{{ m.reasoning_content }}|{{ m.thinking }};{% endfor %}"
    out = render_chat_template(tpl, [Msg("assistant", "a", "why"), {"role": "user", "content": "u"}])
    assert out == "assistant:a|why|why;user:u||;"


def test_raise_exception_and_errors(ours):
    tpl = "{% if messages[0].role != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}ok"
    assert render_chat_template(tpl, [{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(ChatTemplateError, match="first message must be from the user"):
        render_chat_template(tpl, [{"role": "assistant", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="compile"):
        render_chat_template("{% for %}", [{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match="empty"):
        ours.apply_chat_template([])
    # The sandbox refuses attribute tricks.
    with pytest.raises(ChatTemplateError):
        render_chat_template("{{ messages.__class__.__mro__ }}", [{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError):
        render_chat_template("{% set ns = namespace() %}{% set ns._x = 1 %}", [{"role": "user", "content": "x"}])


def test_missing_template_is_a_clear_value_error():
    with pytest.raises(ValueError, match="no chat template"):
        select_chat_template(None)
    with pytest.raises(ValueError, match="default"):
        select_chat_template({"a": "x", "b": "y"})
    assert select_chat_template({"a": "x", "default": "d"}) == "d"
    assert select_chat_template({"a": "x", "default": "d"}, "a") == "x"
    assert select_chat_template({"tool_use": "t", "default": "d"}, tools=[]) == "t"
    assert select_chat_template("tpl") == "tpl"
    assert select_chat_template("tpl", "{{ 1 }}") == "{{ 1 }}"


def test_tokenizer_without_template(tmp_path):
    require_asset(V3_DIR / "tokenizer.json")
    import shutil

    shutil.copyfile(V3_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    tok = Tokenizer.from_dir(tmp_path)
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])
