package score

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseSeq(t *testing.T) {
	s, err := ParseSeq([]byte(`{"tokens": [5, 0, 9], "prefill": 2}`), 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Tokens) != 3 || s.Tokens[2] != 9 || s.Prefill != 2 || s.Rows() != 2 {
		t.Errorf("%+v", s)
	}
	if p := s.Positions(); len(p) != 2 || p[0] != 1 || p[1] != 2 {
		t.Errorf("positions %v", p)
	}
	bad := []struct{ in, want string }{
		{`{"tokens": [5, 10], "prefill": 1}`, "outside the vocabulary"},
		{`{"tokens": [-1], "prefill": 1}`, "outside the vocabulary"},
		{`{"tokens": [99999999999], "prefill": 1}`, "outside the vocabulary"},
		{`{"tokens": [1.5], "prefill": 1}`, "sequence JSON"},
		{`{"tokens": ["1"], "prefill": 1}`, "sequence JSON"},
		{`{"tokens": [1, 2], "prefill": 0}`, "prefill 0 is outside [1, 2]"},
		{`{"tokens": [1, 2], "prefill": 3}`, "prefill 3 is outside [1, 2]"},
		{`{"tokens": [1, 2], "prefill": -1}`, "outside"},
		{`{"tokens": [], "prefill": 1}`, "no tokens"},
		{`{"tokens": [1]}`, `no "prefill"`},
		{`{"ids": [1]}`, `no "prefill"`},
		{`{"tokens": [1], "ids": [1], "prefill": 1}`, `both "tokens" and "ids"`},
		{`{"prefill": 1}`, `no "tokens"`},
		{`{"tokens": [1], "prefill": 1} {}`, "trailing data"},
		{`[1, 2]`, "sequence JSON"},
		{``, "sequence JSON"},
		{`{"tokens": [1], "prefill": 1`, "sequence JSON"},
	}
	for _, c := range bad {
		_, err := ParseSeq([]byte(c.in), 10, 0)
		if err == nil || !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one mentioning %q", c.in, err, c.want)
		}
	}
	// "ids" (ds4 --dump-tokens --json), other fields ignored, --prefill.
	s, err = ParseSeq([]byte(`{"ids": [4, 5, 6], "pieces": ["a", "b", "c"]}`), 10, 2)
	if err != nil || len(s.Tokens) != 3 || s.Tokens[0] != 4 || s.Prefill != 2 {
		t.Errorf("ids: %+v %v", s, err)
	}
	if s, err := ParseSeq([]byte(`{"tokens": [4, 5, 6], "prefill": 1}`), 10, 3); err != nil || s.Prefill != 3 {
		t.Errorf("prefill override: %+v %v", s, err)
	}
	if _, err := ParseSeq([]byte(`{"tokens": [4, 5, 6], "prefill": 1}`), 10, 4); err == nil {
		t.Error("prefill override past the end accepted")
	}
	path := filepath.Join(t.TempDir(), "seq.json")
	os.WriteFile(path, []byte(`{"tokens": [3], "prefill": 1}`), 0o644)
	if s, err := LoadSeq(path, 4, 0); err != nil || s.Tokens[0] != 3 {
		t.Errorf("LoadSeq: %v %v", s, err)
	}
	if _, err := LoadSeq(path+".missing", 4, 0); err == nil {
		t.Error("missing file accepted")
	}
}

// FuzzParseSeq checks that no input panics and that an accepted sequence
// is valid.
func FuzzParseSeq(f *testing.F) {
	f.Add([]byte(`{"tokens": [5, 0, 9], "prefill": 2}`))
	f.Add([]byte(`{"tokens": [5, 0, 9], "prefill": 3}`))
	f.Add([]byte(`{"tokens": [1e3], "prefill": 1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseSeq(b, 16, 0)
		if err != nil {
			return
		}
		if err := s.Validate(16); err != nil {
			t.Fatalf("accepted an invalid sequence: %v", err)
		}
		if len(s.Positions()) != s.Rows() || s.Rows() < 1 {
			t.Fatalf("rows %d positions %v", s.Rows(), s.Positions())
		}
	})
}
