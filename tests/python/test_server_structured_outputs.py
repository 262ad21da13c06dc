"""Structured outputs through the real server, with the official `openai` client: response_format json_object and
json_schema, vLLM's structured_outputs / guided_* extensions, and tool_choice "required" / a named function, whose
grammar forces a DeepSeek tool-call block with valid arguments.

Two servers, one each for the module:

- the embedded demo model (its own 4096-token tokenizer, without DeepSeek's tool-call tokens) for JSON, regex,
  choice and grammar outputs, and the errors;
- a tiny checkpoint with DeepSeek-V3's vocabulary (so its tokenizer, and the tool-call special tokens), written here
  as a *bigram* model: every layer's output projections are zero, so the last hidden state is the current token's
  embedding, and the embeddings and lm_head are set so that any token is most likely followed by "</", "</" by
  "think", "think" by ">" and ">" by '"'. Unconstrained, it writes "</think>" at once (what ends R1's reasoning); in
  a JSON string it soon writes '"'. Everything else is left to the grammar: the model knows nothing of tool calls.
"""

from __future__ import annotations

import json
import re

import pytest

from conftest import require_module, tiny_config

httpx = require_module("httpx")
openai = require_module("openai")
jsonschema = require_module("jsonschema")
require_module("fastapi")
require_module("uvicorn")
require_module("llguidance")

from test_server import ServerProcess, assert_error  # noqa: E402

V3_VOCAB = 129280  # DeepSeek-V3's config.json (the tokenizer's 128815 tokens, padded)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city", "strict": True,
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                   "properties": {"city": {"type": "string", "maxLength": 12},
                                  "unit": {"enum": ["celsius", "fahrenheit"]},
                                  "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The time now"}}  # no parameters
TOOLS = [WEATHER, CLOCK]
ARGUMENT_SCHEMAS = {"get_weather": WEATHER["function"]["parameters"], "get_time": {"type": "object"}}

PERSON = {
    "type": "object", "additionalProperties": False, "required": ["name", "age", "tags", "address", "kind"],
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        "address": {"type": "object", "additionalProperties": False, "required": ["city", "zip"],
                    "properties": {"city": {"type": "string", "maxLength": 16},
                                   "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}},
        "kind": {"enum": ["cat", "dog", "fox"]},
    },
}
PROMPTS = ["Describe a person as JSON.", "Who lives in the castle?", "Tell me about the king"]


def write_bigram_checkpoint(path):
    """The tiny DeepSeek-V3-vocabulary bigram model the module docstring describes (bf16, ~50 MB)."""
    import torch
    from transformers import DeepseekV3ForCausalLM

    from deepinfer.tokenizer import Tokenizer

    tok = Tokenizer.default_deepseek_v3()
    (lt,), (think,), (gt,), (quote,), (brace,) = (tok.encode(s, add_special_tokens=False)
                                                 for s in ("</", "think", ">", '"', "}"))
    config = tiny_config("v3", vocab_size=V3_VOCAB, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    model = DeepseekV3ForCausalLM(config).eval()
    scale = config.hidden_size ** 0.5  # the final RMSNorm maps 10 * e_k to sqrt(hidden) * e_k
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "o_proj" in name or "down_proj" in name:
                p.zero_()  # attention and MLPs add nothing: the residual stream is the token's embedding
        emb = model.model.embed_tokens.weight
        emb.zero_()
        emb[:, 0] = 10.0
        for k, token in enumerate((lt, think, gt), start=1):
            emb[token, 0], emb[token, k] = 0.0, 10.0
        model.model.norm.weight.fill_(1.0)
        head = model.lm_head.weight
        head.zero_()
        head[lt, 0] = 12.0 / scale     # any token -> "</" (or '"' / "}", a little less likely)
        head[quote, 0] = head[brace, 0] = 10.0 / scale
        head[think, 1] = 30.0 / scale  # "</" -> "think"
        head[gt, 2] = 30.0 / scale     # "think" -> ">"
        head[quote, 3] = 30.0 / scale  # ">" -> '"'
    model.to(torch.bfloat16).save_pretrained(path)  # no tokenizer files: the server takes DeepSeek-V3's
    return path


def _start(*args):
    srv = ServerProcess(*args)
    srv.wait_ready()
    return srv


@pytest.fixture(scope="module")
def demo_server():
    srv = _start("--max-model-len", "1024", "--max-num-seqs", "16")
    try:
        yield srv
    finally:
        assert srv.stop() == 0


@pytest.fixture(scope="module")
def bigram_dir(tmp_path_factory):
    return write_bigram_checkpoint(tmp_path_factory.mktemp("bigram") / "ckpt")


@pytest.fixture(scope="module")
def tool_server(bigram_dir):
    srv = _start(str(bigram_dir), "--max-model-len", "512", "--max-num-seqs", "16", "--reasoning-parser",
                 "deepseek-r1")
    try:
        yield srv
    finally:
        assert srv.stop() == 0


class Client:
    """The official client, with the served model's name filled in."""

    def __init__(self, server):
        self.openai = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0, timeout=120)
        self.model = self.openai.models.list().data[0].id

    def chat(self, **kwargs):
        return self.openai.chat.completions.create(model=self.model, **kwargs)

    def complete(self, **kwargs):
        return self.openai.completions.create(model=self.model, **kwargs)


def client_of(server):
    return Client(server)


@pytest.fixture(scope="module")
def demo(demo_server):
    return client_of(demo_server)


@pytest.fixture(scope="module")
def tools_client(tool_server):
    return client_of(tool_server)


def post(server, path, body):
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=60)


def chat_body(**kwargs):
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, **kwargs}


# ----------------------------------------------------------------------------------------------- JSON outputs


def test_json_schema_outputs_validate(demo):
    """Strict json_schema with nested objects, arrays and enums: every output parses and validates (chat and
    completions, several prompts and seeds, sampled)."""
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    outputs = []
    for i, prompt in enumerate(PROMPTS):
        r = demo.chat(messages=[{"role": "user", "content": prompt}], max_tokens=200,
                      temperature=0.9, seed=i, response_format=rf, n=2)
        outputs += [(c.message.content, c.finish_reason) for c in r.choices]
    r = demo.complete(prompt="KING RICHARD:", max_tokens=200, temperature=1.0, seed=7,
                      extra_body={"response_format": rf})
    outputs.append((r.choices[0].text, r.choices[0].finish_reason))
    for text, finish in outputs:
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), PERSON)
    assert len({text for text, _ in outputs}) > 1  # sampled, not one forced string


def test_json_schema_streamed(demo):
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    chunks = list(demo.chat(messages=[{"role": "user", "content": "Hi"}], max_tokens=200, temperature=0.8, seed=3,
                            response_format=rf, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), PERSON)
    assert chunks[-1].choices[0].finish_reason == "stop"
    whole = demo.chat(messages=[{"role": "user", "content": "Hi"}], max_tokens=200,
                      temperature=0.8, seed=3, response_format=rf)
    assert whole.choices[0].message.content == text


def test_json_object(demo):
    """Any JSON object: a finished output parses as an object (the demo model, trained on plays, sometimes writes
    a key it never closes; such an output ends by max_tokens, still an object's beginning)."""
    finished = 0
    for seed in range(4):
        r = demo.chat(messages=[{"role": "user", "content": "A JSON object"}],
                      max_tokens=60, temperature=0.7, seed=seed,
                      response_format={"type": "json_object"})
        c = r.choices[0]
        assert c.message.content.startswith("{")
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.message.content), dict)
            finished += 1
    assert finished >= 1


def test_vllm_extension_fields(demo):
    """structured_outputs (vLLM's current names) and guided_* (its older ones), on both endpoints."""
    regex = r"[a-z]{3}-[0-9]{2,4}"
    choices = ["yes", "no", "maybe"]
    grammar = 'start: "(" NUM ("+" NUM)* ")"\nNUM: /[0-9]{1,3}/\n'
    gbnf = 'root ::= "<" [a-c] [a-c]? [a-c]? ">"'
    for seed in range(3):
        for extra, check in [
            ({"structured_outputs": {"regex": regex}}, lambda t: re.fullmatch(regex, t)),
            ({"guided_regex": regex}, lambda t: re.fullmatch(regex, t)),
            ({"structured_outputs": {"choice": choices}}, lambda t: t in choices),
            ({"guided_choice": choices, "guided_decoding_backend": "guidance"}, lambda t: t in choices),
            ({"structured_outputs": {"grammar": grammar}}, lambda t: re.fullmatch(r"\(\d{1,3}(\+\d{1,3})*\)", t)),
            ({"guided_grammar": gbnf}, lambda t: re.fullmatch(r"<[a-c]{1,3}>", t)),
            ({"guided_json": PERSON}, lambda t: jsonschema.validate(json.loads(t), PERSON) is None),
        ]:
            r = demo.chat(messages=[{"role": "user", "content": "Say it"}],
                          max_tokens=200, temperature=1.0, seed=seed, extra_body=extra)
            text = r.choices[0].message.content
            assert r.choices[0].finish_reason == "stop" and check(text), (extra, text)
            c = demo.complete(prompt="ROMEO:", max_tokens=200, temperature=1.0, seed=seed, extra_body=extra)
            assert c.choices[0].finish_reason == "stop" and check(c.choices[0].text), (extra, c.choices[0].text)
    # Whitespace options: any whitespace allowed between JSON tokens, or a pattern of one's own.
    r = demo.complete(prompt="A:", max_tokens=200, temperature=1.0, seed=1, extra_body={
                      "structured_outputs": {"json": PERSON, "whitespace_pattern": r"[ ]?"}})
    jsonschema.validate(json.loads(r.choices[0].text), PERSON)
    assert "\n" not in r.choices[0].text


def test_bad_schemas_and_grammars_are_400s(demo_server):
    def err(path, body, param):
        return assert_error(post(demo_server, path, body), 400, param=param)

    bad_type = {"type": "object", "properties": {"a": {"type": "strng"}}}
    e = err("/v1/chat/completions", chat_body(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": bad_type}}), "response_format.json_schema.schema")
    assert "strng" in e["message"], e
    e = err("/v1/completions", {"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"$ref": "#/$defs/missing"}}}}, "response_format.json_schema.schema")
    assert "missing" in e["message"], e
    e = err("/v1/completions", {"prompt": "x", "structured_outputs": {"regex": "(["}}, "structured_outputs.regex")
    assert "regex" in e["message"], e
    e = err("/v1/chat/completions", chat_body(guided_grammar="start: nothing_defined"), "guided_grammar")
    assert "nothing_defined" in e["message"], e
    # Shapes.
    err("/v1/chat/completions", chat_body(response_format={"type": "json_schema"}), "response_format.json_schema")
    err("/v1/chat/completions", chat_body(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
        "response_format.json_schema.schema")
    err("/v1/chat/completions", chat_body(response_format={"type": "json_schema", "json_schema": {
        "schema": PERSON}}), "response_format.json_schema.name")
    err("/v1/chat/completions", chat_body(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": "{}"}}), "response_format.json_schema.schema")
    e = err("/v1/chat/completions", chat_body(response_format={"type": "yaml"}), "response_format.type")
    assert "yaml" in e["message"]
    err("/v1/chat/completions", chat_body(response_format={}), "response_format.type")
    assert_error(post(demo_server, "/v1/chat/completions", chat_body(response_format={"type": "structural_tag"})), 400,
                 param="response_format.type", code="unsupported_parameter")
    err("/v1/chat/completions", chat_body(response_format="json"), "response_format")
    err("/v1/completions", {"prompt": "x", "structured_outputs": {"regexp": "a"}}, "structured_outputs")
    err("/v1/completions", {"prompt": "x", "structured_outputs": {"choice": []}}, "structured_outputs.choice")
    err("/v1/completions", {"prompt": "x", "structured_outputs": {"disable_any_whitespace": False}},
        "structured_outputs")
    err("/v1/completions", {"prompt": "x", "guided_json": "{not json"}, "guided_json")
    e = assert_error(post(demo_server, "/v1/completions", {"prompt": "x", "guided_regex": "a",
                                                           "guided_decoding_backend": "xgrammar"}),
                     400, param="guided_decoding_backend", code="unsupported_parameter")
    assert "llguidance" in e["message"]


def test_two_constraints_are_a_400(demo_server):
    rf = {"type": "json_object"}
    for path, body in [
        ("/v1/chat/completions", chat_body(response_format=rf, structured_outputs={"regex": "a+"})),
        ("/v1/chat/completions", chat_body(guided_regex="a+", guided_choice=["a"])),
        ("/v1/completions", {"prompt": "x", "response_format": rf, "guided_json": PERSON}),
        ("/v1/completions", {"prompt": "x", "structured_outputs": {"regex": "a", "choice": ["a"]}}),
        ("/v1/chat/completions", chat_body(response_format=rf, tools=TOOLS, tool_choice="required")),
    ]:
        e = assert_error(post(demo_server, path, body), 400, code="invalid_value")
        assert "both constrain" in e["message"], e


def test_tool_choice_needs_the_tool_call_tokens(demo_server, demo):
    """The demo model's tokenizer has no <｜tool▁calls▁begin｜>: a forced call cannot be written, and says so."""
    e = assert_error(post(demo_server, "/v1/chat/completions", chat_body(tools=TOOLS, tool_choice="required")), 400,
                     param="tool_choice", code="unsupported_parameter")
    assert "tool-call tokens" in e["message"]
    # "auto" is still free text, and bad tool_choice values name the parameter.
    r = demo.chat(messages=[{"role": "user", "content": "hi"}], tools=TOOLS,
                  tool_choice="auto", max_tokens=4)
    assert r.choices[0].message.tool_calls is None
    for value in ["sometimes", {"type": "function"}, {"type": "function", "function": {"name": "nope"}}]:
        assert_error(post(demo_server, "/v1/chat/completions", chat_body(tools=TOOLS, tool_choice=value)), 400,
                     param="tool_choice")
    assert_error(post(demo_server, "/v1/chat/completions", chat_body(tool_choice="required")), 400,
                 param="tool_choice")


# ----------------------------------------------------------------------------------------------- forced tool calls


def check_calls(calls, names=None):
    assert calls
    for call in calls:
        name, arguments = call.function.name, call.function.arguments
        assert name in (names or ARGUMENT_SCHEMAS), name
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(arguments), ARGUMENT_SCHEMAS[name])


def streamed_calls(chunks):
    """(content, reasoning, [(name, arguments)], finish_reason) rebuilt from a stream's deltas."""
    calls: dict[int, list[str]] = {}
    content, reasoning = "", ""
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += getattr(delta, "reasoning_content", None) or ""
        for d in delta.tool_calls or []:
            entry = calls.setdefault(d.index, ["", ""])
            if d.function.name:
                assert d.id.startswith("call_") and not entry[0]
                entry[0] = d.function.name
            entry[1] += d.function.arguments or ""
    return content, reasoning, [tuple(calls[i]) for i in sorted(calls)], chunks[-1].choices[0].finish_reason


def test_tool_choice_required(tools_client):
    """The grammar forces a tool-call block out of a model that never writes one: each call names a tool and its
    arguments validate against that tool's parameters; finish_reason tool_calls. Streamed and whole agree."""
    seen = set()
    for seed in range(3):
        kwargs = dict(messages=[{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS,
                      tool_choice="required", max_tokens=300, temperature=1.0, seed=seed)
        r = tools_client.chat(logprobs=True, **kwargs)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c
        assert not c.message.content
        check_calls(c.message.tool_calls)
        raw = "".join(t.token for t in c.logprobs.content)  # DeepSeek-V3's form, as --tool-call-parser says
        raw = raw[raw.find("<｜tool▁calls▁begin｜>"):]  # after R1's reasoning, when the output wrote one
        assert raw.startswith("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_"), raw
        assert "\n```json\n{" in raw and raw.endswith("<｜tool▁call▁end｜><｜tool▁calls▁end｜>"), raw
        seen |= {call.function.name for call in c.message.tool_calls}
        content, _, calls, finish = streamed_calls(list(tools_client.chat(stream=True, **kwargs)))
        assert finish == "tool_calls" and not content
        assert calls == [(t.function.name, t.function.arguments) for t in c.message.tool_calls]
    assert seen == {"get_weather", "get_time"}


def test_tool_choice_required_one_call_without_parallel(tools_client):
    for seed in range(3):
        r = tools_client.chat(messages=[{"role": "user", "content": "Weather?"}], tools=TOOLS, tool_choice="required",
                              parallel_tool_calls=False, max_tokens=200, temperature=1.0, seed=seed)
        assert r.choices[0].finish_reason == "tool_calls"
        assert len(r.choices[0].message.tool_calls) == 1
        check_calls(r.choices[0].message.tool_calls)


def test_tool_choice_named(tools_client):
    for name in ("get_weather", "get_time"):
        kwargs = dict(messages=[{"role": "user", "content": "Now?"}], tools=TOOLS, max_tokens=200,
                      tool_choice={"type": "function", "function": {"name": name}}, temperature=1.0, seed=5)
        r = tools_client.chat(**kwargs)
        assert r.choices[0].finish_reason == "tool_calls"
        (call,) = r.choices[0].message.tool_calls
        assert call.function.name == name
        check_calls([call], {name})
        _, _, calls, finish = streamed_calls(list(tools_client.chat(stream=True, **kwargs)))
        assert finish == "tool_calls" and calls == [(name, call.function.arguments)]


def test_tool_result_turn(tools_client):
    """A conversation with an assistant tool call and its result renders (DeepSeek-V3's template) and answers: free
    text with tool_choice auto, a new call with required."""
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"celsius": 21})},
    ]
    r = tools_client.chat(messages=messages, tools=TOOLS, max_tokens=6, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.tool_calls is None
    first = tools_client.chat(messages=messages[:1], tools=TOOLS, max_tokens=1, temperature=0)
    assert r.usage.prompt_tokens > first.usage.prompt_tokens + 20  # the call and its result are in the prompt
    r = tools_client.chat(messages=messages, tools=TOOLS, tool_choice="required", max_tokens=200, temperature=1.0,
                          seed=1)
    assert r.choices[0].finish_reason == "tool_calls"
    check_calls(r.choices[0].message.tool_calls)


def test_reasoning_then_tool_call(tools_client):
    """With --reasoning-parser deepseek-r1, a prompt that opens <think> gets free reasoning up to </think>, then the
    forced call: reasoning_content, then tool_calls; streamed the same."""
    template = ("{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}<think>\n{% endif %}")
    kwargs = dict(messages=[{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS,
                  tool_choice="required", max_tokens=300, temperature=1.0,
                  extra_body={"chat_template_kwargs": {"chat_template": template}})
    reasonings = []
    for seed in range(2, 4):
        kwargs["seed"] = seed
        c = tools_client.chat(**kwargs).choices[0]
        assert c.finish_reason == "tool_calls", c
        assert c.message.reasoning_content is not None and "</think>" not in c.message.reasoning_content
        reasonings.append(c.message.reasoning_content)
        assert not c.message.content
        check_calls(c.message.tool_calls)
        content, reasoning, calls, finish = streamed_calls(list(tools_client.chat(stream=True, **kwargs)))
        assert finish == "tool_calls" and not content and reasoning == c.message.reasoning_content
        assert calls == [(t.function.name, t.function.arguments) for t in c.message.tool_calls]
    assert any(reasonings)  # the model wrote some reasoning text before its "</think>"
    # Without an opened <think>, the output may reason first or call at once; either way a call comes.
    r = tools_client.chat(messages=[{"role": "user", "content": "Hi"}], tools=TOOLS, tool_choice="required",
                          max_tokens=300, temperature=1.0, seed=3)
    assert r.choices[0].finish_reason == "tool_calls"
    check_calls(r.choices[0].message.tool_calls)


def test_bad_tool_schema_is_a_400(tool_server):
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "integr"}}}}}
    e = assert_error(post(tool_server, "/v1/chat/completions", chat_body(tools=[bad], tool_choice="required")),
                     400, param="tools")
    assert "integr" in e["message"], e


def test_deepseek_v31_form(bigram_dir):
    """--tool-call-parser deepseek_v31: the forced call is written NAME<｜tool▁sep｜>ARGS (no "function", no fence),
    and parsed back."""
    srv = _start(str(bigram_dir), "--max-model-len", "512", "--tool-call-parser", "deepseek_v31")
    try:
        client = client_of(srv)
        named = {"type": "function", "function": {"name": "get_weather"}}
        r = client.chat(messages=[{"role": "user", "content": "Weather?"}], tools=TOOLS, tool_choice=named,
                        max_tokens=200, temperature=1.0, seed=4, logprobs=True)
        assert r.choices[0].finish_reason == "tool_calls"
        check_calls(r.choices[0].message.tool_calls, {"get_weather"})
        raw = "".join(t.token for t in r.choices[0].logprobs.content)
        assert raw.startswith("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"), raw
        assert raw.endswith("}<｜tool▁call▁end｜><｜tool▁calls▁end｜>") and "```" not in raw, raw
    finally:
        assert srv.stop() == 0


# ----------------------------------------------------------------------------------------------- the grammar itself


def test_tool_call_grammar_accepts_exactly_the_tool_call_block():
    """The grammar tool_choice builds, through llguidance's matcher on DeepSeek-V3's tokens: what it accepts and
    what it refuses, in both forms, with and without parallel calls, a named function and R1's reasoning."""
    import llguidance

    from deepinfer.server.structured import tool_call_grammar, tool_call_token_ids
    from deepinfer.tokenizer import Tokenizer

    tok = Tokenizer.default_deepseek_v3()
    lltok = llguidance.LLTokenizer(tok.to_json(), n_vocab=V3_VOCAB, eos_token=1)
    ids = tool_call_token_ids(tok)
    assert ids == {"calls_begin": 128806, "calls_end": 128807, "call_begin": 128808, "call_end": 128809,
                   "sep": 128814}

    def accepts(text, **kwargs):
        grammar = tool_call_grammar(TOOLS, ids, **kwargs)
        m = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
        assert not m.is_error(), m.get_error()
        return all(m.consume_token(t) for t in tok.encode(text, add_special_tokens=False)) and m.is_accepting()

    def v3(name, args):
        return f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>"

    def v31(name, args):
        return f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜>"

    def block(*calls):
        return "<｜tool▁calls▁begin｜>" + "\n".join(calls) + "<｜tool▁calls▁end｜>"

    paris, clock = '{"city": "Paris", "unit": "celsius"}', "{}"
    assert accepts(block(v3("get_weather", paris)))
    assert accepts(block(v3("get_weather", paris), v3("get_time", '{"tz": "CET"}')))
    assert not accepts(block(v3("get_weather", paris), v3("get_time", clock)), parallel=False)
    assert not accepts(block(v3("get_weather", '{"city": "Paris"}')))                     # "unit" is required
    assert not accepts(block(v3("get_weather", '{"city": "Paris", "unit": "kelvin"}')))   # not in the enum
    assert not accepts(block(v3("get_weather", paris[:-1] + ', "x": 1}')))               # additionalProperties
    assert not accepts(block(v3("get_time", "[]")))                                      # arguments are an object
    assert not accepts(block(v3("get_date", clock)))                                     # no such tool
    assert not accepts("Sure. " + block(v3("get_time", clock)))                          # the block comes first
    assert accepts(block(v3("get_time", clock)), name="get_time")
    assert not accepts(block(v3("get_weather", paris)), name="get_time")
    assert accepts(block(v31("get_weather", paris)), form="deepseek_v31")
    assert not accepts(block(v3("get_weather", paris)), form="deepseek_v31")
    assert not accepts(block(v31("get_weather", paris)))
    call = block(v3("get_time", clock))
    assert accepts("Let me see: a < b </thinking> no.</think>\n\n" + call, reasoning="open")
    assert not accepts(call, reasoning="open")
    assert accepts("<think>\nHm.\n</think>\n\n" + call, reasoning="optional")
    assert accepts(call, reasoning="optional")
