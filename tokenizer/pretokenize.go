package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// The DeepSeek V3/V4 pre-tokenizer is a Sequence of three Split steps, each
// with behavior "Isolated": every regex match becomes its own piece, and the
// text between matches is kept as pieces too. Each step runs on every piece
// that the previous one produced, so a piece's end is the end of the input for
// the next regex (this matters for the \s+(?!\S) lookahead). The regexes, as
// the tokenizer.json stores them (Oniguruma syntax, leftmost-first
// alternation, greedy quantifiers with backtracking):
//
//	1. \p{N}{1,3}
//	2. [一-龥぀-ゟ゠-ヿ]+            (U+4E00–U+9FA5, U+3040–U+309F, U+30A0–U+30FF)
//	3. [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+   (a)
//	   |[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+            (b)
//	   | ?[\p{P}\p{S}]+[\r\n]*                          (c)
//	   |\s*[\r\n]+                                      (d)
//	   |\s+(?!\S)                                       (e)
//	   |\s+                                             (f)
//
// The scanner below implements each step by hand. \p{..} are Unicode general
// categories (Go's unicode tables, Unicode 15.0, completed with the characters
// Unicode 15.1 and 16.0 added, as HF's Oniguruma knows them: unicode16.go),
// \s is Unicode White_Space (unicode.IsSpace).
// A byte that is not part of a valid UTF-8 sequence counts as one character of
// no class, like a control character.

// Character class bits.
const (
	cL          uint16 = 1 << iota // \p{L}
	cM                             // \p{M}
	cN                             // \p{N}
	cP                             // \p{P}
	cS                             // \p{S}
	cSpace                         // \s
	cNL                            // [\r\n]
	cCJK                           // [一-龥぀-ゟ゠-ヿ]
	cASCIIPunct                    // the ASCII punctuation class of (a)
)

// bmpClass holds the class bits of every rune of the Basic Multilingual
// Plane, ASCII-only bits included; unicodeClass gives the others.
var bmpClass [0x10000]uint16

func init() {
	mark := func(tab *unicode.RangeTable, bit uint16) {
		for _, rg := range tab.R16 {
			for r := int(rg.Lo); r <= int(rg.Hi); r += int(rg.Stride) {
				bmpClass[r] |= bit
			}
		}
		for _, rg := range tab.R32 {
			for r := int(rg.Lo); r <= int(rg.Hi) && r < len(bmpClass); r += int(rg.Stride) {
				bmpClass[r] |= bit
			}
		}
	}
	mark(unicode.L, cL)
	mark(unicode.M, cM)
	mark(unicode.N, cN)
	mark(unicode.P, cP)
	mark(unicode.S, cS)
	for _, rg := range unicode16New {
		for r := rg.lo; r <= rg.hi && r < rune(len(bmpClass)); r++ {
			if bmpClass[r]&categoryBits == 0 {
				bmpClass[r] |= rg.class()
			}
		}
	}
	for r := range bmpClass {
		if unicode.IsSpace(rune(r)) {
			bmpClass[r] |= cSpace
		}
	}
	for r := 0x4E00; r <= 0x9FA5; r++ {
		bmpClass[r] |= cCJK
	}
	for r := 0x3040; r <= 0x30FF; r++ {
		bmpClass[r] |= cCJK
	}
	bmpClass['\r'] |= cNL
	bmpClass['\n'] |= cNL
	for r := '!'; r <= '~'; r++ {
		if bmpClass[r]&(cP|cS) != 0 {
			bmpClass[r] |= cASCIIPunct
		}
	}
}

// categoryBits are the general-category class bits.
const categoryBits = cL | cM | cN | cP | cS

// newerRange is a run of code points that Unicode 16.0 assigns and Go's
// tables (Unicode 15.0) may not, with their major category: 'L', 'M', 'N',
// 'P', 'S' or 'Z' (unicode16.go).
type newerRange struct {
	lo, hi rune
	major  byte
}

// class returns the range's class bits.
func (n newerRange) class() uint16 {
	switch n.major {
	case 'L':
		return cL
	case 'M':
		return cM
	case 'N':
		return cN
	case 'P':
		return cP
	case 'S':
		return cS
	}
	return 0
}

// unicode16Class returns the class bits Unicode 16.0 gives r when r is in
// unicode16New, else 0.
func unicode16Class(r rune) uint16 {
	lo, hi := 0, len(unicode16New)
	for lo < hi {
		m := (lo + hi) / 2
		switch rg := unicode16New[m]; {
		case r < rg.lo:
			hi = m
		case r > rg.hi:
			lo = m + 1
		default:
			return rg.class()
		}
	}
	return 0
}

// unicodeClass returns the class bits of r from the Unicode tables (Go's,
// completed by Unicode 16.0 for the characters Go's do not assign; without
// the ASCII-only bits cNL and cASCIIPunct).
func unicodeClass(r rune) uint16 {
	var c uint16
	switch {
	case r >= 0x4E00 && r <= 0x9FA5: // all Lo, and CJK: the common case first
		return cL | cCJK
	case unicode.IsLetter(r):
		c = cL
	case unicode.IsMark(r):
		c = cM
	case unicode.IsNumber(r):
		c = cN
	case unicode.IsPunct(r):
		c = cP
	case unicode.IsSymbol(r):
		c = cS
	default:
		c = unicode16Class(r)
	}
	if unicode.IsSpace(r) {
		c |= cSpace
	}
	if r >= 0x3040 && r <= 0x30FF {
		c |= cCJK
	}
	return c
}

// classAt returns the class bits of the character that starts at s[i] and its
// length in bytes. An invalid UTF-8 byte is a character of no class.
func classAt(s string, i int) (uint16, int) {
	if b := s[i]; b < utf8.RuneSelf {
		return bmpClass[b], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	if r < 0x10000 {
		if r == utf8.RuneError && n == 1 {
			return 0, 1
		}
		return bmpClass[r], n
	}
	return unicodeClass(r), n
}

// PreTokenize splits text into the pieces that BPE encodes separately, as the
// DeepSeek V3/V4 pre-tokenizer does (before its byte-level mapping). It does
// not split off added tokens. The pieces are substrings of text, in order, and
// together they cover it.
func PreTokenize(text string) []string {
	var out []string
	preTokenize(text, func(p string) { out = append(out, p) })
	return out
}

// preTokenize calls emit with each piece of s, in order.
func preTokenize(s string, emit func(string)) {
	// Step 1: \p{N}{1,3}. A digit group passes steps 2 and 3 unchanged (no
	// character of \p{N} is in the CJK class, and no alternative of step 3 can
	// match inside a run of \p{N}), so it is emitted directly.
	gap := 0
	for i := 0; i < len(s); {
		c, n := classAt(s, i)
		if c&cN == 0 {
			i += n
			continue
		}
		j := i + n
		for k := 1; k < 3 && j < len(s); k++ {
			c, n := classAt(s, j)
			if c&cN == 0 {
				break
			}
			j += n
		}
		if gap < i {
			splitCJK(s[gap:i], emit)
		}
		emit(s[i:j])
		i, gap = j, j
	}
	if gap < len(s) {
		splitCJK(s[gap:], emit)
	}
}

// splitCJK is step 2: [一-龥぀-ゟ゠-ヿ]+ isolated; every piece goes on to step 3.
func splitCJK(s string, emit func(string)) {
	gap := 0
	for i := 0; i < len(s); {
		if s[i] < utf8.RuneSelf {
			i++
			continue
		}
		c, n := classAt(s, i)
		if c&cCJK == 0 {
			i += n
			continue
		}
		j := i + n
		for j < len(s) {
			c, n := classAt(s, j)
			if c&cCJK == 0 {
				break
			}
			j += n
		}
		if gap < i {
			splitWords(s[gap:i], emit)
		}
		splitWords(s[i:j], emit)
		i, gap = j, j
	}
	if gap < len(s) {
		splitWords(s[gap:], emit)
	}
}

// splitWords is step 3: at each position the first alternative that matches
// gives the piece; characters where none matches gather into gap pieces.
func splitWords(s string, emit func(string)) {
	gap := 0
	for i := 0; i < len(s); {
		end, n := matchWord(s, i)
		if end < 0 {
			i += n
			continue
		}
		if gap < i {
			emit(s[gap:i])
		}
		emit(s[i:end])
		i, gap = end, end
	}
	if gap < len(s) {
		emit(s[gap:])
	}
}

// matchWord returns the end of the step-3 match that starts at s[i], or -1 if
// none does; n is the length of the character at s[i].
func matchWord(s string, i int) (end, n int) {
	c0, n := classAt(s, i)
	j := i + n
	// (a) one ASCII punctuation character, then ASCII letters.
	if c0&cASCIIPunct != 0 && j < len(s) && isASCIILetter(s[j]) {
		k := j + 1
		for k < len(s) && isASCIILetter(s[k]) {
			k++
		}
		return k, n
	}
	// (b) an optional character that is not \r, \n, a letter, punctuation or a
	// symbol, then letters and marks. If the optional character is taken but no
	// letter or mark follows, the regex backtracks to match without it.
	if c0&(cNL|cL|cP|cS) == 0 && j < len(s) {
		if c1, n1 := classAt(s, j); c1&(cL|cM) != 0 {
			return scanWhile(s, j+n1, cL|cM), n
		}
	}
	if c0&(cL|cM) != 0 {
		return scanWhile(s, j, cL|cM), n
	}
	// (c) an optional space, punctuation and symbols, then \r and \n.
	if s[i] == ' ' && j < len(s) {
		if c1, n1 := classAt(s, j); c1&(cP|cS) != 0 {
			return scanNewlines(s, scanWhile(s, j+n1, cP|cS)), n
		}
	}
	if c0&(cP|cS) != 0 {
		return scanNewlines(s, scanWhile(s, j, cP|cS)), n
	}
	if c0&cSpace == 0 {
		return -1, n
	}
	// (d), (e), (f): a run of whitespace from i to k.
	k, lastNL, lastStart := j, -1, i
	if c0&cNL != 0 {
		lastNL = j
	}
	for k < len(s) {
		c, m := classAt(s, k)
		if c&cSpace == 0 {
			break
		}
		if c&cNL != 0 {
			lastNL = k + m
		}
		lastStart = k
		k += m
	}
	switch {
	case lastNL >= 0:
		// (d) \s* backtracks to the last \r or \n of the run; [\r\n]+ then
		// takes that one (the next character is not \r or \n).
		return lastNL, n
	case k == len(s) || lastStart == i:
		// (e) matches the whole run at the end of the input; (f) matches a
		// single whitespace character followed by a non-space.
		return k, n
	default:
		// (e) backtracks by one character so that whitespace follows.
		return lastStart, n
	}
}

// scanWhile returns the end of the run of characters from s[i] that have a
// class bit in mask.
func scanWhile(s string, i int, mask uint16) int {
	for i < len(s) {
		c, n := classAt(s, i)
		if c&mask == 0 {
			break
		}
		i += n
	}
	return i
}

// scanNewlines returns the end of the run of \r and \n from s[i].
func scanNewlines(s string, i int) int {
	for i < len(s) && (s[i] == '\r' || s[i] == '\n') {
		i++
	}
	return i
}

func isASCIILetter(b byte) bool { return (b >= 'A' && b <= 'Z') || (b >= 'a' && b <= 'z') }
