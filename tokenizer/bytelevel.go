package tokenizer

// GPT-2's byte-level alphabet: every byte maps to one printable rune so that BPE
// can work on strings without losing byte identity. Printable Latin-1 bytes
// ('!'..'~', '¡'..'¬', '®'..'ÿ') map to themselves; the other 68 bytes map, in
// increasing byte order, to U+0100, U+0101, ... (space becomes 'Ġ', '\n' 'Ċ').

// byteRune maps a byte to its rune in the byte-level alphabet.
var byteRune [256]rune

// runeByte maps a byte-level rune back to its byte; runeByteOK says which runes
// belong to the alphabet. Every rune of the alphabet is below maxByteRune.
var (
	runeByte   [maxByteRune]byte
	runeByteOK [maxByteRune]bool
)

const maxByteRune = 0x144

func init() {
	n := rune(0)
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE {
			byteRune[b] = rune(b)
		} else {
			byteRune[b] = 256 + n
			n++
		}
		runeByte[byteRune[b]] = byte(b)
		runeByteOK[byteRune[b]] = true
	}
}

// ByteLevelEncode returns s in GPT-2's byte-to-unicode form, the form in which
// the vocabulary stores normal tokens (a space becomes "Ġ", a newline "Ċ").
func ByteLevelEncode(s string) string {
	out := make([]rune, len(s))
	for i := 0; i < len(s); i++ {
		out[i] = byteRune[s[i]]
	}
	return string(out)
}

// byteLevelDecode maps a byte-level string back to bytes. ok is false if s has
// a rune outside the byte-level alphabet.
func byteLevelDecode(dst []byte, s string) (out []byte, ok bool) {
	out = dst
	for _, r := range s {
		if r < 0 || r >= maxByteRune || !runeByteOK[r] {
			return dst, false
		}
		out = append(out, runeByte[r])
	}
	return out, true
}
