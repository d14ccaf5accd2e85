package engine_test

import (
	"testing"

	"ds4go/engine"
)

// chunkyBackend prefers a chunk size of its own (engine.ChunkSizer) and
// records the batch capacity the session asks for.
type chunkyBackend struct {
	engine.Backend
	prefer int
	asked  *int
}

func (c chunkyBackend) PreferredChunk() int { return c.prefer }

func (c chunkyBackend) NewBatch(n int) (engine.Batch, error) {
	*c.asked = n
	return c.Backend.NewBatch(n)
}

func TestPreferredChunk(t *testing.T) {
	be := tinyBackend(t, nil)
	for _, c := range []struct{ prefer, opt, want int }{
		{0, 0, engine.DefaultChunkSize}, // no preference
		{40, 0, 40},                     // the backend's
		{40, 7, 7},                      // the caller's wins
	} {
		var asked int
		s, err := engine.NewSession(chunkyBackend{be, c.prefer, &asked}, engine.Options{ChunkSize: c.opt, MaxContext: 256})
		if err != nil {
			t.Fatal(err)
		}
		if asked != c.want {
			t.Errorf("preference %d, option %d: batch of %d, want %d", c.prefer, c.opt, asked, c.want)
		}
		s.Close()
	}
}
