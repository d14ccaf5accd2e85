package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"ds4go/bench"
	"ds4go/loader"
	"ds4go/synth"
)

// TestDemoCPU runs the demo model on the CPU backend to tiny frontiers and
// checks the CSV's shape and the SVG.
func TestDemoCPU(t *testing.T) {
	dir := t.TempDir()
	csvPath, svgPath := filepath.Join(dir, "b.csv"), filepath.Join(dir, "b.svg")
	var stdout, stderr bytes.Buffer
	code := run([]string{"--frontiers", "32,64", "--gen", "4", "--csv", csvPath, "--plot", svgPath, "--threads", "2"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	data, err := os.ReadFile(csvPath)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 3 || lines[0] != strings.Join(bench.Header, ",") {
		t.Fatalf("CSV:\n%s", data)
	}
	prev := 0
	for _, l := range lines[1:] {
		f := strings.Split(l, ",")
		if len(f) != len(bench.Header) {
			t.Fatalf("line %q has %d fields", l, len(f))
		}
		fr, _ := strconv.Atoi(f[0])
		pt, _ := strconv.Atoi(f[1])
		gt, _ := strconv.Atoi(f[4])
		kv, _ := strconv.ParseInt(f[7], 10, 64)
		ptps, _ := strconv.ParseFloat(f[3], 64)
		gtps, _ := strconv.ParseFloat(f[6], 64)
		if fr <= prev || pt != fr-prev || gt != 4 || kv <= 0 || ptps <= 0 || gtps <= 0 {
			t.Errorf("bad line %q after frontier %d", l, prev)
		}
		prev = fr
	}
	rows, err := bench.ReadCSV(bytes.NewReader(data))
	if err != nil || len(rows) != 2 || rows[1].KVBytes < rows[0].KVBytes {
		t.Errorf("ReadCSV: %v %+v", err, rows)
	}
	svg, err := os.ReadFile(svgPath)
	if err != nil || !bytes.HasPrefix(svg, []byte("<svg")) || bytes.Count(svg, []byte("<polyline")) != 2 {
		t.Errorf("SVG: %v\n%.300s", err, svg)
	}

	// plot-only mode
	svg2 := filepath.Join(dir, "c.svg")
	if code := run([]string{"--plot-csv", csvPath, "--plot", svg2}, &stdout, &stderr); code != 0 {
		t.Fatalf("plot-csv: exit %d: %s", code, stderr.String())
	}
}

// TestTableRewindsInPlace: a table whose decodes pass the engine's default
// rewind slack rewinds each frontier in place (ds4-bench sizes the slack
// for --gen), not by re-prefilling the whole frontier — which at a 1M-token
// frontier took minutes and cost a time-limited run its last row.
func TestTableRewindsInPlace(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"--frontiers", "32,64", "--gen", "72", "--threads", "2"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "Rederived:0 Rederivations:0") {
		t.Errorf("the table's rewinds re-prefilled:\n%s", stderr.String())
	}
	if rows, err := bench.ReadCSV(bytes.NewReader(stdout.Bytes())); err != nil || len(rows) != 2 || rows[1].GenTokens != 72 {
		t.Errorf("CSV: %v %+v\n%s", err, rows, stdout.String())
	}
}

func TestBadArgs(t *testing.T) {
	var stdout, stderr bytes.Buffer
	for _, args := range [][]string{
		{"--frontiers", "64,32"},
		{"--frontiers", "32,x"},
		{"--frontiers", "64", "--ctx", "40"},
		{"--backend", "tpu", "--frontiers", "16"},
		// --ab: one frontier, greedy, the CUDA backend, rounds > 0 (checked before loading)
		{"--backend", "cuda", "--frontiers", "32,64", "--ab", "default;DS4_CUDA_PDL=0"},
		{"--frontiers", "32", "--ab", "default;DS4_CUDA_PDL=0"},
		{"--backend", "cuda", "--frontiers", "32", "--ab", "default;DS4_CUDA_PDL=0", "--temp", "1"},
		{"--backend", "cuda", "--frontiers", "32", "--ab", "default;DS4_CUDA_PDL=0", "--rounds", "0"},
		{"--backend", "cuda", "--frontiers", "32", "--ab", "default;DS4_CUDA_PDL=0", "--gen", "0"},
		{"--backend", "cuda", "--frontiers", "32", "--ab", "default;DS4_CUDA_PDL=0", "--mtp", "model", "--accept", "0.5,1"},
	} {
		if code := run(args, &stdout, &stderr); code == 0 {
			t.Errorf("%v: exit 0", args)
		}
	}
	// --settle: not below 0, not with --ab (its own --ab-settle); and
	// --host-greedy times plain decoding only (checked before loading)
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--frontiers", "32", "--settle", "-1"}, "--settle -1"},
		{[]string{"--backend", "cuda", "--frontiers", "32", "--ab", "default;DS4_CUDA_PDL=0", "--settle", "4"}, "--ab settles with --ab-settle"},
		{[]string{"--frontiers", "32", "--host-greedy", "--mtp", "model", "--accept", "0.5"}, "not with --accept"},
	} {
		stderr.Reset()
		if code := run(c.args, &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), c.msg) {
			t.Errorf("%v: exit %d, %q (want %q)", c.args, code, stderr.String(), c.msg)
		}
	}
}

// abOptions is a bench.OptionSetter over a map (the CPU backend has no
// library options).
type abOptions map[string]int

func (o abOptions) SetOptionEnv(assign string) error {
	n, v, _ := strings.Cut(assign, "=")
	x, err := strconv.Atoi(v)
	if _, ok := o[n]; !ok || err != nil {
		return fmt.Errorf("bad option %q", assign)
	}
	o[n] = x
	return nil
}

func (o abOptions) OptionEnv(name string) (int, error) {
	x, ok := o[name]
	if !ok {
		return 0, fmt.Errorf("no option %s", name)
	}
	return x, nil
}

// TestRunAB runs --ab's body on the demo model's CPU backend with options
// that switch nothing: a CSV line per run, interleaved, and a summary line
// per variant in the log.
func TestRunAB(t *testing.T) {
	m, err := loader.Open(loader.Options{Backend: "cpu", Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	prompt := bench.RandomTokens(40, m.Config.Vocab, 1)
	var out, log bytes.Buffer
	logf := func(f string, a ...any) { fmt.Fprintf(&log, f+"\n", a...) }
	fail := func(err error) int { t.Errorf("runAB: %v", err); return 1 }
	code := runAB(context.Background(), abOptions{"DS4_CUDA_X": 1}, m.Backend, prompt, &out,
		abConfig{sets: "default;DS4_CUDA_X=0", frontier: 32, gen: 3, rounds: 2, settle: 2, ctxLen: 64}, logf, fail)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, log.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{"1,default,0,", "1,DS4_CUDA_X=0,0,", "2,default,0,", "2,DS4_CUDA_X=0,0,"}
	if len(lines) != 5 || lines[0] != "round,variant,prefill_tokens,prefill_s,prefill_tps,gen_tokens,gen_s,gen_tps" {
		t.Fatalf("CSV:\n%s", out.String())
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i+1], w) {
			t.Errorf("line %d %q, want it to start %q", i+1, lines[i+1], w)
		}
	}
	if n := strings.Count(log.String(), "ab decode default ") + strings.Count(log.String(), "ab decode DS4_CUDA_X=0 "); n != 2 ||
		strings.Contains(log.String(), "ab prefill") {
		t.Errorf("%d decode summary lines, want 2 and no prefill one:\n%s", n, log.String())
	}
	// the prefill timed too: 8 tokens from the frontier each run
	out.Reset()
	log.Reset()
	code = runAB(context.Background(), abOptions{"DS4_CUDA_X": 1}, m.Backend, prompt, &out,
		abConfig{sets: "default;DS4_CUDA_X=0", frontier: 32, prefill: 8, gen: 2, rounds: 1, ctxLen: 64}, logf, fail)
	lines = strings.Split(strings.TrimSpace(out.String()), "\n")
	if code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[1], "1,default,8,") || !strings.Contains(log.String(), "ab prefill DS4_CUDA_X=0 ") {
		t.Errorf("with the prefill: exit %d\n%s\n%s", code, out.String(), log.String())
	}
	// a context that ends (--time-limit) stops it with the runs done: exit 0
	log.Reset()
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	code = runAB(cctx, abOptions{"DS4_CUDA_X": 1}, m.Backend, prompt, &out,
		abConfig{sets: "default;DS4_CUDA_X=0", frontier: 32, gen: 3, rounds: 2, ctxLen: 64}, logf, fail)
	if code != 0 || !strings.Contains(log.String(), "time limit reached: 0 of 4 runs") {
		t.Errorf("cancelled: exit %d\n%s", code, log.String())
	}
	// an unknown option fails before any work
	code = runAB(context.Background(), abOptions{}, m.Backend, prompt, &out,
		abConfig{sets: "default;DS4_CUDA_Y=0", frontier: 32, gen: 3, rounds: 1, ctxLen: 64}, logf, func(error) int { return 1 })
	if code == 0 {
		t.Error("unknown option: exit 0")
	}
}

// TestRunABSpeculative runs --ab's body with speculative decoding (--mtp,
// the model file's own block, on the CPU backend): every draft committed at
// the rate 1, some at 0.5, and the same draws of commits for each variant
// (Acceptance.Reset at each switch: two variants that switch nothing commit
// as many drafts).
func TestRunABSpeculative(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mtp.gguf")
	if err := synth.WriteFile(context.Background(), path, synth.Options{Config: synth.Tiny(), Seed: 2, MTP: synth.MTPInclude}); err != nil {
		t.Fatal(err)
	}
	m, err := loader.Open(loader.Options{Path: path, Backend: "cpu", Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if !m.HasMTP() {
		t.Fatal("no MTP block")
	}
	prompt := bench.RandomTokens(40, m.Config.Vocab, 1)
	for _, rate := range []float64{1, 0.5} {
		acc, err := bench.NewAcceptance(rate, 7)
		if err != nil {
			t.Fatal(err)
		}
		var out, log bytes.Buffer
		logf := func(f string, a ...any) { fmt.Fprintf(&log, f+"\n", a...) }
		fail := func(err error) int { t.Errorf("runAB: %v", err); return 1 }
		code := runAB(context.Background(), abOptions{"DS4_CUDA_X": 1}, m.Backend, prompt, &out,
			abConfig{sets: "default;DS4_CUDA_X=0", frontier: 32, gen: 12, rounds: 1, settle: 2, ctxLen: 64, draft: true, accept: acc}, logf, fail)
		if code != 0 {
			t.Fatalf("rate %g: exit %d\n%s", rate, code, log.String())
		}
		if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); len(lines) != 3 {
			t.Fatalf("rate %g: CSV:\n%s", rate, out.String())
		}
		if !strings.Contains(log.String(), fmt.Sprintf("committed at the rate %g", rate)) {
			t.Errorf("rate %g: no speculation in the header:\n%s", rate, log.String())
		}
		var drafts, committed, checked int
		i := strings.Index(log.String(), "ab speculation over every run: ")
		if i < 0 {
			t.Fatalf("rate %g: no speculation summary:\n%s", rate, log.String())
		}
		if _, err := fmt.Sscanf(log.String()[i:], "ab speculation over every run: %d drafts, %d committed, %d only checked", &drafts, &committed, &checked); err != nil {
			t.Fatal(err)
		}
		// 4 runs (2 variants, an untimed round and a timed one) of 2 + 12 tokens
		switch {
		case drafts == 0:
			t.Errorf("rate %g: no drafts", rate)
		case rate == 1 && committed != drafts:
			t.Errorf("rate 1: %d of %d drafts committed", committed, drafts)
		case rate == 0.5 && (committed == 0 || committed == drafts):
			t.Errorf("rate 0.5: %d of %d drafts committed", committed, drafts)
		case committed%2 != 0 || drafts%2 != 0:
			// each variant's runs draw the same commits, and its tokens then
			// take the same passes: the totals are twice one variant's
			t.Errorf("rate %g: %d drafts, %d committed: odd, so the two variants differ", rate, drafts, committed)
		}
	}
}
