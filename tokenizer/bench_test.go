package tokenizer

import (
	"strings"
	"testing"
)

// benchCorpus is the valid-UTF-8 part of the test corpus joined with blank
// lines: prose in many scripts, code, emoji, numbers, whitespace runs.
func benchCorpus(b *testing.B) string {
	ids, texts := loadCorpus(b)
	var sb strings.Builder
	for _, id := range ids {
		if strings.HasPrefix(id, "invalid_") {
			continue
		}
		sb.WriteString(texts[id])
		sb.WriteString("\n\n")
	}
	return sb.String()
}

// BenchmarkEncode measures Encode with a warm word cache (repeated text).
func BenchmarkEncode(b *testing.B) {
	tk := mustDefault(b)
	text := benchCorpus(b)
	buf := tk.AppendEncode(nil, text)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		buf = tk.AppendEncode(buf[:0], text)
	}
	b.ReportMetric(float64(len(buf)), "tokens/op")
}

// BenchmarkEncodeCold measures Encode with the word cache emptied before
// every pass, as for text never seen before.
func BenchmarkEncodeCold(b *testing.B) {
	tk := mustDefault(b)
	text := benchCorpus(b)
	var buf []int32
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		tk.cache.mu.Lock()
		clear(tk.cache.m)
		tk.cache.mu.Unlock()
		buf = tk.AppendEncode(buf[:0], text)
	}
}

// BenchmarkEncodeWithSpecial measures the rendered-prompt path.
func BenchmarkEncodeWithSpecial(b *testing.B) {
	tk := mustDefault(b)
	text := benchCorpus(b)
	var buf []int32
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		buf = tk.AppendEncodeWithSpecial(buf[:0], text)
	}
}

// BenchmarkPreTokenize measures the pre-tokenizer alone.
func BenchmarkPreTokenize(b *testing.B) {
	text := benchCorpus(b)
	b.SetBytes(int64(len(text)))
	n := 0
	for b.Loop() {
		preTokenize(text, func(string) { n++ })
	}
}

// BenchmarkDecode measures Decode of the corpus's tokens.
func BenchmarkDecode(b *testing.B) {
	tk := mustDefault(b)
	text := benchCorpus(b)
	ids := tk.Encode(text)
	var out []byte
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		out, _ = tk.AppendDecode(out[:0], ids)
	}
}

// BenchmarkNew measures building a Tokenizer from the default vocabulary.
func BenchmarkNew(b *testing.B) {
	v, err := DefaultVocab()
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := New(v); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDefaultVocab measures decompressing and parsing the embedded
// tokenizer.json.
func BenchmarkDefaultVocab(b *testing.B) {
	for b.Loop() {
		zr := defaultVocabReader(b)
		if _, err := LoadHFJSON(zr); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncodeEnglish measures Encode (warm cache) on the English prose and
// code of the two long ds4 API prompts.
func BenchmarkEncodeEnglish(b *testing.B) {
	tk := mustDefault(b)
	_, texts := loadCorpus(b)
	text := texts["api_long_memory_archive"] + texts["api_long_code_audit"]
	var buf []int32
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		buf = tk.AppendEncode(buf[:0], text)
	}
}
