package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"ds4go/engine"
	"ds4go/gguf"
	"ds4go/internal/golden"
	"ds4go/loader"
	"ds4go/model"
	"ds4go/score"
	"ds4go/synth"
	"ds4go/tokenizer"
)

// ds4score runs the command and returns its exit status, stdout and stderr.
func ds4score(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb, false)
	return code, out.String(), errb.String()
}

// jsonReport runs the command with --json and decodes the report.
func jsonReport(t *testing.T, wantCode int, args ...string) report {
	t.Helper()
	code, out, errs := ds4score(t, append(args, "--json")...)
	if code != wantCode {
		t.Fatalf("ds4-score %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, wantCode, out, errs)
	}
	var r report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("report: %v\n%s", err, out)
	}
	return r
}

func writeSeq(t *testing.T, tokens []int32, prefill int) string {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"tokens": tokens, "prefill": prefill})
	path := filepath.Join(t.TempDir(), "seq.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// writeRef writes a logits file from rows in memory.
func writeRef(t *testing.T, positions []int32, rows [][]float32) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ref.safetensors")
	w, err := score.CreateLogits(path, len(rows[0]), positions, map[string]string{"source": t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if err := w.WriteRow(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// goldenCase is a golden checkpoint converted to an F32 GGUF (with a
// vocabulary), with its token runs and reference logits.
type goldenCase struct {
	*golden.Case
	gguf   string
	logits golden.Tensors
}

var (
	goldenMu    sync.Mutex
	goldenCache = map[string]*goldenCase{}
	goldenTmp   string
)

func TestMain(m *testing.M) {
	d, err := os.MkdirTemp("", "ds4-score-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goldenTmp = d
	code := m.Run()
	os.RemoveAll(d)
	os.Exit(code)
}

func loadGolden(t *testing.T, name string) *goldenCase {
	t.Helper()
	goldenMu.Lock()
	defer goldenMu.Unlock()
	if g := goldenCache[name]; g != nil {
		return g
	}
	c, err := golden.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	g := &goldenCase{Case: c, gguf: filepath.Join(goldenTmp, name+".gguf")}
	if err := c.Convert(context.Background(), g.gguf); err != nil {
		t.Fatal(err)
	}
	if g.logits, err = c.Read("logits.safetensors"); err != nil {
		t.Fatal(err)
	}
	goldenCache[name] = g
	return g
}

// ref writes the golden variant key's rows (optionally only its rows at
// positions ≥ from) as a ds4-score reference file.
func (g *goldenCase) ref(t *testing.T, key string, from int32) (string, int) {
	t.Helper()
	allPos, allRows, err := g.logits.Rows(key)
	if err != nil {
		t.Fatal(err)
	}
	var pos []int32
	var rows [][]float32
	for i, p := range allPos {
		if p >= from {
			pos = append(pos, p)
			rows = append(rows, allRows[i])
		}
	}
	return writeRef(t, pos, rows), len(rows)
}

// TestGoldenThroughScore runs the golden cases of the forward pass
// (official model.py logits, testdata/golden) through ds4-score --ref with
// the bounds of forward-reference-notes.md §4.
func TestGoldenThroughScore(t *testing.T) {
	bounds := []string{"--max-p50", "2e-5", "--max-kl", "1e-7", "--min-top1", "0.99"}
	cases := []struct {
		golden, run, variant string
		prefill, chunk       int
		from                 int32 // reference rows from this position
	}{
		// A prefill of 13 tokens, then 24 decode steps.
		{"flash6_w16_k8", "short", "prefill_13_then_decode", 13, 0, 0},
		// Token by token from the first token.
		{"flash6_w16_k8", "short", "decode_from_0", 1, 0, 0},
		// 448 tokens: a chunked prefill of 100, then decode steps through
		// three ratio-128 rows, against the reference's one-shot prefill.
		{"flash6_w16_k8", "long", "prefill", 100, 7, 99},
		// The real top-k 512 over 2112 tokens: one prefill, its last row.
		{"flash4_w128_k512", "long", "prefill", 2112, 0, 2111},
	}
	for _, c := range cases {
		name := fmt.Sprintf("%s/%s/P=%d", c.golden, c.variant, c.prefill)
		t.Run(name, func(t *testing.T) {
			g := loadGolden(t, c.golden)
			ref, n := g.ref(t, c.run+"."+c.variant, c.from)
			seq := writeSeq(t, g.Tokens[c.run], c.prefill)
			args := append([]string{"-m", g.gguf, "--tokens", seq, "--ref", ref, "--prefill-chunk", fmt.Sprint(c.chunk)}, bounds...)
			r := jsonReport(t, exitOK, args...)
			s := r.Compare
			t.Logf("%d rows: rel err p50 %.3g p95 %.3g max %.3g (pos %d), KL mean %.3g max %.3g, top-1 %.4f",
				s.Rows, s.RelErrP50, s.RelErrP95, s.RelErrMax, s.RelErrMaxPos, s.KLMean, s.KLMax, s.Top1)
			if s.Rows != n || r.Rows != n {
				t.Errorf("compared %d rows, reference has %d", s.Rows, n)
			}
			if s.RelErrP95 > 1e-3 {
				t.Errorf("p95 relative error %.3g > 1e-3", s.RelErrP95)
			}
		})
	}
}

// quantConfig is synth.Tiny widened so that every row length is a multiple
// of 256, as the q2 and q4 block formats need.
func quantConfig() model.Config {
	c := synth.Tiny()
	c.Embed, c.ExpertFF, c.QLoraRank, c.OLoraRank = 256, 256, 256, 256
	return c
}

var (
	quantOnce  sync.Once
	quantFiles map[string]string
	quantErr   error
)

// quantModels writes a synthetic f32 model and its q2 and q4
// requantizations (the same float weights, quantized).
func quantModels(t *testing.T) map[string]string {
	t.Helper()
	quantOnce.Do(func() {
		data, err := synth.Build(synth.Options{Config: quantConfig(), Scheme: model.SchemeF32, Seed: 11})
		if err != nil {
			quantErr = err
			return
		}
		f, err := gguf.Parse(data)
		if err != nil {
			quantErr = err
			return
		}
		quantFiles = map[string]string{"f32": filepath.Join(goldenTmp, "synth-f32.gguf")}
		if quantErr = os.WriteFile(quantFiles["f32"], data, 0o644); quantErr != nil {
			return
		}
		for _, sc := range []model.Scheme{model.SchemeQ2, model.SchemeQ4} {
			q, err := synth.Requantize(f, sc)
			if err != nil {
				quantErr = err
				return
			}
			quantFiles[sc.Name] = filepath.Join(goldenTmp, "synth-"+sc.Name+".gguf")
			if quantErr = os.WriteFile(quantFiles[sc.Name], q, 0o644); quantErr != nil {
				return
			}
		}
	})
	if quantErr != nil {
		t.Fatal(quantErr)
	}
	return quantFiles
}

// randomTokens returns n token ids below vocab from a fixed LCG.
func randomTokens(n, vocab int, seed uint64) []int32 {
	out := make([]int32, n)
	for i := range out {
		seed = seed*6364136223846793005 + 1442695040888963407
		out[i] = int32((seed >> 33) % uint64(vocab))
	}
	return out
}

// TestQuantizedAgainstF32 scores q2 and q4 requantizations of a synthetic
// f32 model against it: the metrics must see the quantization (non-zero
// KL, top-1 below 1, relative errors far above f32 rounding), q2 more than
// q4, and a --min-top1 1 bound must fail with exit status 3.
func TestQuantizedAgainstF32(t *testing.T) {
	files := quantModels(t)
	seq := writeSeq(t, randomTokens(64, quantConfig().Vocab, 5), 16)
	ref := filepath.Join(t.TempDir(), "f32.safetensors")
	r := jsonReport(t, exitOK, "-m", files["f32"], "--tokens", seq, "--logits-out", ref)
	if r.Rows != 49 {
		t.Fatalf("rows %d, want 49", r.Rows)
	}
	// The f32 model against itself, with another prefill chunking: exact.
	self := jsonReport(t, exitOK, "-m", files["f32"], "--tokens", seq, "--ref", ref, "--prefill-chunk", "5", "--max-p50", "1e-30", "--min-top1", "1")
	if s := self.Compare; s.RelErrMax != 0 || s.KLMax != 0 || s.Top1 != 1 {
		t.Errorf("f32 against itself: %+v", s)
	}
	got := map[string]*score.Summary{}
	for _, q := range []string{"q2", "q4"} {
		r := jsonReport(t, exitOK, "-m", files[q], "--tokens", seq, "--ref", ref)
		s := r.Compare
		got[q] = s
		t.Logf("%s vs f32: %d rows, rel err p50 %.3g p95 %.3g max %.3g, KL mean %.3g max %.3g, top-1 %.4f",
			q, s.Rows, s.RelErrP50, s.RelErrP95, s.RelErrMax, s.KLMean, s.KLMax, s.Top1)
		if s.Rows != 49 || !(s.KLMean > 0) || !(s.RelErrP50 > 1e-4) {
			t.Errorf("%s: the metrics do not see the quantization: %+v", q, s)
		}
	}
	if !(got["q2"].Top1 < 1) {
		t.Errorf("q2 top-1 agreement %v, want < 1", got["q2"].Top1)
	}
	if !(got["q2"].KLMean > got["q4"].KLMean) {
		t.Errorf("q2 mean KL %.3g not above q4's %.3g", got["q2"].KLMean, got["q4"].KLMean)
	}
	code, _, errs := ds4score(t, "-m", files["q2"], "--tokens", seq, "--ref", ref, "--min-top1", "1")
	if code != exitBounds || !strings.Contains(errs, "top-1 agreement") {
		t.Errorf("q2 with --min-top1 1: exit %d, stderr %q", code, errs)
	}
}

// TestBadInput checks that bad sequences, references and options give a
// clear error and exit status 1 or 2, never a panic.
func TestBadInput(t *testing.T) {
	files := quantModels(t)
	vocab := quantConfig().Vocab
	dir := t.TempDir()
	good := writeSeq(t, randomTokens(8, vocab, 1), 3)
	ref := filepath.Join(dir, "good.safetensors")
	if code, _, errs := ds4score(t, "-m", files["f32"], "--tokens", good, "--logits-out", ref); code != exitOK {
		t.Fatalf("good run: %d %s", code, errs)
	}
	raw := func(s string) string {
		p := filepath.Join(t.TempDir(), "seq.json")
		os.WriteFile(p, []byte(s), 0o644)
		return p
	}
	row := make([]float32, vocab)
	nanRow := make([]float32, vocab)
	nanRow[7] = float32(math.NaN())
	pos := []int32{2, 3, 4, 5, 6, 7}
	rows := func(n int, last []float32) [][]float32 {
		out := make([][]float32, n)
		for i := range out {
			out[i] = row
		}
		out[n-1] = last
		return out
	}
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"token outside the vocabulary", []string{"--tokens", writeSeq(t, []int32{1, int32(vocab)}, 1)}, exitError, "outside the vocabulary"},
		{"negative token", []string{"--tokens", writeSeq(t, []int32{-3}, 1)}, exitError, "outside the vocabulary"},
		{"prefill 0", []string{"--tokens", writeSeq(t, []int32{1, 2}, 0)}, exitError, "prefill 0 is outside [1, 2]"},
		{"prefill past the end", []string{"--tokens", writeSeq(t, []int32{1, 2}, 3)}, exitError, "prefill 3 is outside [1, 2]"},
		{"not JSON", []string{"--tokens", raw("tokens: 1 2 3")}, exitError, "sequence JSON"},
		{"missing file", []string{"--tokens", filepath.Join(dir, "none.json")}, exitError, "no such file"},
		{"reference of another vocabulary", []string{"--tokens", good, "--ref", writeRef(t, pos, [][]float32{{1}, {1}, {1}, {1}, {1}, {1}})}, exitError, "vocabulary of 1 logits, the model has 1024"},
		{"reference with fewer rows", []string{"--tokens", good, "--ref", writeRef(t, pos[:5], rows(5, row))}, exitError, "5 rows, this run produces 6"},
		{"reference with more rows", []string{"--tokens", writeSeq(t, randomTokens(8, vocab, 1), 2), "--ref", ref}, exitError, "6 rows, this run produces 7"},
		{"reference at other positions", []string{"--tokens", good, "--ref", writeRef(t, []int32{1, 2, 3, 4, 5, 6}, rows(6, row))}, exitError, "row 0 is at position 1, this run's row 0 is at 2"},
		{"reference with NaN", []string{"--tokens", good, "--ref", writeRef(t, pos, rows(6, nanRow))}, exitError, "NaN at index 7"},
		{"reference not safetensors", []string{"--tokens", good, "--ref", good}, exitError, "safetensors"},
		{"bounds without a reference", []string{"--tokens", good, "--max-kl", "1"}, exitUsage, "need --ref"},
		{"no input", []string{}, exitUsage, "exactly one of"},
		{"both inputs", []string{"--tokens", good, "--text", good}, exitUsage, "exactly one of"},
		{"bad top-1 bound", []string{"--tokens", good, "--ref", ref, "--min-top1", "2"}, exitUsage, "min-top1"},
		{"unknown backend", []string{"--tokens", good, "--backend", "tpu"}, exitError, "unknown backend"},
		{"text shorter than a window", []string{"--text", raw("hello"), "--ctx", "64"}, exitError, "fewer than one window"},
		{"window too small", []string{"--text", raw("hello world, hello world"), "--ctx", "2"}, exitError, "below"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out, errs := ds4score(t, append([]string{"-m", files["f32"]}, c.args...)...)
			if code != c.code || !strings.Contains(errs, c.want) {
				t.Errorf("exit %d (want %d), stderr %q (want it to mention %q), stdout %q", code, c.code, errs, c.want, out)
			}
		})
	}
}

// TestText scores a text: perplexity, its logits saved and compared, and
// the perplexity recomputed from the saved rows and the tokenized text.
func TestText(t *testing.T) {
	files := quantModels(t)
	text := filepath.Join(t.TempDir(), "text.txt")
	b, err := os.ReadFile("../../docs/engine.md")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(text, b[:2000], 0o644); err != nil {
		t.Fatal(err)
	}
	saved := filepath.Join(t.TempDir(), "text.safetensors")
	r := jsonReport(t, exitOK, "-m", files["f32"], "--text", text, "--ctx", "64", "--chunks", "3", "--save-logits", saved)
	p := r.Perplexity
	t.Logf("%d tokens, %d windows: ppl %.4f ± %.4f over %d tokens, %.1f tokens/s", r.Tokens, r.Windows, p.PPL, p.StdErr, p.Scored, r.TokensPerS)
	if r.Windows != 3 || p.Scored != 3*31 || r.Rows != p.Scored || !(p.PPL > 1) || !(p.StdErr > 0) {
		t.Fatalf("report %+v, perplexity %+v", r, p)
	}

	// Recompute from the file: BOS + the text's tokens; row i at position
	// pos predicts token pos+1.
	f, err := gguf.Open(files["f32"])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, err := model.VocabFromGGUF(f, quantConfig().Vocab)
	if err != nil {
		t.Fatal(err)
	}
	tk, err := tokenizer.New(v)
	if err != nil {
		t.Fatal(err)
	}
	toks := append([]int32{tk.BOS()}, tk.Encode(string(b[:2000]))...)
	lf, err := score.OpenLogits(saved)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	var pp score.Perplexity
	var row []float32
	for i, pos := range lf.Positions {
		if row, err = lf.Row(i, row); err != nil {
			t.Fatal(err)
		}
		nll, _ := score.NLL(row, toks[pos+1], nil)
		pp.Add(nll)
	}
	if ppl, e := pp.Result(); math.Abs(ppl-p.PPL) > 1e-9*ppl || math.Abs(e-p.StdErr) > 1e-9*e {
		t.Errorf("recomputed perplexity %v ± %v, reported %v ± %v", ppl, e, p.PPL, p.StdErr)
	}

	// One row of the second window, computed directly: a session prefilled
	// with that window's tokens (BOS first) up to the row's position.
	m, err := loader.Open(loader.Options{Path: files["f32"], Backend: loader.BackendCPU})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	const ctxLen, first = 64, 32
	i := 31 + 5 // row 5 of window 1 (31 rows per window)
	pos := int(lf.Positions[i])
	if pos != ctxLen+first+5 {
		t.Fatalf("row %d at position %d", i, pos)
	}
	win := append([]int32{tk.BOS()}, toks[ctxLen+1:pos+1]...)
	sess, err := engine.NewSession(m.Backend, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if err := sess.Prefill(context.Background(), win); err != nil {
		t.Fatal(err)
	}
	if row, err = lf.Row(i, row); err != nil {
		t.Fatal(err)
	}
	if e := score.RowError(sess.Logits(), row); e != 0 {
		t.Errorf("saved row %d differs from a direct prefill of its window by %g", i, e)
	}

	// The same text on the q4 model against the saved f32 logits.
	q := jsonReport(t, exitOK, "-m", files["q4"], "--text", text, "--ctx", "64", "--chunks", "3", "--ref", saved, "--prefill-chunk", "16")
	t.Logf("q4: ppl %.4f; vs f32: KL mean %.3g, top-1 %.4f", q.Perplexity.PPL, q.Compare.KLMean, q.Compare.Top1)
	if q.Compare.Rows != r.Rows || !(q.Compare.KLMean > 0) || q.Perplexity.PPL == p.PPL {
		t.Errorf("q4 against f32: %+v", q.Compare)
	}
}

// TestInterruptAndDumpFormat: a cancelled run (Ctrl+C) exits with status 1
// and leaves no output file; a `ds4 --dump-tokens --json` style file
// ({"ids": [...], "pieces": [...]}) scores with --prefill.
func TestInterruptAndDumpFormat(t *testing.T) {
	files := quantModels(t)
	dir := t.TempDir()
	seq := writeSeq(t, randomTokens(16, quantConfig().Vocab, 3), 4)
	out := filepath.Join(dir, "out.safetensors")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"-m", files["f32"], "--tokens", seq, "--logits-out", out}, &stdout, &stderr, false)
	if code != exitError || !strings.Contains(stderr.String(), "interrupted") {
		t.Errorf("cancelled run: exit %d, stderr %q", code, stderr.String())
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left behind: %v", ents)
	}

	ref := filepath.Join(dir, "ref.safetensors")
	jsonReport(t, exitOK, "-m", files["f32"], "--tokens", seq, "--logits-out", ref)
	ids, _ := json.Marshal(map[string]any{"ids": randomTokens(16, quantConfig().Vocab, 3), "pieces": []string{"x"}})
	dump := filepath.Join(dir, "dump.json")
	os.WriteFile(dump, ids, 0o644)
	r := jsonReport(t, exitOK, "-m", files["f32"], "--tokens", dump, "--prefill", "4", "--ref", ref, "--min-top1", "1")
	if r.Prefill != 4 || r.Compare.Rows != 13 || r.Compare.RelErrMax != 0 {
		t.Errorf("dump format: %+v %+v", r, r.Compare)
	}
}
