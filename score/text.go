package score

import (
	"context"
	"fmt"
	"math"

	"ds4go/engine"
)

// TextPlan cuts a tokenized text into perplexity windows the way
// llama-perplexity does: Windows consecutive windows of Ctx tokens (a
// partial last window is dropped), the first token of each replaced by BOS;
// in each window the logits at offsets First … Ctx−2 (First = Ctx/2, so
// every scored token has at least half a window of context) predict the
// tokens at offsets First+1 … Ctx−1.
type TextPlan struct {
	Tokens  []int32 // the text's tokens, BOS first
	BOS     int32
	Ctx     int
	First   int
	Windows int
}

// MinCtx is the smallest window PlanText accepts.
const MinCtx = 4

// PlanText plans the windows over tokens (which should start with BOS); at
// most maxWindows windows when maxWindows > 0.
func PlanText(tokens []int32, bos int32, ctx, maxWindows int) (*TextPlan, error) {
	if ctx < MinCtx {
		return nil, inputErr("context window %d is below %d", ctx, MinCtx)
	}
	n := len(tokens) / ctx
	if n == 0 {
		return nil, inputErr("the text has %d tokens, fewer than one window of %d; use a longer text or a smaller --ctx", len(tokens), ctx)
	}
	if maxWindows > 0 {
		n = min(n, maxWindows)
	}
	return &TextPlan{Tokens: tokens, BOS: bos, Ctx: ctx, First: ctx / 2, Windows: n}, nil
}

// PerWindow returns the number of scored tokens per window.
func (p *TextPlan) PerWindow() int { return p.Ctx - 1 - p.First }

// Scored returns the number of scored tokens (= logit rows) in all.
func (p *TextPlan) Scored() int { return p.Windows * p.PerWindow() }

// Evaluated returns the number of tokens the windows run through the model.
func (p *TextPlan) Evaluated() int { return p.Windows * p.Ctx }

// Positions returns, for each scored row, the index in Tokens of the last
// token consumed (the row predicts the token after it).
func (p *TextPlan) Positions() []int32 {
	out := make([]int32, 0, p.Scored())
	for w := 0; w < p.Windows; w++ {
		for j := p.First; j < p.Ctx-1; j++ {
			out = append(out, int32(w*p.Ctx+j))
		}
	}
	return out
}

// window returns window w's tokens (a copy, BOS first).
func (p *TextPlan) window(w int) []int32 {
	win := append([]int32(nil), p.Tokens[w*p.Ctx:(w+1)*p.Ctx]...)
	win[0] = p.BOS
	return win
}

// TextRow is a scored row of a text run: the logits and the token they
// predict.
type TextRow struct {
	Row
	Next   int32 // the token that follows
	Window int
}

// RunText runs the plan's windows on a backend, each in a fresh session
// prefilled in chunks of opts.ChunkSize, and calls fn for every scored row
// in order. opts.Progress counts evaluated tokens.
func RunText(ctx context.Context, be engine.Backend, p *TextPlan, opts RunOptions, fn func(TextRow) error) error {
	vocab := be.Config().Vocab
	for i, t := range p.Tokens {
		if t < 0 || int(t) >= vocab {
			return inputErr("token %d (index %d) is outside the vocabulary [0, %d)", t, i, vocab)
		}
	}
	s, err := engine.NewSession(be, engine.Options{ChunkSize: opts.ChunkSize, MaxContext: p.Ctx})
	if err != nil {
		return fmt.Errorf("score: %w", err)
	}
	defer s.Close()
	row := 0
	for w := 0; w < p.Windows; w++ {
		s.Reset()
		win := p.window(w)
		var ferr error
		chunk := opts.ChunkSize
		if chunk <= 0 {
			chunk = engine.DefaultChunkSize
		}
		// Only the scored half needs the vocabulary projection.
		err := s.PrefillFrom(ctx, win, p.First, func(j int, logits []float32) {
			if ferr != nil {
				return
			}
			if opts.Progress != nil && ((j+1)%chunk == 0 || j == p.Ctx-1) {
				opts.Progress(w*p.Ctx+j+1, p.Evaluated())
			}
			if j < p.First || j >= p.Ctx-1 {
				return
			}
			ferr = fn(TextRow{Row: Row{Index: row, Pos: w*p.Ctx + j, Logits: logits}, Next: win[j+1], Window: w})
			row++
		})
		if ferr != nil {
			return ferr
		}
		if err != nil {
			return fmt.Errorf("score: window %d: %w", w, err)
		}
	}
	return nil
}

// NLL returns −log softmax(logits)[next] in float64 (scratch is reused
// when large enough).
func NLL(logits []float32, next int32, scratch []float64) (float64, []float64) {
	scratch = LogSoftmax(logits, scratch)
	return -scratch[next], scratch
}

// Perplexity accumulates per-token negative log-likelihoods.
type Perplexity struct {
	n         int
	sum, sum2 float64
}

// Add records one token's negative log-likelihood (nats).
func (p *Perplexity) Add(nll float64) {
	p.n++
	p.sum += nll
	p.sum2 += nll * nll
}

// Count returns the number of tokens recorded.
func (p *Perplexity) Count() int { return p.n }

// Result returns the perplexity exp(mean NLL) and its standard error as
// llama-perplexity estimates it: the standard error of the mean NLL,
// sqrt(var/(n−1)) with var = mean(NLL²) − mean(NLL)², times the perplexity
// (first-order propagation through exp). The error is NaN for fewer than
// two tokens; both are NaN for none.
func (p *Perplexity) Result() (ppl, stderr float64) {
	if p.n == 0 {
		return math.NaN(), math.NaN()
	}
	mean := p.sum / float64(p.n)
	ppl = math.Exp(mean)
	if p.n < 2 {
		return ppl, math.NaN()
	}
	v := max(p.sum2/float64(p.n)-mean*mean, 0)
	return ppl, math.Sqrt(v/float64(p.n-1)) * ppl
}
