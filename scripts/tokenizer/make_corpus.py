#!/usr/bin/env python3
"""Writes tokenizer/testdata/corpus.jsonl, the tokenizer exactness corpus.

Run from the repository root:  python3 scripts/tokenizer/make_corpus.py

Every line is a JSON object with an "id" and either "text" (a UTF-8 string)
or "hex" (raw bytes, for samples that are not valid UTF-8). All prose and code
below was written for this corpus; the random samples come from a seeded
generator, so the file is reproducible. The expected token ids are made from
this file by hf_encode.py (on a machine with Hugging Face `tokenizers`).
"""

import json
import random
import sys

SAMPLES = []


def add(name, text):
    SAMPLES.append({"id": name, "text": text})


def add_bytes(name, data):
    SAMPLES.append({"id": name, "hex": data.hex()})


# --- prose ---------------------------------------------------------------
add("en_simple", "Hello world! This is a simple English sentence.")
add("en_prose", (
    "The quick brown fox jumps over the lazy dog. It wasn't the first time; "
    "the dog, frankly, didn't care. \"Why bother?\" it asked -- and went back "
    "to sleep. Mr. O'Neil's café (est. 1987) sells 3.5 kg of beans/day, "
    "i.e. roughly 1,277.5 kg per year... Isn't that something?\n\n"
    "Second paragraph:\tindented with a tab, then    four spaces, then a "
    "trailing space \nand a CRLF line ending\r\nand a lone CR\rdone."))
add("en_contractions", "I'm, you're, he's, she'll, we'd, they've, y'all, 'tis, rock'n'roll, don't!")
add("it_prose", (
    "Perché l'università è chiusa? Più tardi andrò là, però non so se potrò "
    "entrare: è già mezzogiorno e c'è ancora la nebbia sulla città. "
    "L'anno scorso ho visitato Forlì, Cefalù e Sant'Agata de' Goti. "
    "«Così è, se vi pare», disse Pirandello."))
add("fr_de_es", (
    "Où est la bibliothèque ? Ça dépend… Straße, Größe, Übermäßig, "
    "Äpfel und Öl; ¿Dónde está el niño? ¡Qué año! Señor Muñoz."))
add("zh_prose", (
    "你好，世界！今天天气很好，我们去公园散步吧。人工智能正在改变我们的生活，"
    "大语言模型可以回答问题、写代码、翻译文章。毕老师说：“学而时习之，不亦说乎？”"))
add("zh_mixed_ascii", "DeepSeek V4 是一个混合专家模型（MoE），有 284B 参数，上下文长度为 1M tokens。")
add("ja_prose", (
    "こんにちは、世界！東京・大阪・京都を旅行しました。カタカナのテキスト、"
    "ひらがなのテキスト、そして漢字。ラーメンが大好きです゠ヽヾゝゞ"))
add("ko_prose", "안녕하세요, 세계! 오늘은 날씨가 좋네요. 한국어 텍스트를 토큰화합니다. 감사합니다!")
add("ru_prose", "Привет, мир! Съешь же ещё этих мягких французских булок, да выпей чаю.")
add("el_prose", "Γειά σου Κόσμε! Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.")
add("ar_prose", "مرحبا بالعالم! هذه جملة باللغة العربية مع أرقام ١٢٣٤٥ و 678.")
add("he_prose", "שלום עולם! זהו משפט בעברית עם ניקוד: שָׁלוֹם.")
add("hi_prose", "नमस्ते दुनिया! यह हिंदी में एक वाक्य है। संख्याएँ: १२३४५६७.")
add("th_prose", "สวัสดีชาวโลก! นี่คือประโยคภาษาไทย ไม่มีช่องว่างระหว่างคำ")
add("vi_prose", "Xin chào thế giới! Tiếng Việt có rất nhiều dấu: ả, ã, ạ, ắ, ằ, ẳ, ẵ, ặ.")
add("mixed_scripts", "English, Italiano, 中文, 日本語, 한국어, Русский, العربية, עברית, हिन्दी, ไทย all together.")

# --- readme expectations -------------------------------------------------
add("readme_plain", "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ")
add("readme_special", "<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>")

# --- special-token strings in text ----------------------------------------
add("special_chat", (
    "<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>What is 2+2?"
    "<｜Assistant｜></think>4<｜end▁of▁sentence｜><｜User｜>And 3+3?<｜Assistant｜><think>"
    "Simple arithmetic.</think>6<｜end▁of▁sentence｜>"))
add("special_dsml", (
    "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" string=\"true\">Roma</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"))
add("special_adjacent", "<think><think></think></think><｜User｜><｜User｜>x<｜Assistant｜>")
add("special_partial", "<｜User <｜User｜ <think </think <｜begin▁of▁sentence ｜DSML <dsml: </dsml:x <|EOT|>")
add("special_misc", "<｜fim▁begin｜>def f():<｜fim▁hole｜>\n<｜fim▁end｜> <｜image｜><｜latest_reminder｜><｜▁pad▁｜>")
add("special_in_prose", "The token <｜Assistant｜> marks the reply and <think>...</think> wraps reasoning.")

# --- code -------------------------------------------------------------------
add("code_go", (
    "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\n"
    "// Sum returns the sum of xs.\nfunc Sum(xs []int) (total int) {\n"
    "\tfor _, x := range xs {\n\t\ttotal += x\n\t}\n\treturn total\n}\n\n"
    "func main() {\n\tif len(os.Args) < 2 {\n\t\tfmt.Fprintln(os.Stderr, \"usage: sum N...\")\n"
    "\t\tos.Exit(2)\n\t}\n\tfmt.Printf(\"%d\\n\", Sum([]int{1, 22, 333, 4444}))\n}\n"))
add("code_python", (
    "import numpy as np\n\n\nclass Model:\n    \"\"\"A tiny model.\"\"\"\n\n"
    "    def __init__(self, dim: int = 4096) -> None:\n        self.dim = dim\n"
    "        self.w = np.zeros((dim, dim), dtype=np.float32)  # weights\n\n"
    "    def __call__(self, x):\n        if x.shape[-1] != self.dim:\n"
    "            raise ValueError(f\"bad shape {x.shape!r}\")\n"
    "        return x @ self.w.T + 1e-6\n\n\n"
    "if __name__ == \"__main__\":\n    print(Model()(np.ones(4096)).sum())\n"))
add("code_c", (
    "#include <stdio.h>\n#include <stdlib.h>\n\nstatic int cmp(const void *a, const void *b) {\n"
    "    return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);\n}\n\n"
    "int main(int argc, char **argv) {\n    int v[] = {5, 3, 9, 1};\n"
    "    qsort(v, sizeof(v)/sizeof(v[0]), sizeof(int), cmp);\n"
    "    for (size_t i = 0; i < 4; i++) printf(\"%d%s\", v[i], i < 3 ? \", \" : \"\\n\");\n"
    "    return argc > 1 ? EXIT_FAILURE : EXIT_SUCCESS;\n}\n"))
add("code_js", (
    "const fetchJSON = async (url, {timeout = 5000} = {}) => {\n"
    "  const ctrl = new AbortController();\n  const t = setTimeout(() => ctrl.abort(), timeout);\n"
    "  try {\n    const res = await fetch(url, {signal: ctrl.signal});\n"
    "    if (!res.ok) throw new Error(`HTTP ${res.status}`);\n    return await res.json();\n"
    "  } finally {\n    clearTimeout(t);\n  }\n};\n// ===> done <===\n"))
add("code_rust", (
    "fn main() -> Result<(), Box<dyn std::error::Error>> {\n"
    "    let v: Vec<u64> = (1..=10).map(|x| x * x).collect();\n"
    "    println!(\"{:?} {}\", v, v.iter().sum::<u64>());\n"
    "    Ok(())\n}\n"))
add("code_sql_shell", (
    "SELECT u.id, COUNT(*) AS n FROM users u JOIN orders o ON o.user_id = u.id\n"
    "WHERE o.created_at >= '2024-01-01' GROUP BY u.id HAVING n > 3;\n"
    "$ for f in *.log; do grep -c 'ERROR' \"$f\" || true; done | sort -n | tail -3\n"
    "#!/bin/bash\nset -euo pipefail\nexport PATH=\"$HOME/bin:$PATH\"\n"))
add("code_html_json", (
    "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Test</title></head>\n"
    "<body><div class=\"a b\" id='x'>&amp;&lt;&gt;&nbsp;</div></body></html>\n"
    "{\"name\": \"ds4go\", \"version\": [1, 0, 0], \"ok\": true, \"nested\": {\"k\": null}}\n"))
add("code_deep_indent", "\n".join(("    " * i) + "x = %d" % i for i in range(12)) + "\n\t\t\t\ty\n \t \t z\n")
add("code_latex_regex", (
    "$$\\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}$$ and "
    "re.compile(r\"^(?P<key>[A-Za-z_]\\w*)\\s*=\\s*(?P<val>.+?)\\s*$\")"))

# --- emoji ------------------------------------------------------------------
add("emoji_basic", "I love it 😀😃😄! 🎉🎉🎉 Great job 👍 ❤️ ✨ ☕")
add("emoji_zwj", "Family: 👨‍👩‍👧‍👦, couple: 👩‍❤️‍💋‍👨, tech: 👩🏽‍💻, flag: 🏳️‍🌈 🏴‍☠️")
add("emoji_skin", "👋🏻 👋🏼 👋🏽 👋🏾 👋🏿 🤝🏻👍🏿 and flags 🇮🇹🇯🇵🇺🇸🇨🇳")
add("emoji_keycap", "Keycaps: 1️⃣ 2️⃣ #️⃣ *️⃣ and text ☺︎ vs ☺️")

# --- whitespace ---------------------------------------------------------------
add("ws_runs", "a  b   c    d     e\t\tf\t \tg \n h\n\n\ni\r\n\r\nj          \n         k")
add("ws_leading_trailing", "   leading and trailing   ")
add("ws_only_spaces", " " * 37)
add("ws_only_newlines", "\n" * 9 + "\r\n" * 4 + "\r")
add("ws_mixed_unicode", "a\u00a0b\u2003c\u3000d\u2009e\u202ff\u205fg\u1680h\u2028i\u2029j\u0085k\u000bl\u000cm")
add("ws_before_digits", "x   123  456\t789\n  42 \n 7")
add("ws_before_cjk", "Hello   你好  世界 \n  日本")
add("ws_before_punct", "a   !!  ?? ...\n   ;;  --> b")
add("ws_long_mix", ("word" + " " * 50 + "\n" * 3 + "\t" * 20 + "end ") * 3)

# --- numbers -------------------------------------------------------------------
add("numbers", (
    "0 1 12 123 1234 12345 123456 1234567 12345678 123456789 1234567890 "
    "3.14159265358979 -42 +7 1e10 6.022e23 0x1F 0b1010 1,000,000 1_000_000 "
    "2024-05-16 12:34:56 v1.2.3 100% $9.99 €5,50 ½ ¾ ² ³ ⅓ Ⅻ ① ㊿ ١٢٣ ०१२ ๑๒๓ １２３４５"))
add("numbers_long", "".join(str(i) for i in range(1, 200)))

# --- punctuation ----------------------------------------------------------------
add("punct_clusters", (
    "Wait... what?!?! No way!!! (really?) [yes] {maybe} <no> ---- ==== **** "
    "#### @@@ !!!??? ;;; ::: ''' \"\"\" ``` ~~~ ^^^ &&& ||| \\\\ // .,;:!? "
    "«» „“ ‘’ — – … · • ¡¿ 。，、！？：；「」『』【】《》〈〉（）"))
add("punct_letters", ".hello ,world 'tis \"quoted\" (paren)x [a]b {c}d -e +f _g ~h @user #tag $var %p ^x `code`")
add("punct_newlines", "end.\nend!\n\nend;\r\nend:\r\r\n)\n\n\n}\n")

# --- urls / paths / misc ---------------------------------------------------------
add("urls", (
    "See https://example.com/path/to/page?query=1&lang=it#section and "
    "http://user:pass@host.example.org:8080/a_b-c.d~e/%20f, mailto:someone@example.com, "
    "file:///home/user/.config/ds4/config.toml, C:\\Users\\Admin\\Desktop\\file.txt"))
add("hashes", "sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 uuid 123e4567-e89b-12d3-a456-426614174000")
add("base64", "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==")

# --- combining marks / unusual --------------------------------------------------------
add("combining", (
    "e\u0301 a\u0300 n\u0303 o\u0308 \u0301start mid\u0327dle Z\u0351\u0308\u0363a\u036b\u0352l"
    "\u0327g\u0316o\u0353 1\u20e3 \u20dd x\u200dy a\u200cb \ufeffbom \u00adsoft\u00ad"))
add("control_chars", "a\x00b\x01c\x07d\x1be[0m\x7f\u0080\u009f end")
add("private_use", "\ue000\ue001 private \U000f0000 and noncharacters \ufdd0 \uffff end")
add("cjk_boundaries", (
    "\u4e00\u9fa5\u9fa6\u9fff\u3040\u3041\u309f\u30a0\u30ff\u3100\u3005\u3007\u2e80\u3400"
    "\U00020000\uf900\uff21\uff41 ｶﾀｶﾅ ｧ"))
add("math_symbols", "∀x ∈ ℝ: x² ≥ 0 ⇒ √(x²) = |x|; ∑ᵢ aᵢ ≤ ∞ ∧ ¬⊥ ≈ π ≠ 3 ± ε → ∅ ∩ ∪ ⊂ ⊆ ⟨ψ|φ⟩ ∂f/∂x")
add("currency_symbols", "$ € £ ¥ ₹ ₽ ₩ ₿ ¢ ₫ ₪ ￥ 💲 © ® ™ ° § ¶ † ‡")
add("fullwidth", "ＡＢＣ ａｂｃ １２３ ！？（）［］｛｝ ＠＃＄％＾＆＊")
add("titlecase_modifier", "ǅungla ǈ ǋ ʰʲʷ ˈˌ ꜰ ᴀʙᴄ ﬁ ﬂ ﬀ ŉ")

# --- long samples (written programmatically from the pieces above) ------------------
long_en = (
    "Large language models read text as a sequence of tokens. A tokenizer splits the "
    "input into pieces, maps each piece to an integer id, and the model predicts the "
    "next id one step at a time. Byte-level BPE starts from the 256 possible byte "
    "values and repeatedly merges the most frequent adjacent pair seen in training. "
    "Because every byte is a token, any input can be encoded, even binary data. "
)
add("long_en", (long_en * 12).strip())
add("long_mixed", "\n\n".join(s["text"] for s in SAMPLES if "text" in s and s["id"] in (
    "it_prose", "zh_prose", "ja_prose", "code_go", "emoji_zwj", "numbers", "ws_runs",
    "punct_clusters", "special_chat", "code_python")) * 2)
add("long_code_repeat", SAMPLES[[s["id"] for s in SAMPLES].index("code_c")]["text"] * 10)
add("long_spaces_letters", ("a" * 300) + (" " * 300) + ("é" * 100) + ("\n" * 50) + ("-" * 200) + ("9" * 100))
add("long_cjk_run", "中" * 500 + "日本語のテキスト" * 40)

# --- random samples over interesting character pools ----------------------------------
POOL = (
    list("abcXYZ") + list("àéîõüñçß") + list("αβγЖЯ") + list("中文字日本一龥") +
    list("あいうゔゝゞゟアイヴヽヾヿ゠・ー") + list("한국") + list("مرحبا") + list("שלום") +
    list("नमस्ते") + list("สวัสดี") + list("0123456789") + list("١٢٣०१२½²Ⅻ①") +
    list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + list("«»„“—–…¡¿。，、！？「」") +
    list("+<=>|~^`$¢€∑√∞©®™°") + ["\u0301", "\u0308", "\u20e3", "\ufe0f", "\u0327", "\u302a"] +
    [" ", " ", " ", " ", "  ", "\t", "\n", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2003", "\u0085", "\x0b", "\x0c"] +
    ["\u200d", "\u200c", "\ufeff", "\u00ad", "\x00", "\x1b", "\ue000", "\u3040", "\u3097"] +
    ["😀", "👍", "🏽", "👩", "❤", "🇮", "🇹", "🎉"] +
    ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜", "<｜end▁of▁sentence｜>",
     "<｜begin▁of▁sentence｜>", "<dsml:", "</dsml:", "<|EOT|>", "<｜", "｜>"] +
    ["the", " the", "ing", " and", "tion", "Hello", "  world", "::", "->", "==", "...", "\n\n", "    "]
)
rng = random.Random(20260516)
for i in range(60):
    n = rng.choice([5, 10, 20, 40, 80, 150, 300])
    add("random_%02d" % i, "".join(rng.choice(POOL) for _ in range(n)))

add("ascii_all", "".join(chr(i) for i in range(128)))

# --- the ds4 API prompts, rendered as the chat template does (non-thinking) ---------
with open("tokenizer/testdata/ds4-api-prompt-token-counts.json", encoding="utf-8") as f:
    for p in json.load(f):
        user = "".join(m["content"] for m in p["messages"] if m["role"] == "user")
        add("api_" + p["id"], "<｜begin▁of▁sentence｜><｜User｜>" + user + "<｜Assistant｜></think>")

# --- more edge cases of the character classes ---------------------------------
add("edge_info_separators", "a\x1cb\x1dc\x1e d\x1f e \x1c\x1d f\x1c\n g")
add("edge_format_chars", "a\u180eb c\u200bd \u2060e\ufeff f\u200e\u200fg \u061c h")
add("edge_digits_letters", "abc123def 1\u0301a x\u00b2y \u2167\u2168 \u4e00\u3007\u4e8c 12\u0662\u0663\u0664 \U0001d7ce\U0001d7cf")
add("edge_space_prefix", "\tfoo \u00a0bar \u3000baz \u3000\u4f60\u597d \u2003\u3042 \u30fbabc \u30fc\u30fc")
add("edge_mark_runs", "\u0301\u0302\u0303 a\u0301\u0302 \u0903\u093e \u20dd\u20de! \u0345x")
add("edge_astral", "\U00010400\U00010428 \U0001f600x \U00020000\U0002a6d6 \U0001d400\U0001d41a \U000e0041\U000e007f")
add("edge_punct_newlines", "a!\r\n\r\nb ?\n\r\n c \u3002\n d\u00bf\r e")

# --- random code points from the whole of Unicode -------------------------------
def random_char(r):
    x = r.random()
    if x < 0.15:
        return r.choice(" \t\n")
    if x < 0.55:
        cp = r.randrange(0x80, 0x3400)
    elif x < 0.75:
        cp = r.randrange(0x3400, 0x10000)
    elif x < 0.95:
        cp = r.randrange(0x10000, 0x32000)
    else:
        cp = r.randrange(0xE0000, 0x110000)
    if 0xD800 <= cp <= 0xDFFF:
        cp = 0x41
    return chr(cp)

rng2 = random.Random(4242)
for i in range(40):
    add("random_any_%02d" % i, "".join(random_char(rng2) for _ in range(rng2.choice([10, 50, 200]))))

# --- invalid UTF-8 (bytes) ----------------------------------------------------------
add_bytes("invalid_lone_bytes", b"abc\xffdef \xfe \x80\x81 ok")
add_bytes("invalid_truncated", "caffè".encode()[:-1] + b" and " + "中文".encode()[:-2] + b"x")
add_bytes("invalid_surrogate", b"a\xed\xa0\x80b \xed\xbf\xbf")
add_bytes("invalid_overlong", b"\xc0\xaf\xe0\x80\xaf \xf8\x88\x80\x80\x80 z")
add_bytes("invalid_mixed", "Hello 世界".encode() + b"\xc3\x28 \xa0\xa1 " + "<｜User｜>".encode()[:5] + b"\n\n\xf0\x9f\x98")
add_bytes("invalid_between_letters", b"word\xffword \xffword word\xff \xff\xff\xff   \xff\n")
add_bytes("invalid_all_high", bytes(range(0x80, 0x100)))

out = sys.argv[1] if len(sys.argv) > 1 else "tokenizer/testdata/corpus.jsonl"
ids = set()
with open(out, "w", encoding="utf-8") as f:
    for s in SAMPLES:
        assert s["id"] not in ids, s["id"]
        ids.add(s["id"])
        f.write(json.dumps(s, ensure_ascii=False) + "\n")
print("wrote %d samples to %s" % (len(SAMPLES), out))
