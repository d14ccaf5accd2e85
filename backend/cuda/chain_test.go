package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"ds4go/quant"
)

// chainMatrix returns the GGUF bytes of a random Q8_0 matrix whose products
// keep a row's magnitude (block scales ≈ 1/(74·√cols): the quants' spread
// times √cols terms), so that a chain of them neither overflows nor
// vanishes.
func chainMatrix(rows, cols int, seed uint64) []byte {
	const bb = 34
	nb := rows * cols / 32
	out := make([]byte, nb*bb)
	const chunk = 1 << 15
	parallel((nb+chunk-1)/chunk, func(lo, hi int) {
		for c := lo; c < hi; c++ {
			r := rand.New(rand.NewPCG(seed, uint64(c)))
			for b := c * chunk; b < min((c+1)*chunk, nb); b++ {
				blk := out[b*bb : (b+1)*bb]
				d := (0.5 + r.Float64()) / (74 * math.Sqrt(float64(cols)))
				binary.LittleEndian.PutUint16(blk, quant.F32ToF16(float32(d)))
				for i := 2; i < bb; i += 8 {
					binary.LittleEndian.PutUint64(blk[i:], r.Uint64())
				}
			}
		}
	})
	return out
}

// chainOps uploads a chain of random Q8_0 matrices of the given shapes
// (shape i's cols = shape i−1's rows) with their outputs, op 0's activation
// quantized from a Gaussian row; y and yq of every op are allocated twice
// (ops and a second set, ref, for the products launched one by one).
func chainOps(t testing.TB, d *Device, shapes [][2]int, seed uint64) (ops, ref []ChainOp) {
	t.Helper()
	act := quantizeOnDevice(t, d, quant.Q8_0, gaussian(shapes[0][1], seed), shapes[0][1], 1)
	ops, ref = make([]ChainOp, len(shapes)), make([]ChainOp, len(shapes))
	for i, sh := range shapes {
		rows, cols := sh[0], sh[1]
		w := uploadWeight(t, d, quant.Q8_0, rows, cols, 1, chainMatrix(rows, cols, seed+uint64(i)+1))
		qb := d.ActBytes(quant.Q8_0, rows)
		for _, o := range []*ChainOp{&ops[i], &ref[i]} {
			*o = ChainOp{W: w.Ptr, Y: alloc(t, d, 4*int64(rows)), YQ: alloc(t, d, qb), Rows: int64(rows), Cols: int64(cols)}
		}
		if i == 0 {
			ops[i].Act, ref[i].Act = act, act
		} else {
			ops[i].Act, ref[i].Act = ops[i-1].YQ, ref[i-1].YQ
		}
	}
	return ops, ref
}

// chainRef runs ref's products one by one (MatMulQ8Out, fast mode).
func chainRef(d *Device, ref []ChainOp, s Stream) error {
	for _, o := range ref {
		w := &Weight{Type: quant.Q8_0, Rows: int(o.Rows), Cols: int(o.Cols), Mats: 1, Ptr: o.W}
		if err := d.MatMulQ8Out(s, w, 1, o.Act, 0, 0, 1, 1, o.Y, o.YQ, false); err != nil {
			return err
		}
	}
	return nil
}

// TestChainQ8 checks ChainQ8 (the persistent chain of dependent Q8_0
// products) against the same products launched one by one: every op's y
// and its Q8_0 activation bit for bit, with the weights' producer running
// ahead of the activations or waiting for them, with few and many stages,
// ops whose blocks are fewer than the CTAs and ops of several blocks a CTA,
// every column count it takes, and a second launch (the counters zeroed
// again). Bad chains fail with an error.
func TestChainQ8(t *testing.T) {
	d := gpu(t)
	pipeEverywhere(t, d)
	shapes := [][2]int{{4096, 1024}, {8192, 4096}, {2048, 8192}, {1024, 2048}, {8192, 1024}, {4096, 8192}}
	ops, ref := chainOps(t, d, shapes, 7100)
	must(t, chainRef(d, ref, 0))
	cnt := alloc(t, d, d.ChainCountBytes(ops))
	for _, c := range []struct {
		stages int
		flags  ChainFlags
	}{{6, 0}, {2, ChainILP}, {3, ChainSerial | ChainWide}, {4, ChainWide | ChainILP | ChainSleep}, {6, ChainSegDep}, {3, ChainSegDep | ChainWide | ChainILP}, {6, ChainWide | ChainILP | ChainStep(3)}, {3, ChainILP | ChainFence(1)}, {6, ChainWide | ChainILP | ChainFence(2) | ChainStep(2)}, {2, ChainSegDep | ChainFence(2)}, {8, ChainWide | ChainILP | ChainTile(2)}, {5, ChainILP | ChainTile(1) | ChainSegDep}, {4, ChainWide | ChainILP | ChainIdle}, {6, ChainWide | ChainILP | ChainFence(3)}, {2, ChainILP | ChainFence(3) | ChainTile(1)}, {6, ChainWide | ChainILP | ChainHold}, {6, 0}} {
		for _, o := range ops {
			poison(t, d, o.Y, int(o.Rows))
			must(t, d.MemsetAsync(o.YQ, 0x5a, d.ActBytes(quant.Q8_0, int(o.Rows)), 0))
		}
		must(t, d.ChainQ8(ops, cnt, c.stages, c.flags, 0))
		for i, o := range ops {
			n := int(o.Rows)
			got, want := download(t, d, o.Y, n), download(t, d, ref[i].Y, n)
			if k, ok := firstBitDiff(got, want); !ok {
				t.Fatalf("stages %d flags %d: op %d (%d x %d): y[%d] = %v, MatMulQ8Out's %v", c.stages, c.flags, i, o.Rows, o.Cols, k, got[k], want[k])
			}
			gq, wq := make([]byte, n+n/32*4), make([]byte, n+n/32*4)
			must(t, d.Download(gq, o.YQ))
			must(t, d.Download(wq, ref[i].YQ))
			for j := range gq {
				if gq[j] != wq[j] {
					t.Fatalf("stages %d flags %d: op %d: activation byte %d = %#x, MatMulQ8Out's %#x", c.stages, c.flags, i, j, gq[j], wq[j])
				}
			}
		}
		var counts [6]uint32
		must(t, DownloadSlice(d, counts[:], cnt))
		for i, o := range ops {
			if c.flags&ChainFence(3) == ChainFence(3) {
				break // (no counters)
			}
			if counts[i] != uint32(o.Rows/32) {
				t.Errorf("stages %d: op %d's counter %d, want its %d blocks", c.stages, i, counts[i], o.Rows/32)
			}
		}
	}
	bad := append([]ChainOp(nil), ops[:2]...)
	bad[1].Cols = 2048
	if err := d.ChainQ8(bad, cnt, 6, 0, 0); err == nil {
		t.Errorf("op 1 taking 2048 values of op 0's 4096: no error")
	}
	bad = append([]ChainOp(nil), ops[:1]...)
	bad[0].Rows = 48
	if err := d.ChainQ8(bad, cnt, 6, 0, 0); err == nil {
		t.Errorf("48 rows: no error")
	}
	if err := d.ChainQ8(ops[:1], cnt, 9, 0, 0); err == nil {
		t.Errorf("9 stages: no error")
	}
}

// TestChainQ8Timing (DS4_CUDA_BENCH_CHAIN=1; 16 distinct 35.7 MB matrices,
// ≈ 570 MB) times a chain of wo_a- and wo_b-shaped products (8192 × 4096,
// 4096 × 8192, alternating) launched one by one from a CUDA graph
// (MatMulQ8Out: the pipelined kernel, PDL) against ChainQ8's forms (the
// weights streamed ahead of the activations; held until a CTA has
// published; the producer waiting for each op, a kernel boundary without
// the launch; without dependencies or arithmetic), where a CTA's time goes
// (ChainProbe), latency-bound steps between the products, and a plain read
// of the same bytes: the figures of cuda/NOTES.md v44. It logs; it asserts
// no time.
func TestChainQ8Timing(t *testing.T) {
	if os.Getenv("DS4_CUDA_BENCH_CHAIN") == "" {
		t.Skip("DS4_CUDA_BENCH_CHAIN not set")
	}
	d := gpu(t)
	n := 16
	shapes := make([][2]int, n)
	for i := range shapes {
		shapes[i] = [2]int{8192, 4096}
		if i%2 == 1 {
			shapes[i] = [2]int{4096, 8192}
		}
	}
	ops, ref := chainOps(t, d, shapes, 7200)
	cnt := alloc(t, d, d.ChainCountBytes(ops))
	opBytes := float64(d.WeightBytes(quant.Q8_0, 8192, 4096))
	g := newGraphTimer(t, d)
	report := func(name string, us float64) {
		t.Logf("%-34s %8.1f µs a chain of %d, %6.2f µs an op, %5.2f TB/s", name, us, n, us/float64(n), opBytes*float64(n)/us/1e6)
	}
	report("MatMulQ8Out one by one (graph)", g.time(1, func(int) error { return chainRef(d, ref, g.s) }))
	// NOTES v44's table: the forms against the stages in flight a CTA
	// (stages × 34 KB; 17 KB stages the last row)
	for _, c := range []struct{ stages, shift int }{{6, 0}, {3, 0}, {2, 0}, {4, 1}} {
		for _, f := range []ChainFlags{ChainWide | ChainILP, ChainWide | ChainILP | ChainSegDep | ChainSleep,
			ChainWide | ChainILP | ChainHold, ChainWide | ChainILP | ChainSerial, ChainWide | ChainILP | ChainNoWait,
			ChainNoMath | ChainNoWait} {
			name := fmt.Sprintf("ChainQ8 %2d stages of %5.1f KB, flags %d", c.stages, float64(int(32768)>>c.shift)*17/16/1024, f)
			report(name, g.time(1, func(int) error { return d.ChainQ8(ops, cnt, c.stages, f|ChainTile(c.shift), g.s) }))
		}
	}
	// where a CTA's time goes (clock64 sums: µs at 1.98 GHz a CTA and op),
	// and the L2 latency of a dependent load meanwhile (CTA 0 and the others)
	for _, c := range []struct {
		stages int
		f      ChainFlags
	}{{6, ChainWide | ChainILP}, {3, ChainWide | ChainILP}, {2, ChainWide | ChainILP}, {6, ChainWide | ChainILP | ChainHold},
		{3, ChainWide | ChainILP | ChainHold}, {6, ChainWide | ChainILP | ChainIdle}, {6, ChainWide | ChainILP | ChainStep(6)}} {
		must(t, d.ChainQ8(ops, cnt, c.stages, c.f|ChainProbe, 0))
		sms := d.Info().SMs
		words := make([]uint64, d.ChainCountBytes(ops)/8)
		must(t, d.Synchronize())
		must(t, DownloadSlice(d, words, cnt))
		pr := words[(10*n+1)/2:]
		var sum [8]float64
		for b := 0; b < sms; b++ {
			for k := range sum {
				sum[k] += float64(pr[8*b+k])
			}
		}
		u := 1 / (1980 * float64(sms) * float64(n))
		lat0 := float64(pr[6]) / max(1, float64(pr[7]))
		latN := (sum[6] - float64(pr[6])) / max(1, sum[7]-float64(pr[7]))
		t.Logf("stages %d flags %5d, µs a CTA and op: warp 0's stage waits %.2f, input waits %.2f, items %.2f, partials-buffer waits %.2f; producer's free-stage waits %.2f; finisher's fences %.2f; L2 load %.0f cycles (CTA 0) / %.0f (the others)",
			c.stages, c.f, sum[0]*u, sum[1]*u, sum[2]*u, sum[4]*u, sum[3]*u, sum[5]*u, lat0, latN)
	}
	// a latency-bound step of 3, 6 or 10 µs between two products, with the
	// weights streamed during it or (serial) only after it
	for _, us := range []int{3, 6, 10} {
		for _, st := range []int{6, 3} {
			a := g.time(1, func(int) error { return d.ChainQ8(ops, cnt, st, ChainWide|ChainILP|ChainStep(us), g.s) })
			b := g.time(1, func(int) error {
				return d.ChainQ8(ops, cnt, st, ChainWide|ChainILP|ChainSerial|ChainStep(us), g.s)
			})
			h := g.time(1, func(int) error { return d.ChainQ8(ops, cnt, st, ChainWide|ChainILP|ChainHold|ChainStep(us), g.s) })
			// the step on an SM that streams nothing (CTA 0 without blocks)
			i := g.time(1, func(int) error { return d.ChainQ8(ops, cnt, st, ChainWide|ChainILP|ChainIdle|ChainStep(us), g.s) })
			hi := g.time(1, func(int) error {
				return d.ChainQ8(ops, cnt, st, ChainWide|ChainILP|ChainHold|ChainIdle|ChainStep(us), g.s)
			})
			t.Logf("steps of %2d µs, stages %d: %6.2f µs an op and step streamed across, %6.2f serial (%5.2f hidden of a step), %6.2f held to each CTA's publish; the step's SM streaming nothing: %6.2f, %6.2f held",
				us, st, a/float64(n), b/float64(n), (b-a)/float64(n-1), h/float64(n), i/float64(n), hi/float64(n))
		}
	}
	// the same bytes read once (one launch over a buffer of the chain's size)
	buf := tempAlloc(t, d, int64(opBytes)*int64(n))
	defer d.Free(buf)
	out := alloc(t, d, 16*int64(d.Info().SMs))
	report("BenchRead of the same bytes", g.time(1, func(int) error { return d.BenchRead(buf, int64(opBytes)*int64(n)/16*16, out, g.s) }))
	// per-op chains of growing length: the fixed cost of the persistent launch
	for _, k := range []int{1, 2, 4, 8} {
		us := g.time(1, func(int) error { return d.ChainQ8(ops[:k], cnt, 3, ChainWide|ChainILP, g.s) })
		ub := g.time(1, func(int) error { return chainRef(d, ref[:k], g.s) })
		t.Logf("%2d ops: ChainQ8 %7.1f µs, one by one %7.1f µs", k, us, ub)
	}
}
