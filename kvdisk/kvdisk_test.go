package kvdisk

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// testLog collects log lines.
type testLog struct{ bytes.Buffer }

func newStore(t *testing.T, dir string, budget int64, lg *testLog, now func() time.Time) *Store {
	t.Helper()
	var h slog.Handler = slog.NewTextHandler(io.Discard, nil)
	if lg != nil {
		h = slog.NewTextHandler(lg, nil)
	}
	s, err := Open(Options{Dir: dir, BudgetBytes: budget, Logger: slog.New(h), Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func payloadOf(n int, seed byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*7) + seed
	}
	return p
}

func save(t *testing.T, s *Store, text string, tokens uint32, payload []byte, tools []ToolMapping) *Entry {
	t.Helper()
	e, err := s.Save(Header{Quant: 2, Reason: ReasonCold, Tokens: tokens, Context: 4096}, text, int64(len(payload)),
		func(w io.Writer) error { _, err := w.Write(payload); return err }, tools)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s := newStore(t, dir, 1<<20, nil, nil)
	text := "<｜begin▁of▁sentence｜>You are helpful.<｜User｜>hello"
	payload := payloadOf(1000, 1)
	tools := []ToolMapping{{ID: "call_1", DSML: "<dsml>x</dsml>"}, {ID: "toolu_2", DSML: ""}}
	e := save(t, s, text, 17, payload, tools)
	if e.Name != Name(text) || filepath.Base(e.Path) != Name(text)+".kv" {
		t.Fatalf("name %s path %s", e.Name, e.Path)
	}
	raw, _ := os.ReadFile(e.Path)
	if string(raw[:3]) != "KVC" || raw[3] != 1 || raw[4] != 2 || raw[5] != byte(ReasonCold) || raw[6] != FlagToolMap|FlagCRC {
		t.Fatalf("header bytes % x", raw[:8])
	}
	if !bytes.Contains(raw[:HeaderSize+4+len(text)], []byte(text)) {
		t.Fatal("text not stored verbatim after the header")
	}
	// Reopen: the index sees it; lookup by prefix; load verifies.
	s = newStore(t, dir, 1<<20, nil, nil)
	got := s.Lookup(text+"<｜Assistant｜>", nil)
	if len(got) != 1 || got[0].Header.Tokens != 17 {
		t.Fatalf("lookup: %+v", got)
	}
	if len(s.Lookup("<｜begin▁of▁sentence｜>You are", nil)) != 0 || len(s.Lookup("X"+text, nil)) != 0 {
		t.Fatal("lookup matched a non-prefix")
	}
	f, err := s.Load(got[0])
	if err != nil {
		t.Fatal(err)
	}
	if f.Text != text || !bytes.Equal(f.Payload, payload) || len(f.Tools) != 2 || f.Tools[0] != tools[0] || f.Tools[1] != tools[1] {
		t.Fatalf("loaded %q, %d payload bytes, tools %v", f.Text, len(f.Payload), f.Tools)
	}
	// Touch updates hits and last-used in place; the checksum still holds.
	now := time.Unix(2_000_000_000, 0)
	s.now = func() time.Time { return now }
	for i := 0; i < 3; i++ {
		if err := s.Touch(got[0]); err != nil {
			t.Fatal(err)
		}
	}
	raw, _ = os.ReadFile(e.Path)
	f, err = Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if f.Header.Hits != 3 || f.Header.LastUsed != uint64(now.Unix()) || f.Header.Created == f.Header.LastUsed {
		t.Fatalf("after touch: %+v", f.Header)
	}
	// Longest prefix first.
	save(t, s, text[:20], 5, payloadOf(10, 2), nil)
	got = s.Lookup(text+"!", nil)
	if len(got) != 2 || got[0].TextBytes != len(text) || got[1].TextBytes != 20 {
		t.Fatalf("order: %+v", got)
	}
	if got := s.Lookup(text+"!", func(e *Entry) bool { return e.Header.Tokens < 10 }); len(got) != 1 || got[0].TextBytes != 20 {
		t.Fatalf("accept filter: %+v", got)
	}
}

// corruptions of a valid file: every one must be detected by Parse and by
// the store (skipped, logged, removed), never loaded.
func TestCorruptFiles(t *testing.T) {
	dir := t.TempDir()
	s := newStore(t, dir, 1<<20, nil, nil)
	text := strings.Repeat("prompt text ", 20)
	e := save(t, s, text, 40, payloadOf(600, 3), []ToolMapping{{ID: "call_x", DSML: "block"}})
	good, _ := os.ReadFile(e.Path)
	if _, err := Parse(good); err != nil {
		t.Fatal(err)
	}
	variants := map[string][]byte{}
	for _, n := range []int{0, 1, 3, 20, 47, 48, 51, 52, 60, HeaderSize + 4 + len(text), len(good) - 600, len(good) - 10, len(good) - 1} {
		variants[fmt.Sprintf("truncated at %d", n)] = good[:n]
	}
	for _, off := range []int{0, 3, 4, 5, 8, 16, 24, 40, 48, 60, HeaderSize + 4 + len(text) + 5, len(good) - 3} {
		b := bytes.Clone(good)
		b[off] ^= 0x10
		variants[fmt.Sprintf("bit flipped at %d", off)] = b
	}
	wrongVer := bytes.Clone(good)
	wrongVer[3] = 2
	variants["version 2"] = wrongVer
	noCRC := bytes.Clone(good)
	noCRC[6] &^= FlagCRC
	variants["no checksum flag"] = noCRC
	variants["appended byte"] = append(bytes.Clone(good), 0)
	for name, b := range variants {
		if _, err := Parse(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: Parse err = %v", name, err)
		}
	}
	// Through the store: write each variant under the good name, reopen,
	// look up, load: never a file back, always a log line.
	for name, b := range variants {
		d := t.TempDir()
		path := filepath.Join(d, e.Name+".kv")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		var lg testLog
		st := newStore(t, d, 1<<20, &lg, nil)
		cands := st.Lookup(text+"more", nil)
		for _, c := range cands {
			if f, err := st.Load(c); err == nil {
				t.Errorf("%s: loaded %d tokens from a corrupt file", name, f.Header.Tokens)
			}
		}
		if len(cands) == 0 && len(st.Entries()) == 1 {
			// Indexed but never a match (e.g. its text length changed):
			// it is never loaded; it leaves by eviction.
			continue
		}
		if !strings.Contains(lg.String(), "level=WARN") {
			t.Errorf("%s: no log line: %s", name, lg.String())
		}
		_, statErr := os.Stat(path)
		if _, err := Parse(b); errors.Is(err, ErrVersion) {
			// Another format version may belong to another build: ignored,
			// not indexed, left on disk.
			if statErr != nil || len(st.Entries()) != 0 {
				t.Errorf("%s: file of another version removed (%v) or indexed (%d entries)", name, statErr, len(st.Entries()))
			}
			continue
		}
		if !errors.Is(statErr, os.ErrNotExist) {
			t.Errorf("%s: corrupt file still on disk", name)
		}
	}
}

func TestBudgetLRU(t *testing.T) {
	dir := t.TempDir()
	clock := time.Unix(1_700_000_000, 0)
	now := func() time.Time { return clock }
	payload := payloadOf(1000, 4)
	text := func(i int) string { return fmt.Sprintf("conversation %d ", i) + strings.Repeat("x", 50) }
	fileSize := int64(HeaderSize + 4 + len(text(0)) + len(payload))
	var lg testLog
	s := newStore(t, dir, 3*fileSize+fileSize/2, &lg, now) // room for three
	var es []*Entry
	for i := 0; i < 3; i++ {
		es = append(es, save(t, s, text(i), 100, payload, nil))
		clock = clock.Add(time.Minute)
	}
	// Use the oldest one: now conversation 1 is the least recently used.
	if err := s.Touch(*es[0]); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(time.Minute)
	save(t, s, text(3), 100, payload, nil)
	if s.Has(text(1)) || !s.Has(text(0)) || !s.Has(text(2)) || !s.Has(text(3)) {
		t.Fatalf("after the 4th save: %v", s.Entries())
	}
	if _, err := os.Stat(es[1].Path); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("evicted file still on disk")
	}
	if s.Usage() > s.Budget() || !strings.Contains(lg.String(), "evicted") {
		t.Fatalf("usage %d budget %d; log %s", s.Usage(), s.Budget(), lg.String())
	}
	// Same order survives a restart (last-used times are on disk).
	clock = clock.Add(time.Minute)
	s = newStore(t, dir, 3*fileSize+fileSize/2, nil, now)
	save(t, s, text(4), 100, payload, nil)
	if s.Has(text(2)) || !s.Has(text(0)) {
		t.Fatalf("after restart and a 5th save: %v", s.Entries())
	}
	// A file larger than the whole budget is not written.
	if e, err := s.Save(Header{Tokens: 1}, "big", 10*fileSize, func(w io.Writer) error { return nil }, nil); e != nil || err != nil {
		t.Fatalf("oversized save: %v %v", e, err)
	}
	// A smaller budget at open trims the directory.
	s = newStore(t, dir, fileSize+1, nil, now)
	if len(s.Entries()) != 1 || !s.Has(text(4)) {
		t.Fatalf("reopen with a smaller budget kept %v", s.Entries())
	}
}

// The crash test: a child process (this test binary, re-executed) writes
// checkpoints in a loop; it is killed with SIGKILL mid-way; the directory
// must then open cleanly, with no temporary leftovers and only valid files.
const crashEnv = "KVDISK_CRASH_WRITER_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashEnv); dir != "" {
		crashWriter(dir)
		return
	}
	os.Exit(m.Run())
}

func crashWriter(dir string) {
	s, err := Open(Options{Dir: dir, BudgetBytes: 64 << 20, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		os.Exit(2)
	}
	payload := payloadOf(4<<20, 5)
	for i := 0; ; i++ {
		text := fmt.Sprintf("crash test prompt %d", i%40)
		_, err := s.Save(Header{Quant: 4, Reason: ReasonContinued, Tokens: uint32(i + 1), Context: 1 << 20}, text, int64(len(payload)),
			func(w io.Writer) error {
				for off := 0; off < len(payload); off += 64 << 10 {
					if _, err := w.Write(payload[off : off+64<<10]); err != nil {
						return err
					}
				}
				return nil
			}, nil)
		if err != nil {
			os.Exit(3)
		}
		if i == 2 {
			os.WriteFile(filepath.Join(dir, "ready"), nil, 0o644)
		}
	}
}

func TestKillWhileWriting(t *testing.T) {
	if testing.Short() {
		t.Skip("forks a writer")
	}
	for round := 0; round < 3; round++ {
		dir := t.TempDir()
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashEnv+"="+dir)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			if _, err := os.Stat(filepath.Join(dir, "ready")); err == nil {
				break
			}
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				t.Fatal("writer never got ready")
			}
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(time.Duration(7*round+3) * time.Millisecond)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		err := cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
			t.Fatalf("writer was not killed: %v", err)
		}
		var lg testLog
		s := newStore(t, dir, 64<<20, &lg, nil)
		des, _ := os.ReadDir(dir)
		for _, de := range des {
			if strings.HasPrefix(de.Name(), tmpPrefix) {
				t.Errorf("temporary file %s left after open", de.Name())
			}
		}
		if len(s.Entries()) == 0 {
			t.Fatal("no complete file survived")
		}
		for _, e := range s.Entries() {
			f, err := s.Load(e)
			if err != nil {
				t.Errorf("a renamed file is invalid: %v", err)
				continue
			}
			if len(f.Payload) != 4<<20 {
				t.Errorf("payload %d bytes", len(f.Payload))
			}
		}
		t.Logf("round %d: %d files, log: %s", round, len(s.Entries()), strings.TrimSpace(lg.String()))
	}
}

func FuzzParse(f *testing.F) {
	dir := f.TempDir()
	s, err := Open(Options{Dir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		f.Fatal(err)
	}
	for i, tools := range [][]ToolMapping{nil, {{ID: "call_a", DSML: "<x>"}}} {
		text := fmt.Sprintf("seed %d", i)
		e, err := s.Save(Header{Tokens: 3}, text, 16, func(w io.Writer) error { _, err := w.Write(payloadOf(16, 0)); return err }, tools)
		if err != nil {
			f.Fatal(err)
		}
		b, _ := os.ReadFile(e.Path)
		f.Add(b)
	}
	f.Add([]byte("KVC\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		file, err := Parse(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if HeaderSize+4+len(file.Text)+len(file.Payload) > len(b) {
			t.Fatal("parsed sections exceed the input")
		}
	})
}
