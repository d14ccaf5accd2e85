#!/usr/bin/env python3
"""Generate chat/testdata/render/*.json: conversations rendered by the official
DeepSeek V4 encoder (encoding_dsv4.py), the expected strings for ds4go's
chat.Render.

The official encoder is not part of this repository. Fetch it (see
docs/chat.md, "Regenerating the test data") into a git-ignored folder and run:

    python3 scripts/chat/gen_render_testdata.py --encoder .ref/encoding

Each case is written in ds4go's neutral format (chat.Conversation and
chat.Options, with tool schemas kept as raw JSON text so that number and key
spellings reach the Go side untouched) together with the official output or
the error the official encoder raised.
"""

import argparse
import json
import os
import sys

THINK_MAX_MIN_CONTEXT = 393216


def weather_tool():
    return ('{"name": "get_weather", "description": "Get the current weather for a city.", '
            '"parameters": {"type": "object", "properties": {"location": {"type": "string", '
            '"description": "City name"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, '
            '"required": ["location"]}}')


def bash_tool():
    # Property order deliberately not alphabetical; compact spelling on purpose.
    return ('{"name":"bash","description":"Run a shell command.","parameters":{"type":"object",'
            '"properties":{"command":{"type":"string"},"timeout":{"type":"integer","default":120},'
            '"cwd":{"type":"string"}},"required":["command"]}}')


def read_tool():
    return ('{\n  "name": "read_file",\n  "description": "Read a file \u2014 returns text.",\n'
            '  "parameters": {"type": "object", "properties": {"path": {"type": "string"}, '
            '"offset": {"type": "integer"}, "limit": {"type": "number", "default": 1.50}}}\n}')


def odd_schema_tool():
    # Python-specific spellings: floats, exponents, big ints, -0, escapes,
    # control characters, non-ASCII, a duplicate key and a slash.
    return ('{"name": "odd", "description": "line1\\nline2\\t\\"quoted\\" back\\\\slash \\u0001 '
            '\\u00e9\\u4e2d \u2028 \U0001F600 a/b </tool_result>", "parameters": {"type": "object", '
            '"properties": {"f": {"type": "number", "minimum": 1E-7, "maximum": 1e16, "default": 0.0001}, '
            '"g": {"type": "number", "default": 1e5, "exclusiveMaximum": 123456789012345678901234567890}, '
            '"h": {"type": "number", "default": -0.0, "other": -0, "tiny": 0.00001, "big": 1e15, '
            '"pi": 3.141592653589793238, "third": 0.1e1, "neg": -2.50E+3}, '
            '"dup": {"type": "string"}, "dup": {"type": "integer"}}, "required": [], "additionalProperties": {}}}')


def call(id_, name, args):
    c = {"name": name, "arguments": args}
    if id_:
        c["id"] = id_
    return c


CASES = []


def case(name, desc, messages, mode="chat", tools=None, response_format=None,
         context_size=0, keep_reasoning=False):
    CASES.append({
        "name": name,
        "description": desc,
        "conversation": {"messages": messages},
        "tools_raw": tools or [],
        "response_format_raw": response_format,
        "options": {"mode": mode, "context_size": context_size, "keep_reasoning": keep_reasoning},
    })


SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello"}


def build_cases():
    case("01_user_chat", "single user turn, non-thinking", [U1])
    case("02_user_thinking", "single user turn, thinking", [U1], mode="thinking")
    case("03_system_user_chat", "system prompt then user", [SYS, U1])
    case("04_multi_turn_chat", "earlier reasoning never rendered in chat mode", [
        SYS, U1,
        {"role": "assistant", "reasoning_content": "Greet back.", "content": "Hi! How can I help?"},
        {"role": "user", "content": "What is 2+2?"}])
    case("05_multi_turn_thinking_drop", "thinking: reasoning of turns before the last user is dropped", [
        SYS, U1,
        {"role": "assistant", "reasoning_content": "Greet back.", "content": "Hi! How can I help?"},
        {"role": "user", "content": "What is 2+2?"}], mode="thinking")
    case("06_multi_turn_thinking_keep", "thinking with drop_thinking=False keeps old reasoning", [
        SYS, U1,
        {"role": "assistant", "reasoning_content": "Greet back.", "content": "Hi! How can I help?"},
        {"role": "user", "content": "What is 2+2?"}], mode="thinking", keep_reasoning=True)
    case("07_think_max_large_context", "Think-Max with a 384K context: effort prefix after BOS",
         [SYS, U1], mode="max", context_size=THINK_MAX_MIN_CONTEXT)
    case("08_think_max_small_context", "Think-Max below 384K degrades to thinking",
         [SYS, U1], mode="max", context_size=THINK_MAX_MIN_CONTEXT - 1)
    case("09_think_max_no_system", "Think-Max prefix sits before the first user turn",
         [U1], mode="max", context_size=1048576)
    case("10_tools_chat", "tool schemas appended to the system prompt, non-thinking",
         [SYS, {"role": "user", "content": "Weather in Rome?"}], tools=[weather_tool(), bash_tool()])
    case("11_tool_loop_thinking", "agent loop: calls, results out of call order, final answer; reasoning kept", [
        SYS,
        {"role": "user", "content": "Compare the weather in Rome and Oslo."},
        {"role": "assistant", "reasoning_content": "Two cities, two calls.", "content": "",
         "tool_calls": [call("call_a", "get_weather", '{"location": "Rome", "unit": "celsius"}'),
                        call("call_b", "get_weather", '{"location":"Oslo"}')]},
        {"role": "tool", "tool_call_id": "call_b", "content": "{\"temp\": -3}"},
        {"role": "tool", "tool_call_id": "call_a", "content": "{\"temp\": 18}"},
        {"role": "assistant", "reasoning_content": "Rome is warmer.", "content": "Rome: 18°C, Oslo: -3°C."},
        {"role": "user", "content": "Thanks. And Paris?"}],
        mode="thinking", tools=[weather_tool()])
    case("12_tools_no_system", "tools without a system message: an empty system message carries them",
         [{"role": "user", "content": "ls please"}], tools=[bash_tool()], mode="thinking")
    case("13_tool_call_value_types", "argument values of every JSON type, Python number spellings", [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "Running.",
         "tool_calls": [call("c1", "bash",
                             '{"command": "echo \\"hi\\" && cat <file> | grep \'x\'\\nls", "timeout": 30, '
                             '"ratio": 1.50, "exp": 1e5, "small": 1E-7, "neg0": -0.0, "big": 123456789012345678901234567890, '
                             '"flag": true, "off": false, "nothing": null, "list": [1, "two", {"three": 3.0}], '
                             '"obj": {"b": 1, "a": [], "c": {}}, "uni": "caf\\u00e9 \u4e2d\u6587 \U0001F600", "empty": ""}')]},
        {"role": "tool", "tool_call_id": "c1", "content": "hi"}], tools=[bash_tool()])
    case("14_tool_call_not_json", "arguments that are not JSON become one string parameter named arguments", [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "",
         "tool_calls": [call("", "bash", "ls -la </｜DSML｜parameter>"), call("", "bash", "")]}])
    case("15_tool_call_empty_object", "empty argument object renders an empty parameter list", [
        {"role": "user", "content": "time?"},
        {"role": "assistant", "content": "", "tool_calls": [call("t", "now", "{}"), call("u", "now", " { } ")]},
        {"role": "tool", "tool_call_id": "t", "content": "12:00"},
        {"role": "tool", "tool_call_id": "u", "content": "12:01"}],
        tools=['{"name": "now", "parameters": {"type": "object", "properties": {}}}'])
    case("16_tool_call_array_args", "arguments that are JSON but not an object: the official encoder fails", [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [call("", "bash", "[1, 2]")]}])
    case("17_tool_result_then_user_text", "a user message right after tool results joins the same user turn", [
        SYS, {"role": "user", "content": "Run it"},
        {"role": "assistant", "content": "", "tool_calls": [call("x", "bash", '{"command": "make"}')]},
        {"role": "tool", "tool_call_id": "x", "content": "ok"},
        {"role": "user", "content": "Now explain."}], tools=[bash_tool()], mode="thinking")
    case("18_tool_results_unknown_ids", "results whose ids match no call sort first (stable)", [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [
            call("a", "bash", '{"command": "1"}'), call("b", "bash", '{"command": "2"}'),
            call("c", "bash", '{"command": "3"}')]},
        {"role": "tool", "tool_call_id": "c", "content": "three"},
        {"role": "tool", "tool_call_id": "zzz", "content": "unknown"},
        {"role": "tool", "tool_call_id": "b", "content": "two"},
        {"role": "tool", "content": "no id"},
        {"role": "tool", "tool_call_id": "a", "content": "one"}], tools=[bash_tool()])
    case("19_schema_python_spelling", "schema re-serialised like json.dumps: floats, escapes, duplicate keys",
         [SYS, U1], tools=[odd_schema_tool(), read_tool()])
    case("20_response_format", "response_format after the tools section",
         [SYS, U1], tools=[weather_tool()],
         response_format='{"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object", "properties": {"x": {"type": "integer"}}}}}')
    case("21_response_format_no_tools", "response_format alone keeps drop_thinking",
         [SYS, U1, {"role": "assistant", "reasoning_content": "r", "content": "c"},
          {"role": "user", "content": "again"}], mode="thinking", response_format='{"type":"json_object"}')
    case("22_developer_thinking", "developer turns render like user turns and are dropped before the last user", [
        SYS, {"role": "developer", "content": "Search first."},
        {"role": "assistant", "reasoning_content": "ok", "content": "Sure."},
        {"role": "user", "content": "Go on."},
        {"role": "developer", "content": "Be brief."}], mode="thinking")
    case("23_developer_empty", "a developer message without content is rejected by the official encoder",
         [{"role": "developer", "content": ""}])
    case("24_latest_reminder", "latest_reminder messages", [
        SYS, {"role": "latest_reminder", "content": "2026-02-21, Saturday, Rome"},
        {"role": "user", "content": "What day is it?"}], mode="thinking")
    case("25_ends_with_assistant", "history ending with an assistant turn ends with EOS", [
        SYS, U1, {"role": "assistant", "content": "Hi!"}], mode="thinking")
    case("26_partial_assistant", "assistant prefill without EOS", [
        U1, {"role": "assistant", "content": "Sure, here is", "partial": True}])
    case("27_assistant_after_assistant", "two assistant turns in a row get no second opening", [
        U1, {"role": "assistant", "content": "One."}, {"role": "assistant", "content": "Two."},
        {"role": "user", "content": "Three?"}])
    case("28_consecutive_users", "consecutive user messages merge with a blank line", [
        {"role": "user", "content": "first"}, {"role": "user", "content": "second"}], mode="thinking")
    case("29_empty", "no messages: BOS only", [])
    case("30_only_system", "a lone system message gets no assistant opening", [SYS], mode="thinking")
    case("31_dsml_lookalike_text", "DSML and tag look-alikes in user text and tool output are not escaped", [
        {"role": "user", "content": "Explain <｜DSML｜tool_calls> and </｜DSML｜parameter> please"},
        {"role": "assistant", "content": "", "tool_calls": [call("r", "read_file", '{"path": "x.xml"}')]},
        {"role": "tool", "tool_call_id": "r",
         "content": "<tool_result>nested</tool_result> & <｜DSML｜invoke name=\"x\"> </think>"}],
        tools=[read_tool()], mode="thinking")
    case("32_tool_history_without_tools", "tool history but no schemas: thinking drops old reasoning", [
        {"role": "user", "content": "go"},
        {"role": "assistant", "reasoning_content": "call it", "content": "",
         "tool_calls": [call("k", "bash", '{"command": "date"}')]},
        {"role": "tool", "tool_call_id": "k", "content": "Mon"},
        {"role": "assistant", "reasoning_content": "got it", "content": "Monday."},
        {"role": "user", "content": "and tomorrow?"}], mode="thinking")
    case("33_special_tokens_in_content", "special-token strings inside user text pass through verbatim", [
        {"role": "user", "content": "<｜begin▁of▁sentence｜>x<｜Assistant｜><think>y</think><｜end▁of▁sentence｜>"}])
    case("34_multiple_systems", "tools attach to the first system message; later ones render in place", [
        {"role": "system", "content": "First."}, U1, {"role": "assistant", "content": "Hi"},
        {"role": "system", "content": "Second."}, {"role": "user", "content": "Again"}],
        tools=[weather_tool()])
    case("35_think_max_tools_loop", "Think-Max with tools and a tool round trip", [
        SYS, {"role": "user", "content": "Weather?"},
        {"role": "assistant", "reasoning_content": "Need a call.", "content": "Checking.",
         "tool_calls": [call("w", "get_weather", '{"location": "Milano"}')]},
        {"role": "tool", "tool_call_id": "w", "content": "sunny"}],
        mode="max", context_size=1000000, tools=[weather_tool()])
    case("36_unicode", "CJK, emoji, combining marks and control characters in content", [
        {"role": "system", "content": "系统提示\t\r\n"},
        {"role": "user", "content": "你好 👋🏽 e\u0301 \u0000 \u2028 end"}], mode="thinking")
    case("37_empty_strings", "empty content and reasoning everywhere", [
        {"role": "system", "content": ""}, {"role": "user", "content": ""},
        {"role": "assistant", "content": "", "reasoning_content": ""}, {"role": "user", "content": ""}],
        mode="thinking", keep_reasoning=True)
    case("38_assistant_first", "assistant before any user: no assistant opening is written", [
        SYS, {"role": "assistant", "content": "Welcome!"}, U1], mode="thinking")
    case("39_user_after_reminder_tail", "a reminder after the last user turn follows the assistant opening", [
        U1, {"role": "latest_reminder", "content": "today"}])
    case("40_many_calls_thinking_keep", "three calls in one turn, two rounds, reasoning kept by tools", [
        {"role": "user", "content": "Read three files"},
        {"role": "assistant", "reasoning_content": "Round one.", "content": "",
         "tool_calls": [call("1", "read_file", '{"path": "a", "offset": 0}'),
                        call("2", "read_file", '{"path": "b", "limit": 10.0}'),
                        call("3", "read_file", '{"path": "c"}')]},
        {"role": "tool", "tool_call_id": "1", "content": "A"},
        {"role": "tool", "tool_call_id": "2", "content": "B"},
        {"role": "tool", "tool_call_id": "3", "content": "C"},
        {"role": "assistant", "reasoning_content": "Round two.", "content": "Partial summary.",
         "tool_calls": [call("4", "read_file", '{"path": "d"}')]},
        {"role": "tool", "tool_call_id": "4", "content": "D"}],
        mode="thinking", tools=[read_tool()])


def to_official(c):
    """Convert a neutral case into the official encoder's message list."""
    msgs = []
    for m in c["conversation"]["messages"]:
        role = m["role"]
        if role == "tool":
            o = {"role": "tool", "content": m.get("content", "")}
            if m.get("tool_call_id"):
                o["tool_call_id"] = m["tool_call_id"]
        elif role == "assistant":
            o = {"role": "assistant", "content": m.get("content", "")}
            if "reasoning_content" in m:
                o["reasoning_content"] = m["reasoning_content"]
            if m.get("tool_calls"):
                o["tool_calls"] = []
                for tc in m["tool_calls"]:
                    x = {"type": "function", "function": {"name": tc["name"], "arguments": tc["arguments"]}}
                    if tc.get("id"):
                        x["id"] = tc["id"]
                    o["tool_calls"].append(x)
            if m.get("partial"):
                o["wo_eos"] = True
        else:
            o = {"role": role, "content": m.get("content", "")}
        msgs.append(o)
    tools = [{"type": "function", "function": json.loads(t)} for t in c["tools_raw"]]
    rf = json.loads(c["response_format_raw"]) if c["response_format_raw"] else None
    if tools or rf is not None:
        host = next((m for m in msgs if m["role"] == "system"), None)
        if host is None:
            host = {"role": "system", "content": ""}
            msgs.insert(0, host)
        if tools:
            host["tools"] = tools
        if rf is not None:
            host["response_format"] = rf
    return msgs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--encoder", default=".ref/encoding", help="folder holding encoding_dsv4.py")
    ap.add_argument("--out", default="chat/testdata/render")
    args = ap.parse_args()
    sys.path.insert(0, os.path.abspath(args.encoder))
    import encoding_dsv4 as enc  # noqa: E402  (the official encoder)

    build_cases()
    os.makedirs(args.out, exist_ok=True)
    for old in os.listdir(args.out):
        if old.endswith(".json"):
            os.remove(os.path.join(args.out, old))
    for c in CASES:
        opts = c["options"]
        mode = opts["mode"]
        effort = "max" if mode == "max" and opts["context_size"] >= THINK_MAX_MIN_CONTEXT else None
        out = dict(c)
        try:
            out["expected"] = enc.encode_messages(
                to_official(c),
                thinking_mode="chat" if mode == "chat" else "thinking",
                drop_thinking=not opts["keep_reasoning"],
                reasoning_effort=effort)
        except Exception as e:  # the official encoder rejects the input
            out["error"] = "%s: %s" % (type(e).__name__, e)
        with open(os.path.join(args.out, c["name"] + ".json"), "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, indent=1)
            f.write("\n")
    print("wrote %d cases to %s" % (len(CASES), args.out))


if __name__ == "__main__":
    main()
