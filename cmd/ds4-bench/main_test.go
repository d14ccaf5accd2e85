package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"ds4go/bench"
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

func TestBadArgs(t *testing.T) {
	var stdout, stderr bytes.Buffer
	for _, args := range [][]string{
		{"--frontiers", "64,32"},
		{"--frontiers", "32,x"},
		{"--frontiers", "64", "--ctx", "40"},
		{"--backend", "tpu", "--frontiers", "16"},
	} {
		if code := run(args, &stdout, &stderr); code == 0 {
			t.Errorf("%v: exit 0", args)
		}
	}
}
