package server

import "strings"

// stopFilter applies stop sequences to a stream of text. It passes text on
// as soon as it can no longer be the start of a stop sequence, holds back
// only a suffix that might still grow into one, and on a match returns the
// text before it (the stop sequence itself is never emitted).
type stopFilter struct {
	stops []string
	held  string
	hit   string // the matched stop sequence
}

func newStopFilter(stops []string) *stopFilter { return &stopFilter{stops: stops} }

// push adds text and returns what may be emitted now. After a match it
// returns the text before the match and done=true; later calls return
// nothing.
func (f *stopFilter) push(s string) (emit string, done bool) {
	if f.hit != "" {
		return "", true
	}
	if len(f.stops) == 0 {
		return s, false
	}
	buf := f.held + s
	best, which := -1, ""
	for _, st := range f.stops {
		if i := strings.Index(buf, st); i >= 0 && (best < 0 || i < best || i == best && len(st) > len(which)) {
			best, which = i, st
		}
	}
	if best >= 0 {
		f.held, f.hit = "", which
		return buf[:best], true
	}
	hold := 0
	for _, st := range f.stops {
		for k := min(len(st)-1, len(buf)); k > hold; k-- {
			if strings.HasSuffix(buf, st[:k]) {
				hold = k
				break
			}
		}
	}
	f.held = buf[len(buf)-hold:]
	return buf[:len(buf)-hold], false
}

// flush returns the held text at the end of the output (no match).
func (f *stopFilter) flush() string {
	s := f.held
	f.held = ""
	if f.hit != "" {
		return ""
	}
	return s
}
