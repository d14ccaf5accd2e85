#!/usr/bin/env python3
"""Generate chat/dsml/testdata/official_parse.json: completions parsed by the
official DeepSeek V4 decoder (parse_message_from_completion_text in
encoding_dsv4.py), the expected results for ds4go's dsml parser.

Completions are produced by the official encoder itself (an assistant turn
rendered after "<｜Assistant｜><think>" or "</think>") so they are exactly what
the model is trained to emit. Usage (see docs/chat.md for fetching the
encoder):

    python3 scripts/chat/gen_parse_testdata.py --encoder .ref/encoding
"""

import argparse
import json
import os
import sys


def call(name, args):
    return {"type": "function", "function": {"name": name, "arguments": args}}


ASSISTANTS = [
    ("plain_answer", {"content": "The answer is 4.", "reasoning_content": "2+2=4."}),
    ("empty_reasoning", {"content": "Hi!", "reasoning_content": ""}),
    ("one_call", {"content": "", "reasoning_content": "Need weather.",
                  "tool_calls": [call("get_weather", '{"location": "Beijing", "unit": "celsius"}')]}),
    ("text_and_calls", {"content": "Let me check both.", "reasoning_content": "Two calls.",
                        "tool_calls": [call("a", '{"x": "1"}'), call("b", '{"y": 2, "z": [1, 2.5, "s"]}')]}),
    ("typed_values", {"content": "", "reasoning_content": "r",
                      "tool_calls": [call("t", '{"s": "multi\\nline \\"q\\" \\\\ tab\\t", "i": -7, "f": 1.25e-9, '
                                               '"b": false, "n": null, "o": {"k": {"deep": [true]}}, "u": "中文 😀", "e": ""}')]}),
    ("no_params", {"content": "", "reasoning_content": "", "tool_calls": [call("now", "{}")]}),
    ("xml_in_string", {"content": "", "reasoning_content": "",
                       "tool_calls": [call("write", '{"path": "a.html", "text": "<p class=\\"x\\">a & b</p>\\n<｜DSML｜invoke"}')]}),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--encoder", default=".ref/encoding")
    ap.add_argument("--out", default="chat/dsml/testdata/official_parse.json")
    args = ap.parse_args()
    sys.path.insert(0, os.path.abspath(args.encoder))
    import encoding_dsv4 as enc  # noqa: E402  (the official encoder)

    cases = []
    for name, a in ASSISTANTS:
        for mode in ("thinking", "chat"):
            msgs = [{"role": "user", "content": "q"}, dict(role="assistant", **a)]
            prompt = enc.encode_messages(msgs, thinking_mode=mode)
            opening = "<｜Assistant｜>" + ("<think>" if mode == "thinking" else "</think>")
            completion = prompt[prompt.index(opening) + len(opening):]
            parsed = enc.parse_message_from_completion_text(completion, thinking_mode=mode)
            cases.append({
                "name": name + "_" + mode,
                "thinking": mode == "thinking",
                "completion": completion,
                "content": parsed["content"],
                "reasoning": parsed["reasoning_content"],
                "tool_calls": [{"name": tc["function"]["name"], "arguments": tc["function"]["arguments"]}
                               for tc in parsed["tool_calls"]],
            })
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote %d cases to %s" % (len(cases), args.out))


if __name__ == "__main__":
    main()
