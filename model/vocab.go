package model

import (
	"fmt"

	"ds4go/gguf"
	"ds4go/tokenizer"
)

// Tokenizer metadata keys of a GGUF file.
const (
	KeyTokenizerModel = "tokenizer.ggml.model"
	KeyTokenizerPre   = "tokenizer.ggml.pre"
	KeyTokens         = "tokenizer.ggml.tokens"
	KeyTokenTypes     = "tokenizer.ggml.token_type"
	KeyMerges         = "tokenizer.ggml.merges"
	KeyBOS            = "tokenizer.ggml.bos_token_id"
	KeyEOS            = "tokenizer.ggml.eos_token_id"
)

// VocabFromGGUF reads the tokenizer vocabulary a GGUF file carries
// (tokenizer.ggml.*). The token count must equal vocabSize when it is > 0.
func VocabFromGGUF(f *gguf.File, vocabSize int) (*tokenizer.Vocab, error) {
	if v, ok := f.KV(KeyTokenizerModel); ok {
		if s, err := v.AsString(); err != nil || s != "gpt2" {
			return nil, fmt.Errorf("%s is %s: only byte-level BPE (\"gpt2\") is supported", KeyTokenizerModel, v.Format(4))
		}
	}
	v := &tokenizer.Vocab{BOS: -1, EOS: -1}
	tv, ok := f.KV(KeyTokens)
	if !ok {
		return nil, fmt.Errorf("%s: missing", KeyTokens)
	}
	var err error
	if v.Tokens, err = tv.AsStrings(); err != nil {
		return nil, fmt.Errorf("%s: %w", KeyTokens, err)
	}
	if vocabSize > 0 && len(v.Tokens) != vocabSize {
		return nil, fmt.Errorf("%s has %d tokens, vocab_size is %d", KeyTokens, len(v.Tokens), vocabSize)
	}
	if mv, ok := f.KV(KeyMerges); ok {
		if v.Merges, err = mv.AsStrings(); err != nil {
			return nil, fmt.Errorf("%s: %w", KeyMerges, err)
		}
	} else {
		return nil, fmt.Errorf("%s: missing", KeyMerges)
	}
	if ttv, ok := f.KV(KeyTokenTypes); ok {
		if v.Types, err = ttv.AsInt32s(); err != nil {
			return nil, fmt.Errorf("%s: %w", KeyTokenTypes, err)
		}
		if len(v.Types) != len(v.Tokens) {
			return nil, fmt.Errorf("%s has %d entries for %d tokens", KeyTokenTypes, len(v.Types), len(v.Tokens))
		}
	}
	for _, k := range []struct {
		key string
		dst *int32
	}{{KeyBOS, &v.BOS}, {KeyEOS, &v.EOS}} {
		if x, ok := f.KV(k.key); ok {
			id, err := x.AsUint32()
			if err != nil || int(id) >= len(v.Tokens) {
				return nil, fmt.Errorf("%s is %s: not a token id < %d", k.key, x.Format(4), len(v.Tokens))
			}
			*k.dst = int32(id)
		}
	}
	return v, nil
}

// VocabMetadata returns the tokenizer.ggml.* keys that store v in a GGUF file.
func VocabMetadata(v *tokenizer.Vocab) []gguf.KV {
	kvs := []gguf.KV{
		{Key: KeyTokenizerModel, Value: gguf.Str("gpt2")},
		{Key: KeyTokenizerPre, Value: gguf.Str(tokenizer.GGUFPre)},
		{Key: KeyTokens, Value: gguf.StrArray(v.Tokens)},
	}
	if v.Types != nil {
		kvs = append(kvs, gguf.KV{Key: KeyTokenTypes, Value: gguf.I32Array(v.Types)})
	}
	kvs = append(kvs, gguf.KV{Key: KeyMerges, Value: gguf.StrArray(v.Merges)})
	if v.BOS >= 0 {
		kvs = append(kvs, gguf.KV{Key: KeyBOS, Value: gguf.U32(uint32(v.BOS))})
	}
	if v.EOS >= 0 {
		kvs = append(kvs, gguf.KV{Key: KeyEOS, Value: gguf.U32(uint32(v.EOS))})
	}
	return kvs
}
