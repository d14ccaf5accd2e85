package tokenizer

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Tokenizer encodes text to token ids and decodes ids back to bytes. It is
// immutable once built, apart from an internal cache, and safe for concurrent
// use.
type Tokenizer struct {
	tokens []string
	types  []int32
	ids    map[string]int32 // token string -> id, every token
	bos    int32
	eos    int32

	byteTok [256]int32       // the token of each single byte
	merges  map[uint64]merge // (left id, right id) -> merge
	added   addedMatcher

	// The bytes each token decodes to: data[off[id]:off[id+1]].
	pieceOff  []uint32
	pieceData []byte

	cache wordCache
}

// merge is one BPE merge: its rank (lower merges first) and the merged token.
type merge struct {
	rank int32
	id   int32
}

const noRank = math.MaxInt32

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// New checks v and builds a Tokenizer from it. It reports duplicate token
// strings, unknown token types, merges that are malformed or name tokens
// missing from the vocabulary, a vocabulary without the 256 byte tokens, and
// BOS or EOS ids out of range. When the same pair appears in several merges
// the last one counts, as in Hugging Face tokenizers. The Tokenizer keeps no
// reference to v.
func New(v *Vocab) (*Tokenizer, error) {
	if v == nil {
		return nil, errors.New("tokenizer: nil vocabulary")
	}
	n := len(v.Tokens)
	if n == 0 {
		return nil, errors.New("tokenizer: empty vocabulary")
	}
	if n > math.MaxInt32 {
		return nil, fmt.Errorf("tokenizer: %d tokens is too many", n)
	}
	if v.Types != nil && len(v.Types) != n {
		return nil, fmt.Errorf("tokenizer: %d token types for %d tokens", len(v.Types), n)
	}
	t := &Tokenizer{
		tokens: append([]string(nil), v.Tokens...),
		types:  make([]int32, n),
		ids:    make(map[string]int32, n),
		bos:    v.BOS,
		eos:    v.EOS,
	}
	for id, tok := range t.tokens {
		typ := TypeNormal
		if v.Types != nil {
			typ = v.Types[id]
		}
		if typ < TypeNormal || typ > TypeByte {
			return nil, fmt.Errorf("tokenizer: token %d (%q) has unknown type %d", id, tok, typ)
		}
		t.types[id] = typ
		if prev, dup := t.ids[tok]; dup {
			return nil, fmt.Errorf("tokenizer: tokens %d and %d are both %q", prev, id, tok)
		}
		t.ids[tok] = int32(id)
	}
	for _, x := range []struct {
		name string
		id   int32
	}{{"BOS", v.BOS}, {"EOS", v.EOS}} {
		if x.id < -1 || x.id >= int32(n) {
			return nil, fmt.Errorf("tokenizer: %s id %d out of range [0, %d)", x.name, x.id, n)
		}
	}
	for b := range 256 {
		id, ok := t.ids[string(byteRune[b])]
		if !ok || t.types[id] != TypeNormal {
			return nil, fmt.Errorf("tokenizer: vocabulary has no normal token for byte 0x%02x (%q)", b, string(byteRune[b]))
		}
		t.byteTok[b] = id
	}
	if len(v.Merges) >= noRank {
		return nil, fmt.Errorf("tokenizer: %d merges is too many", len(v.Merges))
	}
	t.merges = make(map[uint64]merge, len(v.Merges))
	for rank, m := range v.Merges {
		left, right, ok := strings.Cut(m, " ")
		if !ok || strings.Contains(right, " ") {
			return nil, fmt.Errorf("tokenizer: merge %d %q is not two tokens separated by one space", rank, m)
		}
		var pair [3]int32
		for i, part := range []string{left, right, left + right} {
			id, ok := t.ids[part]
			if !ok {
				return nil, fmt.Errorf("tokenizer: merge %d %q: token %q is not in the vocabulary", rank, m, part)
			}
			pair[i] = id
		}
		t.merges[pairKey(pair[0], pair[1])] = merge{rank: int32(rank), id: pair[2]}
	}
	if err := t.added.build(t.tokens, t.types); err != nil {
		return nil, err
	}
	if err := t.buildPieces(); err != nil {
		return nil, err
	}
	t.cache.init()
	return t, nil
}

// buildPieces computes the bytes of every token.
func (t *Tokenizer) buildPieces() error {
	t.pieceOff = make([]uint32, len(t.tokens)+1)
	t.pieceData = make([]byte, 0, len(t.tokens)*6)
	for id, tok := range t.tokens {
		switch t.types[id] {
		case TypeNormal:
			// As Hugging Face's ByteLevel decoder: a token with a character
			// outside the byte-level alphabet decodes to its own UTF-8.
			var ok bool
			if t.pieceData, ok = byteLevelDecode(t.pieceData, tok); !ok {
				t.pieceData = append(t.pieceData, tok...)
			}
		case TypeByte:
			if b, ok := parseByteToken(tok); ok {
				t.pieceData = append(t.pieceData, b)
			} else {
				t.pieceData = append(t.pieceData, tok...)
			}
		case TypeUnused:
		default: // control, user-defined, unknown: the literal text
			t.pieceData = append(t.pieceData, tok...)
		}
		if len(t.pieceData) > math.MaxUint32 {
			return errors.New("tokenizer: vocabulary text too large")
		}
		t.pieceOff[id+1] = uint32(len(t.pieceData))
	}
	return nil
}

// parseByteToken parses a SentencePiece byte token such as "<0x0A>".
func parseByteToken(s string) (byte, bool) {
	if len(s) != 6 || !strings.HasPrefix(s, "<0x") || s[5] != '>' {
		return 0, false
	}
	b, err := strconv.ParseUint(s[3:5], 16, 8)
	return byte(b), err == nil
}

// VocabSize returns the number of tokens (the largest id plus one).
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

// BOS returns the begin-of-sentence id, or -1 if the vocabulary has none.
func (t *Tokenizer) BOS() int32 { return t.bos }

// EOS returns the end-of-sentence id, or -1 if the vocabulary has none.
func (t *Tokenizer) EOS() int32 { return t.eos }

// Lookup returns the id of the token whose vocabulary string is tok. Added
// tokens are stored as their text ("<｜User｜>"), normal tokens in byte-level
// form ("Ġthe" for " the"; see ByteLevelEncode).
func (t *Tokenizer) Lookup(tok string) (int32, bool) {
	id, ok := t.ids[tok]
	return id, ok
}

// Token returns the vocabulary string of id, as in Vocab.Tokens.
func (t *Tokenizer) Token(id int32) (string, error) {
	if err := t.checkID(id); err != nil {
		return "", err
	}
	return t.tokens[id], nil
}

// Type returns the token type of id (TypeNormal, TypeControl, ...), or 0 if
// id is out of range.
func (t *Tokenizer) Type(id int32) int32 {
	if id < 0 || int(id) >= len(t.types) {
		return 0
	}
	return t.types[id]
}

// IsAdded reports whether id is an added token (TypeControl or
// TypeUserDefined): one that EncodeWithSpecial matches in text and Encode
// never produces.
func (t *Tokenizer) IsAdded(id int32) bool {
	typ := t.Type(id)
	return typ == TypeControl || typ == TypeUserDefined
}

func (t *Tokenizer) checkID(id int32) error {
	if id < 0 || int(id) >= len(t.tokens) {
		return fmt.Errorf("tokenizer: token id %d out of range [0, %d)", id, len(t.tokens))
	}
	return nil
}

// piece returns the bytes of id without copying; the caller must not modify
// them. id must be valid.
func (t *Tokenizer) piece(id int32) []byte {
	return t.pieceData[t.pieceOff[id]:t.pieceOff[id+1]:t.pieceOff[id+1]]
}

// TokenBytes returns the bytes that id decodes to: the raw bytes of a normal
// token (which may be part of a UTF-8 character), the text of an added token,
// nothing for an unused one.
func (t *Tokenizer) TokenBytes(id int32) ([]byte, error) {
	if err := t.checkID(id); err != nil {
		return nil, err
	}
	return append([]byte(nil), t.piece(id)...), nil
}

// Decode returns the concatenated bytes of ids (see TokenBytes). Added tokens
// decode to their text, so Decode(EncodeWithSpecial(s)) == s. The result
// need not be valid UTF-8; StreamDecoder gives valid UTF-8 incrementally.
func (t *Tokenizer) Decode(ids []int32) ([]byte, error) {
	return t.AppendDecode(nil, ids)
}

// AppendDecode appends the bytes of ids to dst (see Decode).
func (t *Tokenizer) AppendDecode(dst []byte, ids []int32) ([]byte, error) {
	for _, id := range ids {
		if err := t.checkID(id); err != nil {
			return dst, err
		}
		dst = append(dst, t.piece(id)...)
	}
	return dst, nil
}

// Encode tokenizes plain text. Added tokens are never produced: text such as
// "<｜User｜>" is encoded like any other characters. Any bytes are accepted;
// see the package documentation for invalid UTF-8.
func (t *Tokenizer) Encode(text string) []int32 {
	return t.AppendEncode(make([]int32, 0, len(text)/3+1), text)
}

// AppendEncode appends the tokens of text to dst, as Encode.
func (t *Tokenizer) AppendEncode(dst []int32, text string) []int32 {
	preTokenize(text, func(p string) { dst = t.appendWord(dst, p) })
	return dst
}

// EncodeWithSpecial tokenizes a rendered prompt: every added token (types
// TypeControl and TypeUserDefined: BOS, <｜User｜>, <think>, ｜DSML｜, ...) that
// occurs in text becomes its id, and the text between them is encoded as by
// Encode. Matches are found left to right, the longest at each position, as
// Hugging Face's encode does for the DeepSeek vocabulary.
func (t *Tokenizer) EncodeWithSpecial(text string) []int32 {
	return t.AppendEncodeWithSpecial(make([]int32, 0, len(text)/3+1), text)
}

// AppendEncodeWithSpecial appends the tokens of text to dst, as
// EncodeWithSpecial.
func (t *Tokenizer) AppendEncodeWithSpecial(dst []int32, text string) []int32 {
	seg := 0
	for i := 0; i < len(text); i++ {
		if !t.added.first[text[i]] {
			continue
		}
		id, end := t.added.longestAt(text, i)
		if end < 0 {
			continue
		}
		if seg < i {
			dst = t.AppendEncode(dst, text[seg:i])
		}
		dst = append(dst, id)
		seg = end
		i = end - 1
	}
	if seg < len(text) {
		dst = t.AppendEncode(dst, text[seg:])
	}
	return dst
}
