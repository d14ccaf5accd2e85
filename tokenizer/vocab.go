package tokenizer

import (
	"bytes"
	"compress/gzip"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// Token types, as stored in a GGUF file's tokenizer.ggml.token_type array
// (llama.cpp's numbering).
const (
	TypeNormal      int32 = 1 // an ordinary BPE token (byte-level form)
	TypeUnknown     int32 = 2 // the unknown token (unused by byte-level BPE)
	TypeControl     int32 = 3 // a special added token (BOS, EOS, placeholders, ...)
	TypeUserDefined int32 = 4 // a non-special added token (<｜User｜>, <think>, ...)
	TypeUnused      int32 = 5 // a hole in the id space; never produced
	TypeByte        int32 = 6 // a SentencePiece byte token (<0xAB>); unused here
)

// Names of the sentence tokens; LoadHFJSON takes BOS and EOS from them.
const (
	BOSText = "<｜begin▁of▁sentence｜>"
	EOSText = "<｜end▁of▁sentence｜>"
)

// GGUFPre is the tokenizer.ggml.pre value that the published DeepSeek V4 Flash
// GGUF files declare for this pre-tokenizer.
const GGUFPre = "joyai-llm"

// Vocab is a tokenizer vocabulary in the shape GGUF metadata stores it.
type Vocab struct {
	// Tokens holds the token strings in id order, as in tokenizer.ggml.tokens:
	// byte-level (GPT-2 byte-to-unicode) strings for normal tokens, the literal
	// content for added tokens.
	Tokens []string
	// Types holds one token type (TypeNormal, ...) per token, as in
	// tokenizer.ggml.token_type. Nil means every token is TypeNormal. Tokens of
	// type TypeControl and TypeUserDefined are the added tokens that
	// EncodeWithSpecial recognises in text.
	Types []int32
	// Merges holds the BPE merges in rank order, each "left right", as in
	// tokenizer.ggml.merges.
	Merges []string
	// BOS and EOS are the begin- and end-of-sentence ids, or -1 if unknown.
	BOS, EOS int32
}

//go:embed data/deepseek-v4-tokenizer.json.gz
var defaultTokenizerGz []byte

var defaultVocab = sync.OnceValues(func() (*Vocab, error) {
	zr, err := gzip.NewReader(bytes.NewReader(defaultTokenizerGz))
	if err != nil {
		return nil, fmt.Errorf("tokenizer: embedded vocabulary: %w", err)
	}
	defer zr.Close()
	v, err := LoadHFJSON(zr)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: embedded vocabulary: %w", err)
	}
	return v, nil
})

// DefaultVocab returns the DeepSeek V4 vocabulary embedded in this package
// (129,280 tokens: 128,000 BPE tokens and 1,283 added tokens, 127,741 merges).
// Each call returns a fresh copy that the caller may modify.
func DefaultVocab() (*Vocab, error) {
	v, err := defaultVocab()
	if err != nil {
		return nil, err
	}
	return v.Clone(), nil
}

// DefaultTokenizerJSONGz returns the embedded tokenizer.json, gzip-compressed,
// for tools that ship it (the caller must not modify the slice).
func DefaultTokenizerJSONGz() []byte { return defaultTokenizerGz }

var defaultTokenizer = sync.OnceValues(func() (*Tokenizer, error) {
	v, err := defaultVocab()
	if err != nil {
		return nil, err
	}
	return New(v)
})

// Default returns a Tokenizer for the embedded DeepSeek V4 vocabulary. It is
// built once and shared; a Tokenizer is safe for concurrent use.
func Default() (*Tokenizer, error) { return defaultTokenizer() }

// Clone returns a deep copy of v.
func (v *Vocab) Clone() *Vocab {
	c := *v
	c.Tokens = append([]string(nil), v.Tokens...)
	if v.Types != nil {
		c.Types = append([]int32(nil), v.Types...)
	}
	c.Merges = append([]string(nil), v.Merges...)
	return &c
}

// hfTokenizer is the part of a Hugging Face tokenizer.json that matters here.
type hfTokenizer struct {
	AddedTokens []struct {
		ID      *int64 `json:"id"`
		Content string `json:"content"`
		Special bool   `json:"special"`
	} `json:"added_tokens"`
	Normalizer   json.RawMessage `json:"normalizer"`
	PreTokenizer json.RawMessage `json:"pre_tokenizer"`
	Model        struct {
		Type                    string           `json:"type"`
		Vocab                   map[string]int64 `json:"vocab"`
		Merges                  json.RawMessage  `json:"merges"`
		ContinuingSubwordPrefix *string          `json:"continuing_subword_prefix"`
		EndOfWordSuffix         *string          `json:"end_of_word_suffix"`
		ByteFallback            bool             `json:"byte_fallback"`
		Dropout                 *float64         `json:"dropout"`
	} `json:"model"`
}

// maxVocab bounds the ids accepted from a tokenizer.json, so that a corrupt id
// cannot make LoadHFJSON allocate without limit.
const maxVocab = 1 << 24

// LoadHFJSON reads a Hugging Face tokenizer.json and returns its vocabulary.
// Merges may be stored as "a b" strings or as ["a", "b"] pairs. Tokens of the
// model's vocab get TypeNormal; added tokens get TypeControl if marked
// "special": true and TypeUserDefined otherwise (an added token replaces the
// model token of the same id). Ids missing from both become "[PAD<id>]" of
// TypeUnused. BOS and EOS are the ids of BOSText and EOSText, or -1.
//
// The file must use the DeepSeek V3/V4 normalizer and pre-tokenizer (the only
// ones this package implements); any other gives an error.
func LoadHFJSON(r io.Reader) (*Vocab, error) {
	var hf hfTokenizer
	dec := json.NewDecoder(r)
	if err := dec.Decode(&hf); err != nil {
		return nil, fmt.Errorf("tokenizer: decoding tokenizer.json: %w", err)
	}
	m := &hf.Model
	if m.Type != "" && m.Type != "BPE" {
		return nil, fmt.Errorf("tokenizer: model type %q is not BPE", m.Type)
	}
	if m.ByteFallback || (m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "") ||
		(m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "") || (m.Dropout != nil && *m.Dropout != 0) {
		return nil, errors.New("tokenizer: unsupported BPE options (byte_fallback, continuing_subword_prefix, end_of_word_suffix or dropout)")
	}
	if err := checkNormalizer(hf.Normalizer); err != nil {
		return nil, err
	}
	if err := checkPreTokenizer(hf.PreTokenizer); err != nil {
		return nil, err
	}

	n := int64(0)
	for tok, id := range m.Vocab {
		if id < 0 || id >= maxVocab {
			return nil, fmt.Errorf("tokenizer: vocab token %q has id %d out of range", tok, id)
		}
		n = max(n, id+1)
	}
	for _, a := range hf.AddedTokens {
		if a.ID == nil {
			return nil, fmt.Errorf("tokenizer: added token %q has no id", a.Content)
		}
		if *a.ID < 0 || *a.ID >= maxVocab {
			return nil, fmt.Errorf("tokenizer: added token %q has id %d out of range", a.Content, *a.ID)
		}
		n = max(n, *a.ID+1)
	}
	v := &Vocab{Tokens: make([]string, n), Types: make([]int32, n), BOS: -1, EOS: -1}
	set := make([]bool, n)
	for tok, id := range m.Vocab {
		if set[id] {
			return nil, fmt.Errorf("tokenizer: vocab id %d is given to both %q and %q", id, v.Tokens[id], tok)
		}
		v.Tokens[id], v.Types[id], set[id] = tok, TypeNormal, true
	}
	added := make([]bool, n)
	for _, a := range hf.AddedTokens {
		id := *a.ID
		if added[id] {
			return nil, fmt.Errorf("tokenizer: added token id %d is given to both %q and %q", id, v.Tokens[id], a.Content)
		}
		typ := TypeUserDefined
		if a.Special {
			typ = TypeControl
		}
		v.Tokens[id], v.Types[id], set[id], added[id] = a.Content, typ, true, true
	}
	for id := range v.Tokens {
		if !set[id] {
			v.Tokens[id], v.Types[id] = fmt.Sprintf("[PAD%d]", id), TypeUnused
		}
		switch v.Tokens[id] {
		case BOSText:
			v.BOS = int32(id)
		case EOSText:
			v.EOS = int32(id)
		}
	}
	merges, err := parseMerges(m.Merges)
	if err != nil {
		return nil, err
	}
	v.Merges = merges
	return v, nil
}

// parseMerges accepts both encodings of tokenizer.json merges.
func parseMerges(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var flat []string
	errFlat := json.Unmarshal(raw, &flat)
	if errFlat == nil {
		return flat, nil
	}
	var pairs [][]string
	if err := json.Unmarshal(raw, &pairs); err != nil {
		return nil, fmt.Errorf("tokenizer: merges are neither \"a b\" strings (%v) nor [a, b] pairs: %w", errFlat, err)
	}
	out := make([]string, len(pairs))
	for i, p := range pairs {
		if len(p) != 2 {
			return nil, fmt.Errorf("tokenizer: merge %d has %d parts, want 2", i, len(p))
		}
		out[i] = p[0] + " " + p[1]
	}
	return out, nil
}

// checkNormalizer accepts only an absent normalizer or an empty Sequence.
func checkNormalizer(raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var n struct {
		Type        string            `json:"type"`
		Normalizers []json.RawMessage `json:"normalizers"`
	}
	if err := json.Unmarshal(raw, &n); err != nil {
		return fmt.Errorf("tokenizer: decoding normalizer: %w", err)
	}
	if n.Type != "Sequence" || len(n.Normalizers) != 0 {
		return fmt.Errorf("tokenizer: unsupported normalizer %s (only none is implemented)", raw)
	}
	return nil
}

// The Split regexes of the DeepSeek V3/V4 pre-tokenizer, in order. The scanner
// in pretokenize.go implements them.
var deepSeekSplitRegexes = []string{
	`\p{N}{1,3}`,
	`[一-龥぀-ゟ゠-ヿ]+`,
	"[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
}

// checkPreTokenizer accepts only the DeepSeek V3/V4 pre-tokenizer: a Sequence
// of the three Split regexes (Isolated, not inverted) and a ByteLevel step
// without its own regex or prefix space.
func checkPreTokenizer(raw json.RawMessage) error {
	type step struct {
		Type    string `json:"type"`
		Pattern struct {
			Regex *string `json:"Regex"`
		} `json:"pattern"`
		Behavior       string `json:"behavior"`
		Invert         bool   `json:"invert"`
		AddPrefixSpace *bool  `json:"add_prefix_space"` // HF's default is true
		UseRegex       *bool  `json:"use_regex"`        // HF's default is true
	}
	var seq struct {
		Type          string `json:"type"`
		Pretokenizers []step `json:"pretokenizers"`
	}
	if err := json.Unmarshal(raw, &seq); err != nil {
		return fmt.Errorf("tokenizer: decoding pre_tokenizer: %w", err)
	}
	bad := fmt.Errorf("tokenizer: unsupported pre_tokenizer (only DeepSeek V3/V4's is implemented): %.300s", raw)
	if seq.Type != "Sequence" || len(seq.Pretokenizers) != len(deepSeekSplitRegexes)+1 {
		return bad
	}
	for i, want := range deepSeekSplitRegexes {
		s := seq.Pretokenizers[i]
		if s.Type != "Split" || s.Pattern.Regex == nil || *s.Pattern.Regex != want || s.Behavior != "Isolated" || s.Invert {
			return bad
		}
	}
	last := seq.Pretokenizers[len(deepSeekSplitRegexes)]
	if last.Type != "ByteLevel" || last.UseRegex == nil || *last.UseRegex ||
		last.AddPrefixSpace == nil || *last.AddPrefixSpace {
		return bad
	}
	return nil
}
