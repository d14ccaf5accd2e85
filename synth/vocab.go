package synth

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"ds4go/tokenizer"
)

// RealVocabSize is the token count of the DeepSeek V4 vocabulary.
const RealVocabSize = 129280

// isPlaceholder reports whether an added token of the real vocabulary is one
// of its numbered reserved slots (<｜place▁holder▁no▁N｜>,
// <|place_holder_mm_span_N|>), which a small vocabulary leaves out.
func isPlaceholder(tok string) bool {
	return strings.Contains(tok, "place▁holder▁no▁") || strings.Contains(tok, "place_holder_mm_span")
}

// smallVocabBase holds what every small vocabulary is cut from: the real
// vocabulary, the added tokens a small one keeps, and the byte tokens.
type smallVocabBase struct {
	real  *tokenizer.Vocab
	added []int // ids of the kept added tokens, in id order
	bytes []int // ids of the 256 byte-level tokens
	ids   map[string]int
}

var smallBase = sync.OnceValues(func() (*smallVocabBase, error) {
	v, err := tokenizer.DefaultVocab()
	if err != nil {
		return nil, err
	}
	b := &smallVocabBase{real: v, ids: make(map[string]int, len(v.Tokens))}
	for id, tok := range v.Tokens {
		b.ids[tok] = id
		if t := v.Types[id]; (t == tokenizer.TypeControl || t == tokenizer.TypeUserDefined) && !isPlaceholder(tok) {
			b.added = append(b.added, id)
		}
	}
	for c := 0; c < 256; c++ {
		s := tokenizer.ByteLevelEncode(string([]byte{byte(c)}))
		id, ok := b.ids[s]
		if !ok || v.Types[id] != tokenizer.TypeNormal {
			return nil, fmt.Errorf("synth: the real vocabulary has no byte token for 0x%02x", c)
		}
		b.bytes = append(b.bytes, id)
	}
	return b, nil
})

// MinSmallVocab returns the smallest size SmallVocab accepts: the 256 byte
// tokens plus the real vocabulary's added tokens that a small one keeps.
func MinSmallVocab() (int, error) {
	b, err := smallBase()
	if err != nil {
		return 0, err
	}
	return 256 + len(b.added), nil
}

// SmallVocab returns a usable byte-level BPE vocabulary of exactly n tokens
// cut from the real DeepSeek V4 one: the 256 byte tokens, the real merges in
// rank order whose two parts are already kept (each adding its result) until
// n tokens are reached, and every added token of the real vocabulary except
// its numbered placeholders (BOS, EOS, the chat, think, tool and DSML
// markers...), with their types. Tokens keep the real vocabulary's relative
// order, so BOS is 0 and EOS 1 as there. Every merge of the result names
// kept tokens, so tokenizer.New accepts it, and it encodes any text.
// n = RealVocabSize returns the real vocabulary itself.
func SmallVocab(n int) (*tokenizer.Vocab, error) {
	if n == RealVocabSize {
		return tokenizer.DefaultVocab()
	}
	b, err := smallBase()
	if err != nil {
		return nil, err
	}
	minN := 256 + len(b.added)
	if n < minN || n > RealVocabSize {
		return nil, fmt.Errorf("synth: small vocabulary of %d tokens: need %d..%d (256 byte tokens + %d special tokens)", n, minN, RealVocabSize, len(b.added))
	}
	real := b.real
	kept := make(map[int]bool, n)
	for _, id := range b.bytes {
		kept[id] = true
	}
	for _, id := range b.added {
		kept[id] = true
	}
	var merges []string
	for _, m := range real.Merges {
		left, right, ok := strings.Cut(m, " ")
		if !ok {
			continue
		}
		l, okL := b.ids[left]
		r, okR := b.ids[right]
		res, okRes := b.ids[left+right]
		if !okL || !okR || !okRes || !kept[l] || !kept[r] || real.Types[res] != tokenizer.TypeNormal {
			continue
		}
		if !kept[res] {
			if len(kept) >= n {
				continue // full: keep only merges between kept tokens
			}
			kept[res] = true
		}
		merges = append(merges, m)
	}
	if len(kept) != n {
		return nil, fmt.Errorf("synth: could only collect %d of %d tokens from the real merges", len(kept), n)
	}
	ids := make([]int, 0, n)
	for id := range kept {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	v := &tokenizer.Vocab{Tokens: make([]string, n), Types: make([]int32, n), Merges: merges, BOS: -1, EOS: -1}
	for i, id := range ids {
		v.Tokens[i], v.Types[i] = real.Tokens[id], real.Types[id]
		if int32(id) == real.BOS {
			v.BOS = int32(i)
		}
		if int32(id) == real.EOS {
			v.EOS = int32(i)
		}
	}
	return v, nil
}
