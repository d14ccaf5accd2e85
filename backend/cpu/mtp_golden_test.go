package cpu_test

import (
	"context"
	"testing"

	"ds4go/backend/cpu"
	"ds4go/engine"
)

// forward runs blocks [from, to) on b, the chunk at pos (the engine's
// schedule of a chunk: engine.RunBlocks).
func forward(t *testing.T, be *cpu.Backend, b engine.Batch, st engine.State, from, to, pos int) {
	t.Helper()
	if err := engine.RunBlocks(context.Background(), be, b, st, from, to, pos, nil); err != nil {
		t.Fatal(err)
	}
}

// TestGoldenMTP: the MTP block's logits against the official MTPBlock's
// (testdata/golden/flash4_w128_k512/mtp.safetensors,
// scripts/reference/gen_mtp_golden.py): the row at position i reads the
// main model's output streams at i and the token at i+1. Variants: every
// position in one chunk, and the last 40 one position at a time after a
// chunk of the others.
func TestGoldenMTP(t *testing.T) {
	g := loadGolden(t, "flash4_w128_k512")
	if g.w.MTP == nil {
		t.Fatal("the converted case has no MTP block")
	}
	be := newBackend(t, g.w, cpu.Options{})
	if !be.HasMTP() {
		t.Fatal("backend without the MTP block")
	}
	mt := readGolden(t, g, "mtp.safetensors")
	toks := g.Tokens["long"]
	n, c := len(toks), &g.w.Config
	layout, err := engine.NewStateLayout(c, n, 0)
	if err != nil {
		t.Fatal(err)
	}
	mlayout := *layout
	mlayout.MTP = true
	st, err := be.NewState(layout)
	if err != nil {
		t.Fatal(err)
	}
	b, err := be.NewBatch(n)
	if err != nil {
		t.Fatal(err)
	}
	if err := be.Embed(b, 0, toks); err != nil {
		t.Fatal(err)
	}
	forward(t, be, b, st, 0, c.Layers, 0)

	run := func(variant string, chunks [][2]int) {
		t.Helper()
		pos, ref := goldenRows(t, mt, variant)
		want := map[int]bool{}
		for _, p := range pos {
			want[int(p)] = true
		}
		mst, err := be.NewState(&mlayout)
		if err != nil {
			t.Fatal(err)
		}
		mb, err := be.NewBatch(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := be.StageMTP(mb, b, 0, n-1); err != nil {
			t.Fatal(err)
		}
		got := map[int][]float32{}
		for _, ch := range chunks {
			p0, p1 := ch[0], ch[1]
			if err := be.MTPEmbed(mb, p0, toks[p0+1:p1+1]); err != nil {
				t.Fatal(err)
			}
			forward(t, be, mb, mst, c.Layers, c.Layers+1, p0)
			var rows []int
			for p := p0; p < p1; p++ {
				if want[p] {
					rows = append(rows, p-p0)
				}
			}
			if len(rows) == 0 {
				continue
			}
			out := make([]float32, len(rows)*c.Vocab)
			if err := be.MTPHead(mb, rows, out); err != nil {
				t.Fatal(err)
			}
			for i, r := range rows {
				got[p0+r] = out[i*c.Vocab : (i+1)*c.Vocab]
			}
		}
		rows := make([][]float32, len(pos))
		for i, p := range pos {
			if rows[i] = got[int(p)]; rows[i] == nil {
				t.Fatalf("%s: no row at %d", variant, p)
			}
		}
		checkAgreement(t, variant, pos, ref, rows)
	}
	run("mtp_prefill", [][2]int{{0, n - 1}})
	k := n - 1 - 40
	chunks := [][2]int{{0, k}}
	for p := k; p < n-1; p++ {
		chunks = append(chunks, [2]int{p, p + 1})
	}
	run("mtp_decode", chunks)
}
