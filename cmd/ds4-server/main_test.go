package main

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"ds4go/server"
	"ds4go/server/engineadapter"
	"ds4go/synth"
)

func TestFlagsCompatibleWithDS4(t *testing.T) {
	o, err := parseFlags([]string{"-m", "x.gguf", "--ctx", "100000", "-n", "500", "--host", "0.0.0.0", "--port", "9000",
		"--cors", "--kv-disk-dir", "/tmp/kv", "--kv-disk-space-mb", "8192", "--kv-cache-min-tokens", "600",
		"--kv-cache-cold-max-tokens", "20000", "--kv-cache-continued-interval-tokens", "5000", "--kv-cache-boundary-trim-tokens", "16",
		"--kv-cache-boundary-align-tokens", "1024", "--kv-cache-reject-different-quant",
		"--tool-memory-max-ids", "10", "--disable-exact-dsml-tool-replay", "--cpu", "--api-key", "k", "--fast", "--warmup", "64",
		"--mtp", "mtp.gguf", "--mtp-draft", "2", "--mtp-margin", "3"})
	if err != nil {
		t.Fatal(err)
	}
	if o.model != "x.gguf" || o.ctx != 100000 || o.tokens != 500 || o.host != "0.0.0.0" || o.port != 9000 || !o.cors ||
		o.kv != (server.KVCacheConfig{Dir: "/tmp/kv", SpaceMB: 8192, MinTokens: 600, ColdMaxTokens: 20000,
			ContinuedIntervalTokens: 5000, BoundaryTrimTokens: 16, BoundaryAlignTokens: 1024, RejectDifferentQuant: true}) || o.toolMaxIDs != 10 || !o.noExactDSML || o.backend != "cpu" || o.apiKey != "k" || !o.fast || o.warmup != 64 ||
		o.mtp != "mtp.gguf" || o.mtpDraft != 2 {
		t.Fatalf("%+v", o)
	}
	o, err = parseFlags(nil)
	if err != nil || o.host != "127.0.0.1" || o.port != 8000 || o.ctx != 32768 || o.tokens != server.DefaultMaxTokens || o.fake || o.fast || o.warmup != -1 ||
		o.kv != (server.KVCacheConfig{SpaceMB: 4096, MinTokens: 512, ColdMaxTokens: 30000, ContinuedIntervalTokens: 10000,
			BoundaryTrimTokens: 32, BoundaryAlignTokens: 2048}) {
		t.Fatalf("defaults: %+v %v", o, err)
	}
	for _, bad := range [][]string{{"--metal"}, {"--ctx", "1"}, {"--port", "70000"}, {"--nope"}, {"extra"},
		{"--kv-cache-min-tokens", "100", "--kv-cache-cold-max-tokens", "50"}, {"--kv-disk-space-mb", "-1"}, {"--mtp-draft", "0"}, {"--mtp-draft", "17"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Fatalf("%v accepted", bad)
		}
	}
}

func TestIsLoopback(t *testing.T) {
	for h, want := range map[string]bool{"127.0.0.1": true, "localhost": true, "::1": true, "0.0.0.0": false, "10.0.0.1": false} {
		if isLoopback(h) != want {
			t.Fatal(h)
		}
	}
}

// TestOpenEngineMTP: --mtp-draft 2 turns speculative decoding on for a
// model with an MTP block (here the model file's own) and is refused for
// one without.
func TestOpenEngineMTP(t *testing.T) {
	dir := t.TempDir()
	with, without := filepath.Join(dir, "with.gguf"), filepath.Join(dir, "without.gguf")
	c := synth.Tiny()
	if err := synth.WriteFile(context.Background(), with, synth.Options{Config: c, Seed: 2, MTP: synth.MTPInclude}); err != nil {
		t.Fatal(err)
	}
	if err := synth.WriteFile(context.Background(), without, synth.Options{Config: c, Seed: 2}); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	o, err := parseFlags([]string{"-m", with, "--mtp-draft", "2", "--cpu", "--ctx", "256"})
	if err != nil {
		t.Fatal(err)
	}
	eng, _, closeEng, err := openEngine(o, log)
	if err != nil {
		t.Fatal(err)
	}
	defer closeEng()
	if e, ok := eng.(*engineadapter.Engine); !ok || !e.Opts.Draft {
		t.Fatalf("speculative decoding not on: %T %+v", eng, eng)
	}
	o, _ = parseFlags([]string{"-m", without, "--mtp-draft", "2", "--cpu", "--ctx", "256"})
	if _, _, _, err := openEngine(o, log); err == nil || !strings.Contains(err.Error(), "needs an MTP block") {
		t.Fatalf("a model without an MTP block: %v", err)
	}
}
