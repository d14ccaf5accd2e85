package engineadapter

import (
	"os"
	"reflect"
	"testing"

	"ds4go/server"
)

// TestSampledRequestsPipelined: sampled requests (seeded) go through the
// session's DecodePicked (server.PickSession); their replies — text, finish
// reason, usage, and the continued disk checkpoints written on the way
// (each pauses the run, and the paused draw is made again after the save)
// — are those of the one-token loop, for chat with the default filters,
// top-k, top-p and min-p, reasoning, and raw completions.
func TestSampledRequestsPipelined(t *testing.T) {
	eng := demo(t, 2048)
	if _, ok := any(&session{}).(server.PickSession); !ok {
		t.Fatal("the adapter's session is not a server.PickSession")
	}
	chat := func(extra string) call {
		return call{"/v1/chat/completions", `{"model":"deepseek-chat","messages":[{"role":"user","content":"Tell me a story, demo model."}]` + extra + `}`}
	}
	calls := []call{
		chat(`,"seed":1,"max_tokens":120`),
		chat(`,"seed":2,"temperature":0.7,"top_p":0.9,"max_tokens":60`),
		chat(`,"seed":3,"temperature":1.3,"top_k":20,"min_p":0.1,"max_tokens":60`),
		chat(`,"seed":4,"reasoning_effort":"high","max_tokens":80`),
		{"/v1/completions", `{"model":"deepseek-chat","prompt":"Once upon a time","seed":5,"max_tokens":70}`},
	}
	dirA, dirB := t.TempDir(), t.TempDir()
	got, want := serveCalls(t, eng, calls, dirA), serveCalls(t, oneStep{eng}, calls, dirB)
	for i := range calls {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("request %d (%s):\n DecodePicked: %v\n one step:     %v", i, calls[i].body, got[i], want[i])
		}
	}
	fa, _ := os.ReadDir(dirA)
	fb, _ := os.ReadDir(dirB)
	if len(fa) != len(fb) || len(fb) < 3 {
		t.Errorf("disk checkpoints: %d with DecodePicked, %d with one step (want the same, at least 3)", len(fa), len(fb))
	}
}
