// Package score measures how far a model's next-token distribution is from a
// reference: it runs a token sequence through an engine session (a prefill,
// then one decode step per token) or a text through perplexity windows,
// writes the logits of every step to a safetensors file, and compares them
// with a reference file of the same layout by relative error, KL divergence
// and top-1 agreement. cmd/ds4-score is its command line; docs/score.md
// defines the formats and the metrics.
package score

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// ErrInput marks bad input (a sequence, a reference file, options); test
// with errors.Is.
var ErrInput = errors.New("score: bad input")

func inputErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInput, fmt.Sprintf(format, args...))
}

// Seq is a token sequence to score: the engine prefills Tokens[:Prefill],
// then feeds Tokens[Prefill:] one at a time as decode steps.
type Seq struct {
	Tokens  []int32
	Prefill int
}

// Rows returns the number of logit rows a run of the sequence produces:
// one after the prefill and one after each decode step.
func (s *Seq) Rows() int { return len(s.Tokens) - s.Prefill + 1 }

// Positions returns, for each row, the index of the last token consumed.
func (s *Seq) Positions() []int32 {
	p := make([]int32, s.Rows())
	for i := range p {
		p[i] = int32(s.Prefill - 1 + i)
	}
	return p
}

// Validate checks the sequence against a vocabulary size: at least one
// token, every id in [0, vocab), 1 ≤ Prefill ≤ len(Tokens).
func (s *Seq) Validate(vocab int) error {
	if len(s.Tokens) == 0 {
		return inputErr("the sequence has no tokens")
	}
	for i, t := range s.Tokens {
		if t < 0 || int(t) >= vocab {
			return inputErr("token %d (index %d) is outside the vocabulary [0, %d)", t, i, vocab)
		}
	}
	if s.Prefill < 1 || s.Prefill > len(s.Tokens) {
		return inputErr("prefill %d is outside [1, %d] (the number of tokens)", s.Prefill, len(s.Tokens))
	}
	return nil
}

// maxSeqBytes bounds a sequence file (a million tokens fit easily).
const maxSeqBytes = 64 << 20

// ParseSeq parses a sequence file, {"tokens": [ids...], "prefill": P}, and
// validates it against a vocabulary size. "ids" is accepted instead of
// "tokens" (the key `ds4 --dump-tokens --json` writes); other fields are
// ignored. prefill > 0 overrides the file's "prefill", which is otherwise
// required. Non-integer ids and ids outside [0, vocab) are errors.
func ParseSeq(data []byte, vocab, prefill int) (*Seq, error) {
	var raw struct {
		Tokens  *[]int64 `json:"tokens"`
		IDs     *[]int64 `json:"ids"`
		Prefill *int64   `json:"prefill"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&raw); err != nil {
		return nil, inputErr("sequence JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, inputErr("sequence JSON: trailing data after the object")
	}
	ids := raw.Tokens
	switch {
	case raw.Tokens != nil && raw.IDs != nil:
		return nil, inputErr(`sequence JSON: both "tokens" and "ids"`)
	case raw.Tokens == nil && raw.IDs == nil:
		return nil, inputErr(`sequence JSON: no "tokens" array`)
	case raw.Tokens == nil:
		ids = raw.IDs
	}
	s := &Seq{Tokens: make([]int32, len(*ids))}
	for i, t := range *ids {
		if t < 0 || t >= int64(vocab) || t > 1<<31-1 {
			return nil, inputErr("token %d (index %d) is outside the vocabulary [0, %d)", t, i, vocab)
		}
		s.Tokens[i] = int32(t)
	}
	if len(s.Tokens) == 0 {
		return nil, inputErr("the sequence has no tokens")
	}
	var p int64
	switch {
	case prefill > 0:
		p = int64(prefill)
	case raw.Prefill != nil:
		p = *raw.Prefill
	default:
		return nil, inputErr(`sequence JSON: no "prefill" count (add one, or give it with --prefill)`)
	}
	if p < 1 || p > int64(len(s.Tokens)) {
		return nil, inputErr("prefill %d is outside [1, %d] (the number of tokens)", p, len(s.Tokens))
	}
	s.Prefill = int(p)
	return s, s.Validate(vocab)
}

// LoadSeq reads and parses a sequence file (prefill as in ParseSeq).
func LoadSeq(path string, vocab, prefill int) (*Seq, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("sequence: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSeqBytes+1))
	if err != nil {
		return nil, fmt.Errorf("sequence %s: %w", path, err)
	}
	if len(data) > maxSeqBytes {
		return nil, fmt.Errorf("sequence %s: %w", path, inputErr("file is larger than %d bytes", maxSeqBytes))
	}
	s, err := ParseSeq(data, vocab, prefill)
	if err != nil {
		return nil, fmt.Errorf("sequence %s: %w", path, err)
	}
	return s, nil
}
