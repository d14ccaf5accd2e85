package tokenizer

import "unicode/utf8"

// StreamDecoder turns a stream of token ids into text that is always valid
// UTF-8. A token may end in the middle of a character; those bytes are held
// back until the character is complete. Bytes that can never form a valid
// character are emitted as U+FFFD, one per byte (the count Go's utf8 package
// reports). Its zero value is not usable; call Tokenizer.NewStreamDecoder.
type StreamDecoder struct {
	t       *Tokenizer
	pending []byte
}

// NewStreamDecoder returns a StreamDecoder for the tokens of t.
func (t *Tokenizer) NewStreamDecoder() *StreamDecoder {
	return &StreamDecoder{t: t}
}

// Add feeds one token and returns the text that became complete, possibly
// none. The caller owns the returned slice.
func (d *StreamDecoder) Add(id int32) ([]byte, error) {
	if err := d.t.checkID(id); err != nil {
		return nil, err
	}
	d.pending = append(d.pending, d.t.piece(id)...)
	return d.take(false), nil
}

// Flush returns what is held back (an incomplete character, as U+FFFD) and
// resets the decoder for a new stream.
func (d *StreamDecoder) Flush() []byte {
	return d.take(true)
}

// Pending reports how many bytes are held back.
func (d *StreamDecoder) Pending() int { return len(d.pending) }

// take emits the complete characters of pending and keeps an incomplete
// final one unless final is set.
func (d *StreamDecoder) take(final bool) []byte {
	p := d.pending
	i := 0
	valid := true
	for i < len(p) {
		if p[i] < utf8.RuneSelf {
			i++
			continue
		}
		if !final && !utf8.FullRune(p[i:]) {
			break
		}
		r, n := utf8.DecodeRune(p[i:])
		if r == utf8.RuneError && n == 1 {
			valid = false
		}
		i += n
	}
	if i == 0 {
		return nil
	}
	var out []byte
	if valid {
		out = append([]byte(nil), p[:i]...)
	} else {
		out = []byte(string([]rune(string(p[:i]))))
	}
	d.pending = append(d.pending[:0], p[i:]...)
	return out
}
