package cli

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"

	"ds4go/chat"
	"ds4go/engine"
	"ds4go/loader"
	"ds4go/score"
)

// MaxLogprobsTopK bounds --logprobs-top-k (as ds4.c).
const MaxLogprobsTopK = 128

// promptTokens returns the tokens a one-shot prompt is run as: a text that
// already starts with BOS is taken as a rendered chat and tokenized as it
// is (protocol specials recognised); any other text becomes the user turn
// of a one-message chat rendered with the system prompt and the thinking
// mode of the flags (ds4.c's rule).
func promptTokens(m *loader.Model, o *Options) ([]int32, error) {
	if strings.HasPrefix(o.Prompt, chat.BOS) {
		return m.Tokenizer.EncodeWithSpecial(o.Prompt), nil
	}
	var msgs []chat.Message
	if o.System != "" {
		msgs = append(msgs, chat.Message{Role: chat.RoleSystem, Content: o.System})
	}
	msgs = append(msgs, chat.Message{Role: chat.RoleUser, Content: o.Prompt})
	text, err := chat.Render(chat.Conversation{Messages: msgs}, chat.Options{Mode: o.Mode(), ContextSize: m.ContextSize(o.Ctx)})
	if err != nil {
		return nil, fmt.Errorf("rendering the prompt: %w", err)
	}
	return m.Tokenizer.EncodeWithSpecial(text), nil
}

// dumpTokens prints the prompt's token ids and pieces: by default the
// prompt as the model would see it (promptTokens); with --raw the text alone
// (protocol specials still recognised, no BOS, no template). Lines are
// "id<TAB>quoted piece"; --json prints {"ids": [...], "pieces": [...]}
// where a piece that is not valid UTF-8 is written as hex ("0x…") and its
// index listed in "hex_pieces".
func dumpTokens(w io.Writer, m *loader.Model, o *Options) error {
	var ids []int32
	if o.Raw {
		ids = m.Tokenizer.EncodeWithSpecial(o.Prompt)
	} else {
		var err error
		if ids, err = promptTokens(m, o); err != nil {
			return err
		}
	}
	pieces := make([][]byte, len(ids))
	for i, id := range ids {
		b, err := m.Tokenizer.TokenBytes(id)
		if err != nil {
			return fmt.Errorf("token %d: %w", id, err)
		}
		pieces[i] = b
	}
	bw := bufio.NewWriter(w)
	if o.JSON {
		out := struct {
			IDs       []int32  `json:"ids"`
			Pieces    []string `json:"pieces"`
			HexPieces []int    `json:"hex_pieces"`
		}{IDs: ids, Pieces: make([]string, len(ids)), HexPieces: []int{}}
		if out.IDs == nil {
			out.IDs = []int32{}
		}
		for i, b := range pieces {
			if utf8.Valid(b) {
				out.Pieces[i] = string(b)
			} else {
				out.Pieces[i] = "0x" + hex.EncodeToString(b)
				out.HexPieces = append(out.HexPieces, i)
			}
		}
		enc := json.NewEncoder(bw)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(out); err != nil {
			return err
		}
		return bw.Flush()
	}
	for i, id := range ids {
		fmt.Fprintf(bw, "%d\t%q\n", id, pieces[i])
	}
	fmt.Fprintf(bw, "%d tokens\n", len(ids))
	return bw.Flush()
}

// logprobToken is a token in the --dump-logprobs file: its id, its text
// (lossy where the bytes are not UTF-8) and its exact bytes.
type logprobToken struct {
	ID    int32  `json:"id"`
	Text  string `json:"text"`
	Bytes []int  `json:"bytes"`
}

type logprobAlt struct {
	Token   logprobToken `json:"token"`
	Logit   float32      `json:"logit"`
	Logprob float64      `json:"logprob"`
}

type logprobStep struct {
	Step        int          `json:"step"`
	Selected    logprobToken `json:"selected"`
	TopLogprobs []logprobAlt `json:"top_logprobs"`
}

type logprobDump struct {
	Source       string        `json:"source"`
	Model        string        `json:"model"`
	PromptTokens int           `json:"prompt_tokens"`
	Ctx          int           `json:"ctx"`
	TopK         int           `json:"top_k"`
	Steps        []logprobStep `json:"steps"`
}

// topLogprobs returns the k most likely tokens of logits (ties: lower id
// first) with their log-probabilities (score.LogSoftmax, float64).
func topLogprobs(logits []float32, k int, scratch *[]float64) (ids []int32, lps []float64) {
	*scratch = score.LogSoftmax(logits, *scratch)
	ids = engine.TopK(logits, k)
	lps = make([]float64, len(ids))
	for i, id := range ids {
		lps[i] = (*scratch)[id]
	}
	return ids, lps
}

// dumpLogprobs runs the prompt, then a greedy continuation of up to -n
// tokens (ending at EOS, which is recorded), writing every step's chosen
// token and top-k alternatives to o.DumpLogprobs (written to a temporary
// file, then renamed). It returns the number of steps.
func dumpLogprobs(ctx context.Context, m *loader.Model, o *Options) (int, error) {
	toks, err := promptTokens(m, o)
	if err != nil {
		return 0, err
	}
	ctxSize := m.ContextSize(o.Ctx)
	if len(toks) >= ctxSize {
		return 0, fmt.Errorf("prompt of %d tokens does not fit a context of %d", len(toks), ctxSize)
	}
	s, err := engine.NewSession(m.Backend, engine.Options{MaxContext: ctxSize})
	if err != nil {
		return 0, err
	}
	defer s.Close()
	if err := s.Prefill(ctx, toks); err != nil {
		return 0, fmt.Errorf("prompt processing: %w", err)
	}
	tokOf := func(id int32) logprobToken {
		b, _ := m.Tokenizer.TokenBytes(id)
		t := logprobToken{ID: id, Text: string(b), Bytes: make([]int, len(b))}
		for i, c := range b {
			t.Bytes[i] = int(c)
		}
		return t
	}
	d := logprobDump{Source: "ds4go", Model: m.Name, PromptTokens: len(toks), Ctx: ctxSize, TopK: o.LogprobsTopK, Steps: []logprobStep{}}
	eos := m.Tokenizer.EOS()
	if id, ok := m.Tokenizer.Lookup(chat.EOS); ok {
		eos = id
	}
	maxSteps := min(o.MaxTokens, ctxSize-1-len(toks))
	var scratch []float64
	for step := 0; step < maxSteps; step++ {
		logits := s.Logits()
		if logits == nil {
			return 0, fmt.Errorf("step %d: no logits", step)
		}
		ids, lps := topLogprobs(logits, o.LogprobsTopK, &scratch)
		if len(ids) == 0 {
			return 0, fmt.Errorf("step %d: no finite logits", step)
		}
		st := logprobStep{Step: step, Selected: tokOf(ids[0])}
		for i, id := range ids {
			st.TopLogprobs = append(st.TopLogprobs, logprobAlt{Token: tokOf(id), Logit: logits[id], Logprob: lps[i]})
		}
		d.Steps = append(d.Steps, st)
		if ids[0] == eos {
			break
		}
		if err := s.Decode(ctx, ids[0]); err != nil {
			return 0, fmt.Errorf("decode at step %d: %w", step, err)
		}
	}
	return len(d.Steps), writeFileAtomic(o.DumpLogprobs, func(w io.Writer) error {
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", " ")
		return enc.Encode(d)
	})
}

// writeFileAtomic writes path through a temporary file in the same
// directory, renamed into place once complete.
func writeFileAtomic(path string, fill func(io.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	bw := bufio.NewWriter(f)
	err = fill(bw)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// inspect prints a summary of the loaded model (--inspect).
func inspect(w io.Writer, m *loader.Model) {
	c := &m.Config
	fmt.Fprintf(w, "model: %s\n", m.Name)
	fmt.Fprintf(w, "file: %d bytes, %d tensors, mapped in %v, validated in %v\n",
		m.File.Size(), len(m.File.Tensors), m.MapTime.Round(time.Microsecond), m.LoadTime.Round(time.Microsecond))
	fmt.Fprintf(w, "weights: %s\n", m.Weights)
	fmt.Fprintf(w, "attention: window %d, compress ratios %v, indexer %d heads × %d, top-%d\n",
		c.Window, c.CompressRatios[:c.Layers], c.IndexerHeads, c.IndexerHeadDim, c.IndexerTopK)
	fmt.Fprintf(w, "context: %d tokens (model), vocabulary %d tokens (BOS %d, EOS %d)\n",
		c.ContextLen, m.Tokenizer.VocabSize(), m.Tokenizer.BOS(), m.Tokenizer.EOS())
	if d := c.DiffFromFlash(); len(d) == 0 {
		fmt.Fprintln(w, "hyperparameters: DeepSeek V4 Flash")
	} else {
		fmt.Fprintf(w, "hyperparameters: DeepSeek V4 family, differs from Flash in %s\n", strings.Join(d, ", "))
	}
}
