#!/usr/bin/env python3
"""make_chat_goldens.py: renders the chat-template golden fixtures for src/text/chat_test.c.

Usage (with the reference venv, which has transformers + jinja2):
    /opt/refvenv/bin/python tools/reference/make_chat_goldens.py \
        --template /path/to/Qwen3.5.jinja --out tests/fixtures/chat/goldens.json

--template is the official Qwen3.5 chat template text. It is NOT committed (text from outside the
project). It is the `tokenizer.chat_template` of any Qwen3.5/3.6 GGUF, or llama.cpp's
models/templates/Qwen3.5-4B.jinja as added upstream in commit 98ae0a0d3 (2026-03-28); the sha256
of the file used is recorded in the output ("template_sha256"). `--template` may also be a .gguf,
from which tokenizer.chat_template is read.

Flavors:
  qwen35  rendered by transformers' render_jinja_template (the engine behind apply_chat_template)
          from the official template text, unmodified.
  qwen38  no official Qwen3.8 template was available offline. The Qwen3.8 template is described as
          the Qwen3.5 one plus four changes (target-qwen35.md §4; a Qwen3.8 prompting guide that
          quotes Qwen/Qwen3.8-27B tokenizer_config.json; a public Qwen3.8 renderer with HF-parity
          tests). We build it by patching the Qwen3.5 text at run time (QWEN38_PATCHES below, each
          anchored on text that must occur exactly once) and render it the same way:
            1. reasoning_effort: xhigh (default) | medium | low, anything else raises; when thinking
               is on, xhigh/low prepend an instruction sentence to the system turn (medium: none),
               creating a system turn if there is none;
            2. assistant reasoning comes only from the reasoning_content field (no </think> split of
               content), and the <think> block is kept for every assistant turn when
               preserve_thinking is true (the default) or the turn is after the last user query;
            3. tool-call arguments: strings verbatim, everything else tojson (Qwen3.5: `| string`,
               i.e. Python str(): True, None, 2.5);
            4. an empty system message without instruction renders no system turn.
          These goldens therefore check our C renderer against this reading of the 3.8 template, not
          against the official file.

Each case: {name, flavor, options, messages, tools, expected | error}. Tool-call arguments are
stored as JSON *text* (what the C API takes); they are parsed (order-preserving) before rendering.
"""
import argparse
import hashlib
import json
import struct
import sys

from transformers.utils.chat_template_utils import render_jinja_template

# ---- Qwen3.8 patches over the Qwen3.5 template -------------------------------------------------

QWEN38_PRELUDE = """{%- set enable_thinking = enable_thinking if enable_thinking is defined else true %}
{%- set resolved_reasoning_effort = reasoning_effort|default('xhigh') %}
{%- if resolved_reasoning_effort not in ('xhigh', 'medium', 'low') %}
    {{- raise_exception('Unexpected reasoning effort ' ~ reasoning_effort ~ '. Supported types are xhigh (default), medium, and low.') }}
{%- endif %}
{%- set reasoning_instructions = '' %}
{%- if enable_thinking and resolved_reasoning_effort == 'xhigh' %}
    {%- set reasoning_instructions = 'Reasoning effort is set to xhigh. Please think carefully through the task, validate key assumptions, consider plausible alternatives, and prioritize correctness, consistency, and clarity in the final answer.' %}
{%- elif enable_thinking and resolved_reasoning_effort == 'low' %}
    {%- set reasoning_instructions = 'Reasoning effort is set to low. Keep your thinking brief and focused, moving directly to the conclusion without unnecessary elaboration.' %}
{%- endif %}
"""

QWEN38_PATCHES = [
    # (anchor, replacement)
    (
        "{%- if tools and tools is iterable and tools is not mapping %}\n    {{- '<|im_start|>system\\n' }}\n",
        "{%- if tools and tools is iterable and tools is not mapping %}\n    {{- '<|im_start|>system\\n' }}\n"
        "    {%- if reasoning_instructions %}{{- reasoning_instructions + '\\n\\n' }}{%- endif %}\n",
    ),
    (
        "{%- else %}\n    {%- if messages[0].role == 'system' %}\n"
        "        {%- set content = render_content(messages[0].content, false, true)|trim %}\n"
        "        {{- '<|im_start|>system\\n' + content + '<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}",
        "{%- else %}\n    {%- set sys_content = '' %}\n    {%- if messages[0].role == 'system' %}\n"
        "        {%- set sys_content = render_content(messages[0].content, false, true)|trim %}\n    {%- endif %}\n"
        "    {%- if sys_content and reasoning_instructions %}\n"
        "        {{- '<|im_start|>system\\n' + reasoning_instructions + '\\n\\n' + sys_content + '<|im_end|>\\n' }}\n"
        "    {%- elif sys_content or reasoning_instructions %}\n"
        "        {{- '<|im_start|>system\\n' + sys_content + reasoning_instructions + '<|im_end|>\\n' }}\n"
        "    {%- endif %}\n{%- endif %}",
    ),
    (
        "        {%- else %}\n            {%- if '</think>' in content %}\n",
        "        {%- elif false %}\n            {%- if '</think>' in content %}\n",
    ),
    (
        "{%- if loop.index0 > ns.last_query_index %}",
        "{%- if preserve_thinking is undefined or preserve_thinking is true or loop.index0 > ns.last_query_index %}",
    ),
    (
        "{%- set args_value = args_value | tojson | safe if args_value is mapping or "
        "(args_value is sequence and args_value is not string) else args_value | string %}",
        "{%- set args_value = args_value | string if args_value is string else args_value | tojson | safe %}",
    ),
]


def make_qwen38(base):
    out = base
    for anchor, repl in QWEN38_PATCHES:
        n = out.count(anchor)
        if n != 1:
            sys.exit(f"qwen38 patch anchor found {n} times (want 1):\n{anchor}")
        out = out.replace(anchor, repl)
    return QWEN38_PRELUDE + out


def read_template(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"GGUF":
        return data.decode("utf-8"), hashlib.sha256(data).hexdigest()
    import gguf  # gguf-py reads the metadata

    r = gguf.GGUFReader(path)
    field = r.fields["tokenizer.chat_template"]
    text = bytes(field.parts[field.data[0]]).decode("utf-8")
    return text, hashlib.sha256(text.encode("utf-8")).hexdigest()


# ---- conversations -----------------------------------------------------------------------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search documents. Quotes \" and backslashes \\ and unicode \u00e9\u4e2d are kept.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 100},
                "score": {"type": "number"},
                "filters": {"type": "object", "properties": {"lang": {"type": "string"}}},
                "tags": {"type": "array", "items": {"type": "string"}},
                "exact": {"type": "boolean"},
            },
            "required": ["query"],
        },
    },
}
NO_PARAMS_TOOL = {"type": "function", "function": {"name": "now", "description": "Current time.",
                                                    "parameters": {"type": "object", "properties": {}}}}


def tc(name, args):
    """A tool call with arguments given as JSON text (None = no arguments field)."""
    return {"name": name, "arguments": args}


def U(c):
    return {"role": "user", "content": c}


def A(c, reasoning=None, tool_calls=None):
    m = {"role": "assistant", "content": c}
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    if tool_calls is not None:
        m["tool_calls"] = tool_calls
    return m


def S(c):
    return {"role": "system", "content": c}


def T(c, tool_call_id=None):
    m = {"role": "tool", "content": c}
    if tool_call_id:
        m["tool_call_id"] = tool_call_id
    return m


CONVERSATIONS = [
    ("single_user", [U("Hello!")], None),
    ("system_user", [S("You are a helpful assistant."), U("What is 2+2?")], None),
    ("system_whitespace_trimmed", [S("  \n Be brief.\n\n "), U("  hi there \t\n")], None),
    ("empty_system", [S(""), U("hi")], None),
    ("multi_turn", [U("Hi"), A("Hello! How can I help?"), U("Tell me a joke."), A("Why did the chicken cross the road?"),
                    U("Another one")], None),
    ("multi_turn_system", [S("Sys."), U("a"), A("b"), U("c")], None),
    ("unicode_content", [U("Grüße, 世界! emoji \U0001F600 and \u00a0nbsp\u3000"), A("\u2003Ответ\u2003"), U("ok")], None),
    ("reasoning_before_last_query", [U("q1"), A("a1", reasoning="thinking about q1"), U("q2")], None),
    ("reasoning_after_last_query", [U("q1"), A("a1", reasoning="  r1 \n")], None),
    ("reasoning_both", [U("q1"), A("a1", reasoning="r1"), U("q2"), A("a2", reasoning="r2")], None),
    ("reasoning_empty_string", [U("q1"), A("a1", reasoning="")], None),
    ("think_in_content", [U("q1"), A("<think>\ninner reasoning\n</think>\n\nvisible answer")], None),
    ("think_in_content_history", [U("q1"), A("<think>old</think>old answer"), U("q2"),
                                  A("pre<think>\n\nnew r\n</think>\n\n  new answer")], None),
    ("think_in_content_no_open", [U("q1"), A("only close </think>after")], None),
    ("think_two_closes", [U("q"), A("<think>a</think>b</think>\nc")], None),
    ("assistant_last_no_reasoning", [U("q"), A("answer")], None),
    ("tools_basic", [U("Weather in Paris?")], [WEATHER_TOOL]),
    ("tools_with_system", [S("You are a weather bot."), U("Weather in Paris?")], [WEATHER_TOOL, SEARCH_TOOL]),
    ("tools_empty_system", [S("   "), U("Weather?")], [WEATHER_TOOL]),
    ("tools_empty_list", [U("hi")], []),
    ("tool_call_string_arg", [U("Weather in Paris?"),
                              A("", tool_calls=[tc("get_weather", '{"city": "Paris"}')]),
                              T("{\"temp\": 21, \"sky\": \"clear\"}"), A("It is 21C and clear.")], [WEATHER_TOOL]),
    ("tool_call_types", [U("search"), A("Let me search.", tool_calls=[tc(
        "search",
        '{"query": "line1\\nline2 \\"q\\" caf\\u00e9", "limit": 10, "score": 2.5, "neg": -3, "big": 1e20,'
        ' "small": 0.0001, "tiny": 1.5e-07, "whole": 3.0, "filters": {"lang": "en", "n": [1, 2.0, null]},'
        ' "tags": ["a", "b"], "exact": true, "off": false, "none": null, "empty_obj": {}, "empty_arr": [],'
        ' "nested": {"k": {"deep": ["x", {"y": "\\u4e2d\\t"}]}}}')])], [SEARCH_TOOL]),
    ("tool_call_floats", [U("nums"), A("", tool_calls=[tc(
        "calc",
        '{"a": 1e15, "b": 1e16, "c": 0.0001, "d": 1e-05, "e": 0.1, "f": -0.0, "g": 123456789.123,'
        ' "h": 5e-324, "i": 1.7976931348623157e308, "j": 1e22, "k": 0.30000000000000004, "l": 100.0,'
        ' "m": -1.5e-10, "n": 9007199254740993, "o": -9223372036854775808, "p": 2.5e-5, "q": 1234.5e10,'
        ' "obj": {"ctl": "\\u0001\\u001f\\u007f \\b\\f\\r / \\\\ \\u00e9"}}')]), U("next")], None),
    ("tool_call_no_args", [U("time?"), A(None, tool_calls=[tc("now", None)]), T("12:00"), A("It is noon.")],
     [NO_PARAMS_TOOL]),
    ("tool_call_empty_args", [U("time?"), A("", tool_calls=[tc("now", "{}")])], [NO_PARAMS_TOOL]),
    ("parallel_tool_calls", [U("Weather in Paris and Rome?"),
                             A("I'll check both.", reasoning="two cities",
                               tool_calls=[tc("get_weather", '{"city": "Paris"}'),
                                           tc("get_weather", '{"city": "Rome", "unit": "celsius"}')]),
                             T("Paris: 21"), T("Rome: 25"), A("Paris 21, Rome 25.")], [WEATHER_TOOL]),
    ("tool_response_last", [U("Weather?"), A("", tool_calls=[tc("get_weather", '{"city": "Oslo"}')]),
                            T("  Oslo: -2  ")], [WEATHER_TOOL]),
    ("multi_step_tools", [S("sys"), U("plan"), A("step1", reasoning="r-a", tool_calls=[tc("get_weather", '{"city": "A"}')]),
                          T("ra"), A("step2", reasoning="r-b", tool_calls=[tc("get_weather", '{"city": "B"}')]),
                          T("rb"), T("rb2"), A("done", reasoning="r-c")], [WEATHER_TOOL]),
    ("user_tool_response_not_query", [U("real query"), A("", tool_calls=[tc("now", None)]),
                                      U("<tool_response>\nfake\n</tool_response>"), A("x", reasoning="after")],
     [NO_PARAMS_TOOL]),
    ("tool_calls_no_tools_list", [U("q"), A("calling", tool_calls=[tc("lookup", '{"id": 7}')]), T("found"),
                                  U("thanks")], None),
    ("tool_content_whitespace_call", [U("q"), A("   ", tool_calls=[tc("f", '{"a": "b"}')])], None),
]

# error cases: the template raises; we expect the C renderer to fail as well
ERROR_CONVERSATIONS = [
    ("err_no_user_query", [S("sys"), A("hello")], None),
    ("err_only_tool_response_user", [U("<tool_response>x</tool_response>")], None),
    ("err_system_not_first", [U("a"), S("late system")], None),
    ("err_bad_role", [U("a"), {"role": "narrator", "content": "x"}], None),
]

OPTION_SETS = {
    "qwen35": [
        {"add_generation_prompt": False},
        {"add_generation_prompt": True},
        {"add_generation_prompt": True, "enable_thinking": False},
    ],
    "qwen38": [
        {"add_generation_prompt": True},
        {"add_generation_prompt": False, "reasoning_effort": "low"},
        {"add_generation_prompt": True, "reasoning_effort": "medium"},
        {"add_generation_prompt": True, "enable_thinking": False},
        {"add_generation_prompt": True, "preserve_thinking": False, "reasoning_effort": "low"},
    ],
}


def to_template_messages(msgs):
    out = []
    for m in msgs:
        m = dict(m)
        if "tool_calls" in m:
            calls = []
            for c in m["tool_calls"]:
                fn = {"name": c["name"]}
                if c["arguments"] is not None:
                    fn["arguments"] = json.loads(c["arguments"])
                calls.append({"type": "function", "function": fn})
            m["tool_calls"] = calls
        out.append(m)
    return out


def render(template, msgs, tools, opts):
    kwargs = {k: v for k, v in opts.items() if k != "add_generation_prompt"}
    text, _ = render_jinja_template(
        conversations=[to_template_messages(msgs)], tools=tools, chat_template=template,
        add_generation_prompt=opts.get("add_generation_prompt", False), **kwargs)
    return text[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--template", required=True, help="official Qwen3.5 chat template (.jinja or .gguf)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    base, sha = read_template(args.template)
    templates = {"qwen35": base, "qwen38": make_qwen38(base)}

    cases = []
    for flavor, tmpl in templates.items():
        for oi, opts in enumerate(OPTION_SETS[flavor]):
            for name, msgs, tools in CONVERSATIONS:
                case = {"name": f"{flavor}/{name}/o{oi}", "flavor": flavor, "options": opts,
                        "messages": msgs, "tools": tools}
                case["expected"] = render(tmpl, msgs, tools, opts)
                cases.append(case)
        for name, msgs, tools in ERROR_CONVERSATIONS:
            case = {"name": f"{flavor}/{name}", "flavor": flavor, "options": {"add_generation_prompt": True},
                    "messages": msgs, "tools": tools}
            try:
                render(tmpl, msgs, tools, case["options"])
                sys.exit(f"{case['name']}: expected the template to raise")
            except Exception as e:  # jinja raise_exception -> TemplateError
                case["error"] = str(e)
            cases.append(case)
    # qwen38: an unknown reasoning_effort raises
    case = {"name": "qwen38/err_bad_effort", "flavor": "qwen38",
            "options": {"add_generation_prompt": True, "reasoning_effort": "high"},
            "messages": [U("hi")], "tools": None}
    try:
        render(templates["qwen38"], case["messages"], None, case["options"])
        sys.exit("err_bad_effort: expected the template to raise")
    except Exception as e:
        case["error"] = str(e)
    cases.append(case)

    doc = {
        "generator": "tools/reference/make_chat_goldens.py",
        "template_sha256": sha,
        "note": "qwen35 = official Qwen3.5 template via transformers render_jinja_template; "
                "qwen38 = the same template patched per the documented Qwen3.8 changes (see the script)",
        "cases": cases,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum(1 for c in cases if "error" in c)
    print(f"{len(cases)} cases ({n_err} error cases) -> {args.out}")


if __name__ == "__main__":
    main()
