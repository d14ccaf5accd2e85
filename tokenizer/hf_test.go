package tokenizer

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// corpusSample is one line of testdata/corpus.jsonl.
type corpusSample struct {
	ID   string `json:"id"`
	Text string `json:"text"`
	Hex  string `json:"hex"`
}

// hfSample is one sample of testdata/hf_expected.json, written by
// scripts/tokenizer/hf_encode.py with Hugging Face tokenizers.
type hfSample struct {
	ID      string   `json:"id"`
	Special []int32  `json:"special"`
	Plain   []int32  `json:"plain"`
	Pieces  []string `json:"pieces"`
}

func mustDefault(tb testing.TB) *Tokenizer {
	tb.Helper()
	tk, err := Default()
	if err != nil {
		tb.Fatalf("Default: %v", err)
	}
	return tk
}

// loadCorpus returns the corpus samples with their text as raw bytes.
func loadCorpus(tb testing.TB) (ids []string, texts map[string]string) {
	tb.Helper()
	f, err := os.Open("testdata/corpus.jsonl")
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	texts = map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var s corpusSample
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			tb.Fatalf("corpus line %q: %v", sc.Text(), err)
		}
		text := s.Text
		if s.Hex != "" {
			b, err := hex.DecodeString(s.Hex)
			if err != nil {
				tb.Fatalf("corpus %s: %v", s.ID, err)
			}
			text = string(b)
		}
		if _, dup := texts[s.ID]; dup {
			tb.Fatalf("corpus id %s repeated", s.ID)
		}
		ids = append(ids, s.ID)
		texts[s.ID] = text
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return ids, texts
}

func loadExpected(tb testing.TB) []hfSample {
	tb.Helper()
	data, err := os.ReadFile("testdata/hf_expected.json")
	if err != nil {
		tb.Fatal(err)
	}
	var exp struct {
		Version string     `json:"tokenizers_version"`
		Samples []hfSample `json:"samples"`
	}
	if err := json.Unmarshal(data, &exp); err != nil {
		tb.Fatal(err)
	}
	return exp.Samples
}

// TestHFExpected requires the pieces and ids of Hugging Face tokenizers on
// every corpus sample.
func TestHFExpected(t *testing.T) {
	tk := mustDefault(t)
	ids, texts := loadCorpus(t)
	exp := loadExpected(t)
	if len(exp) != len(ids) {
		t.Fatalf("hf_expected.json has %d samples, corpus %d: regenerate it with scripts/tokenizer/hf_encode.py", len(exp), len(ids))
	}
	newerTab := newerRunes(t)
	newer := 0
	for _, e := range exp {
		text, ok := texts[e.ID]
		if !ok {
			t.Errorf("expected sample %s is not in the corpus", e.ID)
			continue
		}
		// Characters assigned after Unicode 15.0 (Go's tables) are
		// classified from unicode16.go, as HF's Oniguruma (Unicode 16.0)
		// does: such samples must match too. Count them, to show the
		// corpus exercises them.
		if _, ok := newerRune(text, newerTab); ok {
			newer++
		}
		var pieces []string
		for _, p := range PreTokenize(text) {
			pieces = append(pieces, ByteLevelEncode(p))
		}
		if !slices.Equal(pieces, e.Pieces) {
			t.Errorf("%s: pieces differ:\n%s", e.ID, firstDiff(pieces, e.Pieces))
		}
		if got := tk.Encode(text); !slices.Equal(got, e.Plain) {
			t.Errorf("%s: Encode differs:\n%s", e.ID, firstDiff(got, e.Plain))
		}
		if got := tk.EncodeWithSpecial(text); !slices.Equal(got, e.Special) {
			t.Errorf("%s: EncodeWithSpecial differs:\n%s", e.ID, firstDiff(got, e.Special))
		}
		for _, ids := range [][]int32{e.Plain, e.Special} {
			got, err := tk.Decode(ids)
			if err != nil || string(got) != text {
				t.Errorf("%s: Decode of the expected ids = %q, %v; want the text", e.ID, got, err)
			}
		}
	}
	t.Logf("%d of %d samples hold characters newer than Go's Unicode %s tables", newer, len(exp), unicode.Version)
	if newer == 0 {
		t.Errorf("no sample holds characters newer than Go's tables: the Unicode 16.0 completion is untested")
	}
}

// newerRunes loads testdata/unicode_newer.txt (made by
// scripts/tokenizer/newer_unicode.py): the code points assigned in Unicode
// versions after 14.0, up to 17.0.
func newerRunes(tb testing.TB) *unicode.RangeTable {
	tb.Helper()
	data, err := os.ReadFile("testdata/unicode_newer.txt")
	if err != nil {
		tb.Fatal(err)
	}
	tab := &unicode.RangeTable{}
	for _, line := range strings.Split(string(data), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		var lo, hi uint32
		if _, err := fmt.Sscanf(line, "%X..%X", &lo, &hi); err != nil {
			tb.Fatalf("unicode_newer.txt: %q: %v", line, err)
		}
		tab.R32 = append(tab.R32, unicode.Range32{Lo: lo, Hi: hi, Stride: 1})
	}
	return tab
}

// newerRune returns the first rune of s that is assigned in a later Unicode
// version than Go's tables know.
func newerRune(s string, newer *unicode.RangeTable) (rune, bool) {
	for _, r := range s {
		if unicode.Is(newer, r) && !unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S,
			unicode.Z, unicode.Cc, unicode.Cf, unicode.Co, unicode.Cs) {
			return r, true
		}
	}
	return 0, false
}

// firstDiff describes where two sequences first differ.
func firstDiff[T comparable](got, want []T) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	lo := max(0, i-3)
	return fmt.Sprintf("at %d (len %d, want len %d):\n got  %v\n want %v",
		i, len(got), len(want), got[lo:min(len(got), i+5)], want[lo:min(len(want), i+5)])
}

// TestREADMEExpectations checks the encodings published with the vocabulary
// (/work/shared/reference/tokenizer/README.md, checked there with HF
// tokenizers 0.23).
func TestREADMEExpectations(t *testing.T) {
	tk := mustDefault(t)
	cases := []struct {
		text string
		want []int32
	}{
		{"Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ", []int32{19923, 3, 223, 5464, 5008, 1175, 19, 940, 223, 19, 438,
			223, 20, 6113, 257, 76589, 131, 100, 76032, 1628, 76589, 131, 108, 76589, 131, 98}},
		{"<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>",
			[]int32{128803, 30594, 128804, 128821, 36101, 128822, 7624, 1}},
	}
	for _, c := range cases {
		if got := tk.EncodeWithSpecial(c.text); !slices.Equal(got, c.want) {
			t.Errorf("EncodeWithSpecial(%q):\n%s", c.text, firstDiff(got, c.want))
		}
	}
}

// TestAPIPromptTokenCounts renders the ds4 API test prompts as the
// non-thinking chat template does and compares the token counts with those
// the official DeepSeek API reported.
func TestAPIPromptTokenCounts(t *testing.T) {
	tk := mustDefault(t)
	data, err := os.ReadFile("testdata/ds4-api-prompt-token-counts.json")
	if err != nil {
		t.Fatal(err)
	}
	var prompts []struct {
		ID       string `json:"id"`
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
		Thinking struct {
			Type string `json:"type"`
		} `json:"thinking"`
		PromptTokens int `json:"prompt_tokens"`
	}
	if err := json.Unmarshal(data, &prompts); err != nil {
		t.Fatal(err)
	}
	if len(prompts) == 0 {
		t.Fatal("no prompts")
	}
	for _, p := range prompts {
		if p.Thinking.Type != "disabled" || len(p.Messages) != 1 || p.Messages[0].Role != "user" {
			t.Fatalf("%s: the test renders only a single user message without thinking", p.ID)
		}
		rendered := BOSText + "<｜User｜>" + p.Messages[0].Content + "<｜Assistant｜></think>"
		ids := tk.EncodeWithSpecial(rendered)
		if len(ids) != p.PromptTokens {
			t.Errorf("%s: %d tokens, the API counted %d", p.ID, len(ids), p.PromptTokens)
		}
		if ids[0] != tk.BOS() {
			t.Errorf("%s: first token %d, want BOS %d", p.ID, ids[0], tk.BOS())
		}
	}
}

// TestBPEAlgorithmsAgree checks the heap BPE against the quadratic one on
// every corpus piece and on long repetitive pieces.
func TestBPEAlgorithmsAgree(t *testing.T) {
	tk := mustDefault(t)
	ids, texts := loadCorpus(t)
	var words []string
	for _, id := range ids {
		words = append(words, PreTokenize(texts[id])...)
	}
	words = append(words, strings.Repeat(" ", 47), strings.Repeat("a", 48), "ééééééééééééééééééééééé",
		strings.Repeat("ab", 24), strings.Repeat("=", 48), "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKL")
	n := 0
	for _, w := range words {
		for len(w) > smallWord {
			w = w[:smallWord]
		}
		if len(w) < 2 {
			continue
		}
		n++
		small := tk.bpeSmall(nil, w)
		heap := tk.bpeHeap(nil, w)
		if !slices.Equal(small, heap) {
			t.Errorf("%q: bpeSmall %v, bpeHeap %v", w, small, heap)
		}
	}
	if n < 100 {
		t.Fatalf("only %d pieces compared", n)
	}
}

// TestEncodeNeverAdded checks that plain Encode never yields added tokens,
// even for text made of their strings.
func TestEncodeNeverAdded(t *testing.T) {
	tk := mustDefault(t)
	v, err := DefaultVocab()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for id, typ := range v.Types {
		if typ == TypeControl || typ == TypeUserDefined {
			b.WriteString(v.Tokens[id])
		}
	}
	text := b.String()
	for _, id := range tk.Encode(text) {
		if tk.IsAdded(id) {
			t.Fatalf("Encode produced added token %d (%q)", id, v.Tokens[id])
		}
	}
	got := tk.EncodeWithSpecial(text)
	if len(got) != 1283 {
		t.Errorf("EncodeWithSpecial of all added tokens gave %d ids, want 1283", len(got))
	}
	if dec, _ := tk.Decode(got); !bytes.Equal(dec, []byte(text)) {
		t.Errorf("Decode(EncodeWithSpecial(all added)) differs")
	}
}
