package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"ds4go/kvdisk"
)

// childEnv makes the test binary run ds4-server with the flags it holds
// (the crash test forks the real server this way).
const childEnv = "DS4_SERVER_TEST_CHILD_ARGS"

func TestMain(m *testing.M) {
	if args := os.Getenv(childEnv); args != "" {
		o, err := parseFlags(strings.Fields(args))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		if err := run(o); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestKillNineWhileCaching SIGKILLs a forked ds4-server (fake engine, disk
// cache on) while it serves requests that write checkpoints, then checks
// that the cache directory opens cleanly (no temporary leftovers, every
// file valid) and that a restarted server serves from it.
func TestKillNineWhileCaching(t *testing.T) {
	if testing.Short() {
		t.Skip("forks the server")
	}
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	var logs lockedBuf
	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+fmt.Sprintf(
			"--fake --ctx 200000 --port %d --kv-disk-dir %s --kv-cache-min-tokens 16 --kv-cache-boundary-align-tokens 16", port, dir))
		cmd.Stderr = &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			if resp, err := http.Get(base + "/health"); err == nil {
				resp.Body.Close()
				return cmd
			}
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				t.Fatalf("server did not start: %s", logs.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	body := func(i int) []byte {
		b, _ := json.Marshal(map[string]any{"model": "deepseek-chat", "max_tokens": 4,
			"messages": []any{map[string]any{"role": "user", "content": fmt.Sprintf("conversation %d: ", i) + strings.Repeat("words to cache ", 3000)}}})
		return b
	}
	post := func(i int) (map[string]any, error) {
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(body(i)))
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil || resp.StatusCode != 200 {
			return nil, fmt.Errorf("%d %s", resp.StatusCode, b)
		}
		return m, nil
	}

	child := start()
	if _, err := post(0); err != nil { // one complete request: its cold checkpoint is on disk
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 1; ; i++ {
			if _, err := post(i); err != nil {
				return // the server died
			}
		}
	}()
	time.Sleep(300 * time.Millisecond)
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	child.Wait()
	<-done

	tmps := 0
	if des, err := os.ReadDir(dir); err == nil {
		for _, de := range des {
			if strings.HasPrefix(de.Name(), ".tmp-") {
				tmps++
			}
		}
	}
	st, err := kvdisk.Open(kvdisk.Options{Dir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	des, _ := os.ReadDir(dir)
	for _, de := range des {
		if strings.HasPrefix(de.Name(), ".tmp-") {
			t.Errorf("temporary file %s left after open", de.Name())
		}
	}
	entries := st.Entries()
	if len(entries) < 2 {
		t.Fatalf("%d checkpoints after the kill", len(entries))
	}
	for _, e := range entries {
		if _, err := st.Load(e); err != nil {
			t.Errorf("invalid checkpoint after kill -9: %v", err)
		}
	}

	// A restarted server resumes conversation 0 from its checkpoint.
	child = start()
	defer func() { child.Process.Signal(syscall.SIGTERM); child.Wait() }()
	m, err := post(0)
	if err != nil {
		t.Fatal(err)
	}
	usage := m["usage"].(map[string]any)
	cached := usage["prompt_tokens_details"].(map[string]any)["cached_tokens"].(float64)
	if cached < usage["prompt_tokens"].(float64)-32-16 {
		t.Fatalf("after restart: usage %v; log:\n%s", usage, logs.String())
	}
	t.Logf("%d checkpoints survived, %d interrupted writes removed; restarted server reused %v of %v prompt tokens", len(entries), tmps, cached, usage["prompt_tokens"])
}
