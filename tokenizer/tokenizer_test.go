package tokenizer

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestDefaultVocab(t *testing.T) {
	v, err := DefaultVocab()
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Tokens) != 129280 || len(v.Types) != 129280 || len(v.Merges) != 127741 {
		t.Fatalf("sizes: %d tokens, %d types, %d merges", len(v.Tokens), len(v.Types), len(v.Merges))
	}
	count := map[int32]int{}
	for _, typ := range v.Types {
		count[typ]++
	}
	// 128,000 model tokens, 3 of which (ids 0-2) are also added tokens;
	// 1,237 added tokens are special, 46 are not (README.md of the data).
	if count[TypeNormal] != 127997 || count[TypeControl] != 1237 || count[TypeUserDefined] != 46 {
		t.Errorf("type counts %v", count)
	}
	if v.BOS != 0 || v.EOS != 1 {
		t.Errorf("BOS %d EOS %d, want 0 1", v.BOS, v.EOS)
	}
	// The special-token table of the data's README.
	tk := mustDefault(t)
	for text, want := range map[string]int32{
		"<｜User｜>": 128803, "<｜Assistant｜>": 128804, "<think>": 128821, "</think>": 128822,
		"｜DSML｜": 128825, "<｜latest_reminder｜>": 128828, "<｜action｜>": 128829, "<｜query｜>": 128830,
		"<｜authority｜>": 128831, "<｜domain｜>": 128832, "<｜title｜>": 128836, "<｜read_url｜>": 128845,
		"<｜image｜>": 129279, BOSText: 0, EOSText: 1,
	} {
		if id, ok := tk.Lookup(text); !ok || id != want {
			t.Errorf("Lookup(%q) = %d, %v; want %d", text, id, ok, want)
		}
	}
	if id, ok := tk.Lookup("Ġthe"); !ok || tk.Type(id) != TypeNormal {
		t.Errorf("Lookup(Ġthe) = %d, %v", id, ok)
	}
	if _, ok := tk.Lookup(" the"); ok {
		t.Errorf("Lookup takes vocabulary strings, not raw text")
	}
	// DefaultVocab returns a copy.
	v.Tokens[0] = "changed"
	if v2, _ := DefaultVocab(); v2.Tokens[0] != BOSText {
		t.Errorf("DefaultVocab shares its slices")
	}
}

// TestAddedTokenPassesEquivalent checks the condition under which one
// leftmost-longest pass over all added tokens (EncodeWithSpecial) equals HF's
// two passes (first the tokens with normalized=false, then the others): no
// token of one set overlaps a token of the other in any text, i.e. none is a
// substring of the other and no suffix of one is a prefix of the other.
func TestAddedTokenPassesEquivalent(t *testing.T) {
	zr, err := gzip.NewReader(bytes.NewReader(DefaultTokenizerJSONGz()))
	if err != nil {
		t.Fatal(err)
	}
	var hf struct {
		Added []struct {
			Content    string `json:"content"`
			Normalized bool   `json:"normalized"`
		} `json:"added_tokens"`
	}
	if err := json.NewDecoder(zr).Decode(&hf); err != nil {
		t.Fatal(err)
	}
	var sets [2][]string
	for _, a := range hf.Added {
		if a.Normalized {
			sets[1] = append(sets[1], a.Content)
		} else {
			sets[0] = append(sets[0], a.Content)
		}
	}
	if len(sets[0]) == 0 || len(sets[1]) == 0 {
		t.Fatalf("sets of %d and %d tokens", len(sets[0]), len(sets[1]))
	}
	overlap := func(a, b string) bool {
		if strings.Contains(a, b) || strings.Contains(b, a) {
			return true
		}
		for k := 1; k < min(len(a), len(b)); k++ {
			if a[len(a)-k:] == b[:k] || b[len(b)-k:] == a[:k] {
				return true
			}
		}
		return false
	}
	for _, a := range sets[0] {
		for _, b := range sets[1] {
			if overlap(a, b) {
				t.Errorf("%q (normalized=false) and %q (normalized=true) overlap", a, b)
			}
		}
	}
}

// roundTripTexts are texts for the round-trip tests and fuzz seeds.
var roundTripTexts = []string{
	"", "a", " ", "\n", "Hello, world!", "  leading", "trailing  ", "\t\t\n\r\n  x",
	"caffè 中文 日本語 한국어 😀👩‍💻🏽 <｜User｜> <think>", "1234567 3.14 ½",
	"\xff\xfe", "abc\xe4\xb8", "\xe4\xb8\xadx", "\xed\xa0\x80", "<｜begin▁of▁sentence｜>\x80<｜",
	strings.Repeat("ab ", 200), strings.Repeat(" ", 300) + "x", strings.Repeat("ß", 200),
}

func TestRoundTrip(t *testing.T) {
	tk := mustDefault(t)
	_, texts := loadCorpus(t)
	all := slices.Clone(roundTripTexts)
	for _, s := range texts {
		all = append(all, s)
	}
	for _, s := range all {
		checkRoundTrip(t, tk, s)
	}
}

func checkRoundTrip(t *testing.T, tk *Tokenizer, s string) {
	t.Helper()
	plain := tk.Encode(s)
	for _, id := range plain {
		if tk.IsAdded(id) {
			t.Fatalf("Encode(%q) produced added token %d", s, id)
		}
	}
	if got, err := tk.Decode(plain); err != nil || string(got) != s {
		t.Fatalf("Decode(Encode(%q)) = %q, %v", s, got, err)
	}
	if got, err := tk.Decode(tk.EncodeWithSpecial(s)); err != nil || string(got) != s {
		t.Fatalf("Decode(EncodeWithSpecial(%q)) = %q, %v", s, got, err)
	}
	if strings.Join(PreTokenize(s), "") != s {
		t.Fatalf("PreTokenize(%q) does not cover the text", s)
	}
	if !strings.Contains(s, "<") && !strings.Contains(s, "｜") && !slices.Equal(plain, tk.EncodeWithSpecial(s)) {
		t.Fatalf("Encode and EncodeWithSpecial differ on %q, which has no added token", s)
	}
	// The stream decoder emits valid UTF-8 that, for valid input, is the text.
	d := tk.NewStreamDecoder()
	var out []byte
	for _, id := range plain {
		b, err := d.Add(id)
		if err != nil {
			t.Fatal(err)
		}
		if !utf8.Valid(b) {
			t.Fatalf("stream of %q emitted invalid UTF-8 %q", s, b)
		}
		out = append(out, b...)
	}
	out = append(out, d.Flush()...)
	if want := string([]rune(s)); string(out) != want {
		t.Fatalf("stream of %q = %q, want %q", s, out, want)
	}
}

func FuzzRoundTrip(f *testing.F) {
	for _, s := range roundTripTexts {
		f.Add(s)
	}
	tk := mustDefault(f)
	f.Fuzz(func(t *testing.T, s string) {
		checkRoundTrip(t, tk, s)
	})
}

// TestInvalidUTF8 pins the documented handling of invalid UTF-8: each such
// byte is pre-tokenized like a control character (it may prefix a word, and
// otherwise stands apart) and is encoded by its byte token. The corpus's
// "hex" samples check the same convention against HF's BPE.
func TestInvalidUTF8(t *testing.T) {
	cases := map[string][]string{
		"a\xffb":            {"a", "\xffb"},
		"\xff\xfe":          {"\xff\xfe"},
		"x \xff!":           {"x", " ", "\xff", "!"},
		"\xe4\xb8 \xe4":     {"\xe4\xb8", " ", "\xe4"}, // unmatched characters gather
		"\x01b \x01 ":       {"\x01b", " ", "\x01", " "},
		"12\xff3":           {"12", "\xff", "3"},
		"中\xe4\xb8\xad\xff": {"中中", "\xff"},
	}
	for in, want := range cases {
		if got := PreTokenize(in); !slices.Equal(got, want) {
			t.Errorf("PreTokenize(%q) = %q, want %q", in, got, want)
		}
	}
	tk := mustDefault(t)
	ids := tk.Encode("\xff")
	if len(ids) != 1 || ids[0] != tk.byteTok[0xff] {
		t.Errorf("Encode(\\xff) = %v, want the byte token %d", ids, tk.byteTok[0xff])
	}
}

func TestStreamDecoderHoldsPartialCharacters(t *testing.T) {
	tk := mustDefault(t)
	const text = "ok 👩‍💻 中文"
	d := tk.NewStreamDecoder()
	var out []byte
	held := false
	for _, id := range tk.Encode(text) {
		b, err := d.Add(id)
		if err != nil {
			t.Fatal(err)
		}
		if !utf8.Valid(b) {
			t.Fatalf("emitted invalid UTF-8 %q", b)
		}
		held = held || d.Pending() > 0
		out = append(out, b...)
	}
	if !held {
		t.Errorf("no token split a character; the test text no longer exercises holding back")
	}
	if d.Pending() != 0 {
		t.Errorf("%d bytes pending at the end of complete text", d.Pending())
	}
	if string(out) != text {
		t.Errorf("stream = %q, want %q", out, text)
	}
	// An incomplete character at the end becomes U+FFFD on Flush.
	d = tk.NewStreamDecoder()
	out = out[:0]
	for _, id := range tk.Encode("é\xc3") {
		b, _ := d.Add(id)
		out = append(out, b...)
	}
	if string(out) != "é" || string(d.Flush()) != "\uFFFD" || d.Pending() != 0 {
		t.Errorf("incomplete tail not handled: %q", out)
	}
	if _, err := d.Add(-1); err == nil {
		t.Errorf("Add(-1) gave no error")
	}
	if _, err := d.Add(int32(tk.VocabSize())); err == nil {
		t.Errorf("Add(VocabSize) gave no error")
	}
}

func TestTokenBytes(t *testing.T) {
	tk := mustDefault(t)
	for id, want := range map[int32]string{0: BOSText, 128803: "<｜User｜>"} {
		if b, err := tk.TokenBytes(id); err != nil || string(b) != want {
			t.Errorf("TokenBytes(%d) = %q, %v", id, b, err)
		}
	}
	id, _ := tk.Lookup("Ġthe")
	if b, _ := tk.TokenBytes(id); string(b) != " the" {
		t.Errorf("TokenBytes(Ġthe) = %q", b)
	}
	b, _ := tk.TokenBytes(id)
	b[0] = 'X'
	if b2, _ := tk.TokenBytes(id); string(b2) != " the" {
		t.Errorf("TokenBytes returned shared memory")
	}
	for _, bad := range []int32{-1, int32(tk.VocabSize())} {
		if _, err := tk.TokenBytes(bad); err == nil {
			t.Errorf("TokenBytes(%d) gave no error", bad)
		}
		if _, err := tk.Decode([]int32{5, bad}); err == nil {
			t.Errorf("Decode with %d gave no error", bad)
		}
		if _, err := tk.Token(bad); err == nil {
			t.Errorf("Token(%d) gave no error", bad)
		}
	}
}

func TestConcurrentEncode(t *testing.T) {
	tk := mustDefault(t)
	_, texts := loadCorpus(t)
	want := map[string][]int32{}
	for id, s := range texts {
		want[id] = tk.Encode(s)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for range 8 {
		wg.Go(func() {
			for id, s := range texts {
				if !slices.Equal(tk.Encode(s), want[id]) {
					errs <- id
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for id := range errs {
		t.Errorf("concurrent Encode of %s differs", id)
	}
}

// byteVocab returns the 256 byte tokens, the smallest valid vocabulary.
func byteVocab() []string {
	toks := make([]string, 256)
	for b := range 256 {
		toks[b] = string(byteRune[b])
	}
	return toks
}

func TestNewValidation(t *testing.T) {
	base := func() *Vocab {
		toks := append(byteVocab(), "ab", "<s>")
		types := make([]int32, len(toks))
		for i := range types {
			types[i] = TypeNormal
		}
		types[len(toks)-1] = TypeControl
		return &Vocab{Tokens: toks, Types: types, Merges: []string{"a b"}, BOS: int32(len(toks) - 1), EOS: -1}
	}
	if _, err := New(base()); err != nil {
		t.Fatalf("valid vocabulary: %v", err)
	}
	cases := map[string]func(v *Vocab){
		"nil tokens":       func(v *Vocab) { v.Tokens = nil; v.Types = nil },
		"duplicate":        func(v *Vocab) { v.Tokens[257] = "a" },
		"types length":     func(v *Vocab) { v.Types = v.Types[:3] },
		"bad type":         func(v *Vocab) { v.Types[5] = 9 },
		"merge no space":   func(v *Vocab) { v.Merges = []string{"ab"} },
		"merge two spaces": func(v *Vocab) { v.Merges = []string{"a b c"} },
		"merge unknown":    func(v *Vocab) { v.Merges = []string{"a x"} },
		"merge result":     func(v *Vocab) { v.Merges = []string{"b a"} },
		"missing byte":     func(v *Vocab) { v.Tokens[32] = "space" },
		"byte not normal":  func(v *Vocab) { v.Types[97] = TypeControl },
		"BOS range":        func(v *Vocab) { v.BOS = 1000 },
		"EOS range":        func(v *Vocab) { v.EOS = -2 },
		"empty added":      func(v *Vocab) { v.Tokens[257] = "" },
	}
	for name, mutate := range cases {
		v := base()
		mutate(v)
		if _, err := New(v); err == nil {
			t.Errorf("%s: New gave no error", name)
		}
	}
	if _, err := New(nil); err == nil {
		t.Errorf("New(nil) gave no error")
	}
	// Nil Types: every token is normal; the merge applies.
	v := base()
	v.Types = nil
	tk, err := New(v)
	if err != nil {
		t.Fatal(err)
	}
	if got := tk.EncodeWithSpecial("<s>ab"); !slices.Equal(got, []int32{tk.byteTok['<'], tk.byteTok['s'], tk.byteTok['>'], 256}) {
		t.Errorf("EncodeWithSpecial without types = %v", got)
	}
	tk, _ = New(base())
	if got := tk.EncodeWithSpecial("x<s>ab"); !slices.Equal(got, []int32{tk.byteTok['x'], 257, 256}) {
		t.Errorf("EncodeWithSpecial = %v", got)
	}
}

// miniTokenizerJSON returns a small tokenizer.json with the DeepSeek
// pre-tokenizer; merges is the JSON of the merges list.
func miniTokenizerJSON(merges, preTokenizer string) string {
	vocab := map[string]int{}
	for i, tok := range byteVocab() {
		vocab[tok] = i + 3
	}
	vocab["ab"] = 259
	vocab["abc"] = 261
	vb, _ := json.Marshal(vocab)
	return fmt.Sprintf(`{"version":"1.0","added_tokens":[
		{"id":0,"content":"<｜begin▁of▁sentence｜>","special":true},
		{"id":1,"content":"<｜end▁of▁sentence｜>","special":true},
		{"id":2,"content":"<｜User｜>","special":false}],
		"normalizer":{"type":"Sequence","normalizers":[]},
		"pre_tokenizer":%s,
		"model":{"type":"BPE","dropout":null,"byte_fallback":false,"vocab":%s,"merges":%s}}`,
		preTokenizer, vb, merges)
}

func deepSeekPreTokenizerJSON() string {
	var steps []string
	for _, re := range deepSeekSplitRegexes {
		b, _ := json.Marshal(re)
		steps = append(steps, fmt.Sprintf(`{"type":"Split","pattern":{"Regex":%s},"behavior":"Isolated","invert":false}`, b))
	}
	steps = append(steps, `{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}`)
	return `{"type":"Sequence","pretokenizers":[` + strings.Join(steps, ",") + `]}`
}

func TestLoadHFJSON(t *testing.T) {
	pre := deepSeekPreTokenizerJSON()
	for _, merges := range []string{`["a b","ab c"]`, `[["a","b"],["ab","c"]]`} {
		v, err := LoadHFJSON(strings.NewReader(miniTokenizerJSON(merges, pre)))
		if err != nil {
			t.Fatalf("merges %s: %v", merges, err)
		}
		if len(v.Tokens) != 262 || v.BOS != 0 || v.EOS != 1 {
			t.Fatalf("%d tokens, BOS %d, EOS %d", len(v.Tokens), v.BOS, v.EOS)
		}
		if v.Types[0] != TypeControl || v.Types[2] != TypeUserDefined || v.Types[3] != TypeNormal ||
			v.Types[260] != TypeUnused || v.Tokens[260] != "[PAD260]" {
			t.Errorf("types %v, token 260 %q", []int32{v.Types[0], v.Types[2], v.Types[3], v.Types[260]}, v.Tokens[260])
		}
		if !slices.Equal(v.Merges, []string{"a b", "ab c"}) {
			t.Errorf("merges %q", v.Merges)
		}
		tk, err := New(v)
		if err != nil {
			t.Fatal(err)
		}
		if got := tk.EncodeWithSpecial("<｜User｜>abc ab"); !slices.Equal(got, []int32{2, 261, tk.byteTok[' '], 259}) {
			t.Errorf("EncodeWithSpecial = %v", got)
		}
		if b, _ := tk.Decode([]int32{260}); len(b) != 0 {
			t.Errorf("an unused token decodes to %q", b)
		}
	}
	bad := map[string]string{
		"not json":        "{",
		"bad merges":      miniTokenizerJSON(`[1,2]`, pre),
		"three-part pair": miniTokenizerJSON(`[["a","b","c"]]`, pre),
		"gpt2 pre":        miniTokenizerJSON(`[]`, `{"type":"ByteLevel","add_prefix_space":false,"use_regex":true}`),
		"changed regex":   miniTokenizerJSON(`[]`, strings.Replace(pre, `{1,3}`, `{1,4}`, 1)),
		"byte regex":      miniTokenizerJSON(`[]`, strings.Replace(pre, `"use_regex":false`, `"use_regex":true`, 1)),
		"normalizer": strings.Replace(miniTokenizerJSON(`[]`, pre), `"normalizers":[]`,
			`"normalizers":[{"type":"NFC"}]`, 1),
		"wordpiece":   strings.Replace(miniTokenizerJSON(`[]`, pre), `"type":"BPE"`, `"type":"WordPiece"`, 1),
		"negative id": strings.Replace(miniTokenizerJSON(`[]`, pre), `"id":2,`, `"id":-2,`, 1),
		"dup id":      strings.Replace(miniTokenizerJSON(`[]`, pre), `"id":2,`, `"id":1,`, 1),
	}
	for name, js := range bad {
		if _, err := LoadHFJSON(strings.NewReader(js)); err == nil {
			t.Errorf("%s: LoadHFJSON gave no error", name)
		}
	}
}

// TestPreTokenizeRules spot-checks the scanner on hand-derived cases of the
// regex semantics (the corpus test checks it against HF at scale).
func TestPreTokenizeRules(t *testing.T) {
	cases := map[string][]string{
		"Hello world":     {"Hello", " world"},
		"   int x":        {"  ", " int", " x"},     // \s+(?!\S) leaves one space for the word
		"a  \n  b":        {"a", "  \n", " ", " b"}, // \s*[\r\n]+ ends at the last newline
		"x   ":            {"x", "   "},             // whitespace at the end: one piece
		"1234567":         {"123", "456", "7"},
		"x  123":          {"x", "  ", "123"}, // digits were split off first
		"'s .Net ..Net":   {"'s", " .", "Net", " ..", "Net"},
		"end.\n\nx":       {"end", ".\n\n", "x"},
		"你好 world":        {"你好", " world"},
		"日本・東京":           {"日本", "・", "東京"},
		"e\u0301 \u0301x": {"e\u0301", " \u0301x"},
	}
	for in, want := range cases {
		if got := PreTokenize(in); !slices.Equal(got, want) {
			t.Errorf("PreTokenize(%q) = %q, want %q", in, got, want)
		}
	}
}

func defaultVocabReader(tb testing.TB) *gzip.Reader {
	tb.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(DefaultTokenizerJSONGz()))
	if err != nil {
		tb.Fatal(err)
	}
	return zr
}

// TestClassTable checks the precomputed class table against the Unicode
// functions for every rune.
func TestClassTable(t *testing.T) {
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if r >= 0xD800 && r <= 0xDFFF {
			continue // surrogates: not valid in UTF-8
		}
		want := unicodeClass(r)
		if r < 0x80 {
			if r == '\r' || r == '\n' {
				want |= cNL
			}
			if want&(cP|cS) != 0 {
				want |= cASCIIPunct
			}
		}
		got, n := classAt(string(r), 0)
		if got != want || n != utf8.RuneLen(r) {
			t.Fatalf("class of %U = %b (len %d), want %b", r, got, n, want)
		}
	}
}

// TestUnicode16Classes checks characters that Unicode 15.1 and 16.0 added
// (unknown to Go's 15.0 tables) get the class HF's Oniguruma gives them.
func TestUnicode16Classes(t *testing.T) {
	for _, c := range []struct {
		r    rune
		want uint16
	}{
		{0x10D50, cL}, // GARAY CAPITAL LETTER A (16.0)
		{0x10D40, cN}, // GARAY DIGIT ZERO (16.0)
		{0x16D5B, cL}, // KIRAT RAI (16.0), seen as a letter by HF
		{0x13E62, cL}, // EGYPTIAN HIEROGLYPH (16.0 extension A), seen as a letter by HF
		{0x2EBF9, cL}, // CJK EXTENSION I (15.1), seen as a letter by HF
		{0x1CC18, cS}, // SYMBOLS FOR LEGACY COMPUTING SUPPLEMENT (16.0), seen as a symbol by HF
		{0x0041, cL},  // unchanged: Go's tables still decide assigned characters
		{0x10FFFD, 0}, // private use: no class
	} {
		if unicode.In(c.r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S) && c.r > 0x7F && c.r != 0x41 {
			t.Errorf("%U: Go's tables now assign it; the test needs other examples", c.r)
		}
		if got, _ := classAt(string(c.r), 0); got&categoryBits != c.want {
			t.Errorf("%U: class %b, want %b", c.r, got&categoryBits, c.want)
		}
	}
}
