package engine_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"

	"ds4go/backend/cpu"
	"ds4go/engine"
	"ds4go/model"
	"ds4go/synth"
)

// tinyBackend builds a small synthetic model (window 16, ratios 0/0/4/128/4/128
// pattern of Flash) on the CPU backend.
func tinyBackend(t *testing.T, mutate func(*model.Config)) engine.Backend {
	t.Helper()
	return tinyBackendMTP(t, mutate, synth.MTPNone)
}

// tinyBackendMTP is tinyBackend with the MTP block as mtp says.
func tinyBackendMTP(t *testing.T, mutate func(*model.Config), mtp synth.MTPMode) engine.Backend {
	t.Helper()
	c := synth.Tiny()
	c.Layers, c.Vocab = 4, 512
	c.CompressRatios = model.FlashRatios(c.Layers)
	c.SwigluClamp = c.SwigluClamp[:c.Layers]
	c.HashLayers = 2
	if mutate != nil {
		mutate(&c)
	}
	f, err := synth.BuildFile(synth.Options{Config: c, Scheme: model.SchemeQ8, Seed: 7, MTP: mtp})
	if err != nil {
		t.Fatal(err)
	}
	w, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	be, err := cpu.New(w, cpu.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	return be
}

func tokens(n, vocab int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32((i*37 + 11) % vocab)
	}
	return out
}

func TestPayloadRoundTrip(t *testing.T) {
	be := tinyBackend(t, nil)
	ctx := context.Background()
	toks := tokens(300, be.Config().Vocab)
	for _, n := range []int{1, 5, 131, 258} { // short, inside a block, past ratio-128 rows
		a, err := engine.NewSession(be, engine.Options{ChunkSize: 32, MaxContext: 1024})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Prefill(ctx, toks[:n]); err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := a.WritePayload(&buf); err != nil {
			t.Fatal(err)
		}
		if int64(buf.Len()) != a.PayloadSize() {
			t.Fatalf("n=%d: wrote %d bytes, PayloadSize says %d", n, buf.Len(), a.PayloadSize())
		}
		if string(buf.Bytes()[:4]) != "DSV4" {
			t.Fatalf("magic %q", buf.Bytes()[:4])
		}
		// Restore into a session with another chunk size, slack and context.
		b, err := engine.NewSession(be, engine.Options{ChunkSize: 7, MaxContext: 2048, RewindSlack: -1})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.ReadPayload(bytes.NewReader(buf.Bytes()), int64(buf.Len())); err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		if !slices.Equal(a.Tokens(), b.Tokens()) || !slices.Equal(a.Logits(), b.Logits()) {
			t.Fatalf("n=%d: restored tokens/logits differ", n)
		}
		// Continuing must give the same bits as the original session.
		for _, tk := range toks[n : n+20] {
			if err := a.Decode(ctx, tk); err != nil {
				t.Fatal(err)
			}
			if err := b.Decode(ctx, tk); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(a.Logits(), b.Logits()) {
				t.Fatalf("n=%d: logits differ after continuing at %d", n, a.Pos())
			}
		}
		// A one-token rewind of a restored session re-runs its last token
		// from the restored rings (no re-derivation of the prefix).
		c, _ := engine.NewSession(be, engine.Options{MaxContext: 1024})
		buf.Reset()
		if err := a.WritePayload(&buf); err != nil {
			t.Fatal(err)
		}
		if err := c.ReadPayload(bytes.NewReader(buf.Bytes()), int64(buf.Len())); err != nil {
			t.Fatal(err)
		}
		m := a.Pos()
		if err := a.Rewind(ctx, m-1); err != nil {
			t.Fatal(err)
		}
		if err := c.Rewind(ctx, m-1); err != nil {
			t.Fatal(err)
		}
		if c.Stats().Rederivations != 0 || !slices.Equal(a.Logits(), c.Logits()) {
			t.Fatalf("n=%d: rewind after restore: %d re-derivations, logits equal %v", n, c.Stats().Rederivations, slices.Equal(a.Logits(), c.Logits()))
		}
		a.Close()
		b.Close()
		c.Close()
	}
}

func TestPayloadRejects(t *testing.T) {
	be := tinyBackend(t, nil)
	ctx := context.Background()
	a, _ := engine.NewSession(be, engine.Options{MaxContext: 1024})
	if err := a.WritePayload(&bytes.Buffer{}); err == nil {
		t.Fatal("empty session wrote a payload")
	}
	if err := a.Prefill(ctx, tokens(200, be.Config().Vocab)); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := a.WritePayload(&buf); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	load := func(be engine.Backend, p []byte, maxCtx int) error {
		s, err := engine.NewSession(be, engine.Options{MaxContext: maxCtx})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		err = s.ReadPayload(bytes.NewReader(p), int64(len(p)))
		if err != nil && s.Pos() != 0 {
			t.Errorf("failed load left %d tokens", s.Pos())
		}
		return err
	}
	mod := func(f func([]byte) []byte) []byte { return f(slices.Clone(good)) }
	cases := map[string][]byte{
		"magic":     mod(func(p []byte) []byte { p[0] = 'X'; return p }),
		"version":   mod(func(p []byte) []byte { p[4] = 2; return p }),
		"layers":    mod(func(p []byte) []byte { p[8*4]++; return p }),
		"vocab":     mod(func(p []byte) []byte { p[11*4]++; return p }),
		"truncated": good[:len(good)-1],
		"longer":    append(slices.Clone(good), 0),
		"token":     mod(func(p []byte) []byte { p[13*4+3] = 0x7f; return p }),
		"rows":      mod(func(p []byte) []byte { p[13*4+4*200+4*512+2*4]++; return p }),
		"raw rows":  mod(func(p []byte) []byte { p[12*4]--; return p }),
	}
	for name, p := range cases {
		if err := load(be, p, 1024); !errors.Is(err, engine.ErrSnapshot) {
			t.Errorf("%s: err = %v, want ErrSnapshot", name, err)
		}
	}
	if err := load(be, good, 100); !errors.Is(err, engine.ErrSnapshot) {
		t.Errorf("too small a context: %v", err)
	}
	// Another model shape: other ratios (same dims) and another window.
	other := tinyBackend(t, func(c *model.Config) { c.CompressRatios = []int{0, 4, 4, 128} })
	if err := load(other, good, 1024); !errors.Is(err, engine.ErrSnapshot) {
		t.Errorf("other ratios: %v", err)
	}
	other = tinyBackend(t, func(c *model.Config) { c.Window = 32 })
	if err := load(other, good, 1024); !errors.Is(err, engine.ErrSnapshot) {
		t.Errorf("other window: %v", err)
	}
	if err := load(be, good, 1024); err != nil {
		t.Errorf("good payload: %v", err)
	}
}
