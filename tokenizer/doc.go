// Package tokenizer implements DeepSeek V4's byte-level BPE tokenizer.
//
// The vocabulary comes either from a Hugging Face tokenizer.json (LoadHFJSON,
// DefaultVocab for the copy embedded in this package) or from the tokenizer
// metadata of a GGUF file (the caller fills a Vocab from tokenizer.ggml.tokens,
// tokenizer.ggml.token_type and tokenizer.ggml.merges).
//
// Encoding follows the Hugging Face tokenizers pipeline of the DeepSeek V3/V4
// tokenizer.json exactly: added tokens are split off first (EncodeWithSpecial
// only), then the pre-tokenizer (three Split regexes, implemented here as a
// hand-written scanner over Unicode classes) cuts the text into pieces, each
// piece is mapped to GPT-2's byte-to-unicode alphabet and merged by BPE in
// merge-rank order. docs/tokenizer.md describes the algorithm and the data.
//
// Text is taken as a Go string of arbitrary bytes. Bytes that are not part of
// a valid UTF-8 sequence are pre-tokenized like a control character and encoded
// by their byte tokens, so Decode(Encode(s)) == s for every string s.
package tokenizer
