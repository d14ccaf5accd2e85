package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"ds4go/gguf"
	"ds4go/model"
	"ds4go/quant"
	"ds4go/tokenizer"
)

func runValidate(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("validate", "validate FILE [--scan]", stderr)
	scan := fs.Bool("scan", false, "also read every tensor: check that all values are finite and print per-tensor statistics")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError(fs, "validate: want one FILE, got %d arguments", len(pos))
	}
	f, err := gguf.Open(pos[0])
	if err != nil {
		return err
	}
	defer f.Close()
	w, err := model.Load(f)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s\n", w)
	if _, ok := f.KV(model.KeyTokens); !ok {
		// Converted reference checkpoints carry no tokenizer: the model
		// runs on token ids, but the CLI and server cannot use it.
		fmt.Fprintf(stdout, "vocabulary: none (%s missing): usable on token ids only\n", model.KeyTokens)
	} else {
		v, err := model.VocabFromGGUF(f, w.Config.Vocab)
		if err != nil {
			return fmt.Errorf("vocabulary: %w", err)
		}
		if _, err := tokenizer.New(v); err != nil {
			return fmt.Errorf("vocabulary: %w", err)
		}
		fmt.Fprintf(stdout, "vocabulary: %d tokens, %d merges, BOS %d, EOS %d\n", len(v.Tokens), len(v.Merges), v.BOS, v.EOS)
	}
	if d := w.Config.DiffFromFlash(); len(d) > 0 {
		fmt.Fprintf(stdout, "hyperparameters: %d differ from Flash (see inspect)\n", len(d))
	}
	if *scan {
		if err := scanTensors(f, w, stdout); err != nil {
			return err
		}
	}
	fmt.Fprintln(stdout, "OK")
	return nil
}

// tensorStats accumulates the values of one tensor.
type tensorStats struct {
	mu             sync.Mutex
	n, nonFinite   uint64
	sum, sumSq     float64
	amax           float64
	minInt, maxInt int64 // I32 tensors
}

// scanTensors reads every tensor in parallel, checks its values and prints
// per-tensor statistics; it fails if any value is NaN or infinite or a token
// map names a non-existent expert.
func scanTensors(f *gguf.File, w *model.Weights, out io.Writer) error {
	start := time.Now()
	type chunk struct {
		t          *gguf.TensorInfo
		st         *tensorStats
		first, end uint64 // rows
	}
	stats := make([]tensorStats, len(f.Tensors))
	var chunks []chunk
	for i := range f.Tensors {
		t := &f.Tensors[i]
		stats[i].minInt, stats[i].maxInt = math.MaxInt64, math.MinInt64
		rows := t.Elements() / t.Dims[0]
		rowBytes := t.Size / rows
		per := max(1, (8<<20)/rowBytes)
		for r := uint64(0); r < rows; r += per {
			chunks = append(chunks, chunk{t, &stats[i], r, min(rows, r+per)})
		}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf []float32
			for {
				i := int(next.Add(1) - 1)
				if i >= len(chunks) {
					return
				}
				c := &chunks[i]
				t := c.t
				rowLen := t.Dims[0]
				rowBytes := t.Size / (t.Elements() / rowLen)
				data := f.TensorData(t)[c.first*rowBytes : c.end*rowBytes]
				var n, bad uint64
				var s, ss, amax float64
				lo, hi := int64(math.MaxInt64), int64(math.MinInt64)
				if t.Type == quant.I32 {
					for k := 0; k+4 <= len(data); k += 4 {
						x := int64(int32(binary.LittleEndian.Uint32(data[k:])))
						lo, hi = min(lo, x), max(hi, x)
					}
				} else {
					vals := (c.end - c.first) * rowLen
					if uint64(cap(buf)) < vals {
						buf = make([]float32, vals)
					}
					x := buf[:vals]
					if err := quant.Dequantize(t.Type, data, x); err != nil {
						e := fmt.Errorf("%s: %w", t.Name, err)
						failed.CompareAndSwap(nil, &e)
						return
					}
					for _, v := range x {
						fv := float64(v)
						if math.IsNaN(fv) || math.IsInf(fv, 0) {
							bad++
							continue
						}
						n++
						s += fv
						ss += fv * fv
						amax = max(amax, math.Abs(fv))
					}
				}
				st := c.st
				st.mu.Lock()
				st.n += n
				st.nonFinite += bad
				st.sum += s
				st.sumSq += ss
				st.amax = max(st.amax, amax)
				st.minInt, st.maxInt = min(st.minInt, lo), max(st.maxInt, hi)
				st.mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if e := failed.Load(); e != nil {
		return *e
	}
	var total uint64
	var problems []string
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "name \ttype \tmean\tstd\tmax |x|\tnon-finite\t\n")
	for i := range f.Tensors {
		t, st := &f.Tensors[i], &stats[i]
		total += t.Size
		if t.Type == quant.I32 {
			fmt.Fprintf(tw, "%s \t%s \tints %d..%d\t\t\t\t\n", t.Name, t.Type, st.minInt, st.maxInt)
			if st.minInt < 0 || st.maxInt >= int64(w.Config.Experts) {
				problems = append(problems, fmt.Sprintf("%s: expert ids %d..%d outside 0..%d", t.Name, st.minInt, st.maxInt, w.Config.Experts-1))
			}
			continue
		}
		mean, std := 0.0, 0.0
		if st.n > 0 {
			mean = st.sum / float64(st.n)
			std = math.Sqrt(max(0, st.sumSq/float64(st.n)-mean*mean))
		}
		fmt.Fprintf(tw, "%s \t%s \t%.4g\t%.4g\t%.4g\t%d\t\n", t.Name, t.Type, mean, std, st.amax, st.nonFinite)
		if st.nonFinite > 0 {
			problems = append(problems, fmt.Sprintf("%s: %d non-finite values", t.Name, st.nonFinite))
		}
	}
	tw.Flush()
	el := time.Since(start)
	fmt.Fprintf(out, "scanned %d tensors, %s in %.1fs (%.2f GB/s)\n", len(f.Tensors), human(total), el.Seconds(), float64(total)/el.Seconds()/1e9)
	if len(problems) > 0 {
		return fmt.Errorf("tensor data: %d problem(s):\n  %s", len(problems), strings.Join(problems, "\n  "))
	}
	return nil
}
