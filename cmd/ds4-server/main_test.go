package main

import (
	"testing"

	"ds4go/server"
)

func TestFlagsCompatibleWithDS4(t *testing.T) {
	o, err := parseFlags([]string{"-m", "x.gguf", "--ctx", "100000", "-n", "500", "--host", "0.0.0.0", "--port", "9000",
		"--cors", "--kv-disk-dir", "/tmp/kv", "--kv-disk-space-mb", "8192", "--kv-cache-min-tokens", "512",
		"--tool-memory-max-ids", "10", "--disable-exact-dsml-tool-replay", "--cpu", "--api-key", "k"})
	if err != nil {
		t.Fatal(err)
	}
	if o.model != "x.gguf" || o.ctx != 100000 || o.tokens != 500 || o.host != "0.0.0.0" || o.port != 9000 || !o.cors ||
		o.kvDiskDir != "/tmp/kv" || o.toolMaxIDs != 10 || !o.noExactDSML || o.backend != "cpu" || o.apiKey != "k" {
		t.Fatalf("%+v", o)
	}
	o, err = parseFlags(nil)
	if err != nil || o.host != "127.0.0.1" || o.port != 8000 || o.ctx != 32768 || o.tokens != server.DefaultMaxTokens || o.fake {
		t.Fatalf("defaults: %+v %v", o, err)
	}
	for _, bad := range [][]string{{"--metal"}, {"--ctx", "1"}, {"--port", "70000"}, {"--nope"}, {"extra"}} {
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
