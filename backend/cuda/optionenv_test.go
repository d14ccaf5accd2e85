package cuda

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"ds4go/backend/cpu"
	"ds4go/model"
)

// TestOptionEnv sets and reads library options by their environment
// variables (Device.SetOptionEnv and OptionEnv, what ds4-bench --ab
// switches), refuses what the load-time reading refuses, and checks that a
// switch between decode steps reaches the recorded graphs: with
// DS4_CUDA_SEG_COMB=0 after 60 tokens (the segmented attention's combine
// in its v66 form, another kernel) the next steps' graphs are built again
// (GraphStats.Rebuilds), and every token's logits stay the CPU backend's,
// bit for bit (exact mode, both forms). Until v66 the switch was
// DS4_CUDA_ATTN_PO=0, which the segmented order's default path no longer
// runs (the test failed in v67's first run of it since: no rebuild).
func TestOptionEnv(t *testing.T) {
	d := gpu(t)
	const po = "DS4_CUDA_ATTN_PO"
	v0, err := d.OptionEnv(po)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.SetOptionEnv(fmt.Sprintf("%s=%d", po, v0)) })
	if err := d.SetOptionEnv(po + "=0"); err != nil {
		t.Fatal(err)
	}
	if v, err := d.OptionEnv(po); err != nil || v != 0 {
		t.Fatalf("%s after setting 0: %d, %v", po, v, err)
	}
	for _, bad := range []string{"DS4_CUDA_NO_SUCH_OPTION=1", po + "=x", po + "=5", po + "=", po, "=1", "", "DS4_CUDA_SPLITK=3", "DS4_CUDA_MV_STAGE=100"} {
		if err := d.SetOptionEnv(bad); err == nil {
			t.Errorf("SetOptionEnv(%q): no error", bad)
		}
	}
	if v, _ := d.OptionEnv(po); v != 0 {
		t.Errorf("%s after refused assignments: %d, want 0", po, v)
	}
	if _, err := d.OptionEnv("DS4_CUDA_NO_SUCH_OPTION"); err == nil {
		t.Error("OptionEnv of an unknown name: no error")
	}
	must(t, d.SetOptionEnv(fmt.Sprintf("%s=%d", po, v0)))
	// the stage digits (switch-checked): each digit 0 or 2..8, at most four
	const ns = "DS4_CUDA_MV_Q8_NS_EX"
	t.Cleanup(func() { d.SetOption(OptMVQ8NSEx, DefaultMVQ8NSEx) })
	for _, bad := range []string{ns + "=1200", ns + "=290", ns + "=10000", ns + "=-2"} {
		if err := d.SetOptionEnv(bad); err == nil {
			t.Errorf("SetOptionEnv(%q): no error", bad)
		}
	}
	must(t, d.SetOptionEnv(ns+"=0802"))
	if v, err := d.OptionEnv(ns); err != nil || v != 802 {
		t.Errorf("%s after setting 0802: %d, %v", ns, v, err)
	}
	must(t, d.SetOption(OptMVQ8NSEx, DefaultMVQ8NSEx))

	// the switch between decode steps: an option of the default exact path
	// (k_attn_seg_combine's two forms, the same bits)
	const sw = "DS4_CUDA_SEG_COMB"
	eachTinyModel(t, func(t *testing.T, cfg model.Config, w *model.Weights, ref *cpu.Backend) {
		be, err := New(w, Options{GraphLayers: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer be.Close()
		defer d.SetOption(OptSegComb, 1)
		toks := testTokens(120, cfg.Vocab)
		want := allLogits(t, ref, 1, toks)
		s := session(t, be, 1)
		got := make([][]float32, len(toks))
		keep := func(p int, l []float32) { got[p] = append([]float32(nil), l...) }
		must(t, d.SetOptionEnv(sw+"=1"))
		if err := s.PrefillAll(context.Background(), toks[:60], keep); err != nil {
			t.Fatal(err)
		}
		before := be.GraphStats()
		must(t, d.SetOptionEnv(sw+"=0"))
		if err := s.PrefillAll(context.Background(), toks[60:], keep); err != nil {
			t.Fatal(err)
		}
		after := be.GraphStats()
		if after.Rebuilds <= before.Rebuilds {
			t.Errorf("the switch did not reach the graphs: rebuilds %d before, %d after", before.Rebuilds, after.Rebuilds)
		}
		for p := range got {
			for j := range got[p] {
				if math.Float32bits(got[p][j]) != math.Float32bits(want[p][j]) {
					t.Fatalf("position %d logit %d: %v, the CPU backend %v", p, j, got[p][j], want[p][j])
				}
			}
		}
	})
}

// TestABIHeader runs without a GPU: the Go side's abiVersion is the
// header's DS4C_ABI_VERSION, and every C entry point the loader binds
// (lib.go's ds4c_ names) is declared in cuda/ds4cuda.h, so that a change
// to one side without the other fails here rather than at load on the GPU
// machine.
func TestABIHeader(t *testing.T) {
	h, err := os.ReadFile(filepath.Join("..", "..", "cuda", "ds4cuda.h"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^#define DS4C_ABI_VERSION (\d+)`).FindSubmatch(h)
	if m == nil {
		t.Fatal("cuda/ds4cuda.h has no DS4C_ABI_VERSION")
	}
	if v, _ := strconv.Atoi(string(m[1])); v != abiVersion {
		t.Errorf("cuda/ds4cuda.h's DS4C_ABI_VERSION %d, lib.go's abiVersion %d", v, abiVersion)
	}
	src, err := os.ReadFile("lib.go")
	if err != nil {
		t.Fatal(err)
	}
	names := regexp.MustCompile(`"(ds4c_[a-z0-9_]+)"`).FindAllSubmatch(src, -1)
	if len(names) < 50 {
		t.Fatalf("found %d entry points in lib.go", len(names))
	}
	for _, n := range names {
		if !regexp.MustCompile(`\b` + string(n[1]) + `\(`).Match(h) {
			t.Errorf("lib.go binds %s, which cuda/ds4cuda.h does not declare", n[1])
		}
	}
}

// TestGoSwitchOptions checks the backend's option setter on its own
// switches (no GPU: a Backend without a device): each goSwitch set and
// read back by its environment variable, values other than 0 and 1
// refused with the switch unchanged, and a library option's name refused
// without a device instead of reaching one.
func TestGoSwitchOptions(t *testing.T) {
	be := &Backend{}
	sws := be.goSwitches()
	if len(sws) == 0 {
		t.Fatal("no switches")
	}
	seen := map[string]bool{}
	for _, sw := range sws {
		if seen[sw.env] {
			t.Fatalf("%s listed twice", sw.env)
		}
		seen[sw.env] = true
		for _, v := range []int{1, 0, 1} {
			if err := be.SetOptionEnv(fmt.Sprintf("%s=%d", sw.env, v)); err != nil {
				t.Fatalf("%s=%d: %v", sw.env, v, err)
			}
			if *sw.v != (v == 1) {
				t.Fatalf("%s=%d left the switch %v", sw.env, v, *sw.v)
			}
			if got, err := be.OptionEnv(sw.env); err != nil || got != v {
				t.Fatalf("%s reads back %d (%v), want %d", sw.env, got, err, v)
			}
		}
		if err := be.SetOptionEnv(sw.env + "=2"); err == nil || !*sw.v {
			t.Errorf("%s=2: error %v, switch %v (want an error and the switch on)", sw.env, err, *sw.v)
		}
	}
	for _, l := range be.goLimits() {
		if seen[l.env] {
			t.Fatalf("%s listed twice", l.env)
		}
		seen[l.env] = true
		for _, v := range []int{3, 1, HCPostMixMaxTokens} {
			if err := be.SetOptionEnv(fmt.Sprintf("%s=%d", l.env, v)); err != nil {
				t.Fatalf("%s=%d: %v", l.env, v, err)
			}
			if got, err := be.OptionEnv(l.env); err != nil || got != v || *l.v != v {
				t.Fatalf("%s=%d reads back %d (%v), the limit %d", l.env, v, got, err, *l.v)
			}
		}
		for _, bad := range []string{"0", "x", fmt.Sprint(HCPostMixMaxTokens + 1)} {
			if err := be.SetOptionEnv(l.env + "=" + bad); err == nil || *l.v != HCPostMixMaxTokens {
				t.Errorf("%s=%s: error %v, limit %d (want an error and the limit kept)", l.env, bad, err, *l.v)
			}
		}
	}
	if err := be.SetOptionEnv("DS4_CUDA_MV_TWO=3"); err == nil {
		t.Error("a library option without a device: no error")
	}
	if _, err := be.OptionEnv("DS4_CUDA_MV_TWO"); err == nil {
		t.Error("reading a library option without a device: no error")
	}
}
