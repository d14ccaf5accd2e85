package dsml

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// officialCase is one entry of testdata/official_parse.json, written by
// scripts/chat/gen_parse_testdata.py from the official decoder's output.
type officialCase struct {
	Name       string `json:"name"`
	Thinking   bool   `json:"thinking"`
	Completion string `json:"completion"`
	Content    string `json:"content"`
	Reasoning  string `json:"reasoning"`
	ToolCalls  []struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"tool_calls"`
}

func TestOfficialParse(t *testing.T) {
	data, err := os.ReadFile("testdata/official_parse.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []officialCase
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases) < 10 {
		t.Fatalf("only %d cases", len(cases))
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			r := Parse(c.Completion, Options{Thinking: c.Thinking})
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			if r.Text != c.Content {
				t.Errorf("text %q, official %q", r.Text, c.Content)
			}
			if r.Reasoning != c.Reasoning {
				t.Errorf("reasoning %q, official %q", r.Reasoning, c.Reasoning)
			}
			if len(r.ToolCalls) != len(c.ToolCalls) {
				t.Fatalf("%d calls, official %d", len(r.ToolCalls), len(c.ToolCalls))
			}
			for i, tc := range r.ToolCalls {
				if tc.Name != c.ToolCalls[i].Name || tc.Arguments != c.ToolCalls[i].Arguments {
					t.Errorf("call %d: %s %s, official %s %s", i, tc.Name, tc.Arguments, c.ToolCalls[i].Name, c.ToolCalls[i].Arguments)
				}
				if !json.Valid([]byte(tc.Arguments)) {
					t.Errorf("call %d: arguments are not JSON: %s", i, tc.Arguments)
				}
				if !strings.HasPrefix(tc.Raw, "<｜DSML｜invoke") || !strings.HasSuffix(tc.Raw, "</｜DSML｜invoke>") || !strings.Contains(c.Completion, tc.Raw) {
					t.Errorf("call %d: raw %q", i, tc.Raw)
				}
			}
			if len(c.ToolCalls) > 0 {
				if !strings.HasPrefix(r.ToolBlock, "\n\n<｜DSML｜tool_calls>") || !strings.HasSuffix(r.ToolBlock, "</｜DSML｜tool_calls>") {
					t.Errorf("tool block %q", r.ToolBlock)
				}
				if c.Content+r.ToolBlock+"<｜end▁of▁sentence｜>" != c.Completion[len(c.Completion)-len(c.Content+r.ToolBlock)-len("<｜end▁of▁sentence｜>"):] {
					t.Errorf("content + block does not rebuild the completion")
				}
			}
			// Every split must give the same result.
			checkSplits(t, c.Completion, Options{Thinking: c.Thinking})
		})
	}
}

// summary is the split-independent outcome of a parse: the result plus the
// concatenation of each event stream.
type summary struct {
	R         Result
	Text      string
	Reasoning string
	Args      map[int]string
	Begins    []string
	Ends      int
	Errors    []string
	ErrIdx    []int
}

func summarize(events []Event, r Result) summary {
	s := summary{R: r, Args: map[int]string{}}
	for _, e := range events {
		switch e.Kind {
		case EventText:
			s.Text += e.Text
		case EventReasoning:
			s.Reasoning += e.Text
		case EventToolCallArgs:
			s.Args[e.Index] += e.Text
		case EventToolCallBegin:
			s.Begins = append(s.Begins, e.Name)
		case EventToolCallEnd:
			s.Ends++
		case EventError:
			s.Errors = append(s.Errors, e.Err.Error())
			s.ErrIdx = append(s.ErrIdx, e.Index)
		}
	}
	return s
}

// parseSplit feeds s cut at the given offsets.
func parseSplit(s string, cuts []int, opts Options) summary {
	p := NewParser(opts)
	var events []Event
	prev := 0
	for _, c := range cuts {
		events = append(events, p.Feed(s[prev:c])...)
		prev = c
	}
	events = append(events, p.Feed(s[prev:])...)
	events = append(events, p.Finish()...)
	return summarize(events, p.Result())
}

// checkSplits compares the one-piece parse with byte-by-byte and random
// splits, and checks the invariants that hold for every parse.
func checkSplits(t *testing.T, s string, opts Options) summary {
	t.Helper()
	whole := parseSplit(s, nil, opts)
	checkInvariants(t, s, whole)
	bytewise := make([]int, 0, len(s))
	for i := 1; i < len(s); i++ {
		bytewise = append(bytewise, i)
	}
	if got := parseSplit(s, bytewise, opts); !reflect.DeepEqual(got, whole) {
		t.Fatalf("byte-by-byte parse differs:\n got %+v\nwant %+v", got, whole)
	}
	rng := rand.New(rand.NewPCG(uint64(len(s)), 7))
	for range 5 {
		var cuts []int
		for i := 1; i < len(s); i++ {
			if rng.IntN(6) == 0 {
				cuts = append(cuts, i)
			}
		}
		if got := parseSplit(s, cuts, opts); !reflect.DeepEqual(got, whole) {
			t.Fatalf("split parse %v differs:\n got %+v\nwant %+v", cuts, got, whole)
		}
	}
	return whole
}

func checkInvariants(t *testing.T, in string, s summary) {
	t.Helper()
	if s.Text != s.R.Text || s.Reasoning != s.R.Reasoning {
		t.Fatalf("events and result disagree: %q/%q vs %q/%q", s.Text, s.Reasoning, s.R.Text, s.R.Reasoning)
	}
	if !utf8.ValidString(s.R.Text) || !utf8.ValidString(s.R.Reasoning) {
		t.Fatalf("invalid UTF-8 in output for %q", in)
	}
	abandoned := map[int]bool{}
	for _, i := range s.ErrIdx {
		abandoned[i] = true
	}
	if s.Ends != len(s.R.ToolCalls) {
		t.Fatalf("%d end events, %d calls", s.Ends, len(s.R.ToolCalls))
	}
	for _, tc := range s.R.ToolCalls {
		if abandoned[tc.Index] {
			t.Fatalf("call %d both completed and abandoned", tc.Index)
		}
		if s.Args[tc.Index] != tc.Arguments {
			t.Fatalf("call %d: streamed args %q, final %q", tc.Index, s.Args[tc.Index], tc.Arguments)
		}
		if !json.Valid([]byte(tc.Arguments)) || !utf8.ValidString(tc.Arguments) {
			t.Fatalf("call %d: arguments not valid JSON: %q (input %q)", tc.Index, tc.Arguments, in)
		}
		var obj map[string]any
		if err := json.Unmarshal([]byte(tc.Arguments), &obj); err != nil {
			t.Fatalf("call %d: arguments not an object: %v", tc.Index, err)
		}
		if !strings.Contains(in, tc.Raw) {
			t.Fatalf("call %d: raw %q not in input", tc.Index, tc.Raw)
		}
	}
	if (len(s.Errors) > 0) != (s.R.Err != nil) {
		t.Fatalf("error events %v but Result.Err %v", s.Errors, s.R.Err)
	}
}

const (
	blk  = "<｜DSML｜tool_calls>"
	blkE = "</｜DSML｜tool_calls>"
	inv  = "<｜DSML｜invoke"
	invE = "</｜DSML｜invoke>"
	par  = "<｜DSML｜parameter"
	parE = "</｜DSML｜parameter>"
)

func TestParseForms(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		opts      Options
		text      string
		reasoning string
		calls     []string // name + " " + arguments
		err       bool
		truncated bool
	}{
		{name: "plain", in: "Hello, world.\n", text: "Hello, world.\n"},
		{name: "think", in: "plan</think>answer", opts: Options{Thinking: true}, text: "answer", reasoning: "plan"},
		{name: "think tags in text", in: "<think>a</think>b", text: "b", reasoning: "a"},
		{name: "dsml inside think is reasoning",
			in: "x " + blk + "\n" + inv + ` name="f">` + invE + blkE + "</think>ok", opts: Options{Thinking: true},
			text: "ok", reasoning: "x " + blk + "\n" + inv + ` name="f">` + invE + blkE},
		{name: "after think dsml runs",
			in:   "r</think>\n\n" + blk + "\n" + inv + ` name="f">` + "\n" + par + ` name="a" string="true">1` + parE + "\n" + invE + "\n" + blkE,
			opts: Options{Thinking: true}, reasoning: "r", calls: []string{`f {"a": "1"}`}},
		{name: "short form",
			in:    "t\n\n<DSML｜tool_calls>\n<DSML｜invoke name=\"f\">\n<DSML｜parameter name=\"n\" string=\"false\">3</DSML｜parameter>\n</DSML｜invoke>\n</DSML｜tool_calls>",
			text:  "t",
			calls: []string{`f {"n": 3}`}},
		{name: "nested untyped parameters",
			in: blk + inv + ` name="f">` + par + ` name="opt">` + "\n" + par + ` name="a" string="true">x` + parE + par + ` name="b" string="false">[1]` + parE + "\n" + parE +
				par + ` name="z" string="true">` + parE + invE + blkE,
			calls: []string{`f {"opt": {"a": "x", "b": [1]}, "z": ""}`}},
		{name: "nested closed by invoke end",
			in:    blk + inv + ` name="f">` + par + ` name="o">` + par + ` name="a" string="true">1` + parE + invE + blkE,
			calls: []string{`f {"o": {"a": "1"}}`}},
		{name: "untyped is a string",
			in:    blk + inv + ` name="f">` + par + ` name="s">  hi <b>` + parE + par + ` name="e">` + parE + invE + blkE,
			calls: []string{`f {"s": "  hi <b>", "e": ""}`}},
		{name: "orphan end marker dropped", in: "a" + blkE + "b", text: "ab"},
		{name: "text after block", in: "a\n\n" + blk + inv + ` name="f">` + invE + blkE + "\nb", text: "a\nb", calls: []string{`f {}`}},
		{name: "two blocks", in: blk + inv + ` name="f">` + invE + blkE + blk + inv + ` name="g">` + invE + blkE, calls: []string{`f {}`, `g {}`}},
		{name: "string escapes",
			in:    blk + inv + ` name="f">` + par + ` name="c" string="true">"q" \ ` + "\t\n\x01é😀" + parE + invE + blkE,
			calls: []string{`f {"c": "\"q\" \\ \t\n\u0001é😀"}`}},
		{name: "json coerced",
			in:    blk + inv + ` name="f">` + par + ` name="n" string="false"> not json ` + parE + invE + blkE,
			calls: []string{`f {"n": "not json"}`}},
		{name: "json value with marker-like string",
			in:    blk + inv + ` name="f">` + par + ` name="o" string="false">{"k": "</think>"}` + parE + invE + blkE,
			calls: []string{`f {"o": {"k": "</think>"}}`}},
		{name: "entities kept by default",
			in:    blk + inv + ` name="f">` + par + ` name="c" string="true">a &amp;&lt; b` + parE + invE + blkE,
			calls: []string{`f {"c": "a &amp;&lt; b"}`}},
		{name: "entities decoded on request", opts: Options{DecodeEntities: true},
			in:    blk + inv + ` name="f&amp;g">` + par + ` name="c" string="true">a &amp;&lt;/｜DSML｜parameter> &bogus; &quot;` + parE + invE + blkE,
			calls: []string{`f&g {"c": "a &</｜DSML｜parameter> &bogus; \""}`}},
		{name: "tools disabled", opts: Options{DisableToolCalls: true}, in: "a " + blk + "b", text: "a " + blk + "b"},
		{name: "eos ends output", in: "done<｜end▁of▁sentence｜>ignored", text: "done"},
		{name: "eos in reasoning", in: "r<｜end▁of▁sentence｜>x", opts: Options{Thinking: true}, reasoning: "r"},
		{name: "partial marker at end is text", in: "a <｜DSML｜tool_ca", text: "a <｜DSML｜tool_ca"},
		{name: "garbage between calls", in: "pre\n\n" + blk + "\nhello", text: "pre\n\n" + blk + "\nhello", err: true},
		{name: "missing name", in: blk + inv + `>` + invE + blkE, text: blk + inv + `>` + invE, err: true},
		{name: "bad string attr", in: blk + inv + ` name="f">` + par + ` name="a" string="maybe">x` + parE + invE + blkE,
			text: blk + inv + ` name="f">` + par + ` name="a" string="maybe">x` + parE + invE, err: true},
		{name: "duplicate parameter", in: blk + inv + ` name="f">` + par + ` name="a" string="true">1` + parE + par + ` name="a" string="true">2` + parE + invE + blkE,
			text: blk + inv + ` name="f">` + par + ` name="a" string="true">1` + parE + par + ` name="a" string="true">2` + parE + invE, err: true},
		{name: "error then a good block", in: blk + "oops" + blk + inv + ` name="g">` + invE + blkE,
			text: blk + "oops", calls: []string{`g {}`}, err: true},
		{name: "error then think", in: blk + "x<think>r</think>t", text: blk + "xt", reasoning: "r", err: true},
		{name: "error keeps earlier calls", in: blk + inv + ` name="f">` + invE + "junk",
			calls: []string{`f {}`}, text: blk + inv + ` name="f">` + invE + "junk", err: true},
		{name: "truncated in string", in: "x\n\n" + blk + "\n" + inv + ` name="write">` + "\n" + par + ` name="p" string="true">/tmp/a` + parE + par + ` name="body" string="true">hello wor`,
			text: "x", calls: []string{`write {"p": "/tmp/a", "body": "hello wor"}`}, truncated: true},
		{name: "truncated in closing tag", in: blk + inv + ` name="f">` + par + ` name="a" string="true">v</｜DSML｜para`,
			calls: []string{`f {"a": "v"}`}, truncated: true},
		{name: "truncated in json keeps valid", in: blk + inv + ` name="f">` + par + ` name="a" string="false">12`,
			calls: []string{`f {"a": 12}`}, truncated: true},
		{name: "truncated in json drops invalid", in: blk + inv + ` name="f">` + par + ` name="x" string="true">1` + parE + par + ` name="a" string="false">{"k": [1,`,
			calls: []string{`f {"x": "1"}`}, truncated: true},
		{name: "truncated in nested", in: blk + inv + ` name="f">` + par + ` name="o">` + par + ` name="a" string="true">1` + parE + par + ` name="b" str`,
			calls: []string{`f {"o": {"a": "1"}}`}, truncated: true},
		{name: "truncated in invoke tag", in: blk + inv + ` name="f`, truncated: true},
		{name: "truncated between calls", in: blk + inv + ` name="f">` + invE + "\n", calls: []string{`f {}`}, truncated: true},
		{name: "invalid utf8 replaced", in: "a\xffb\xe4\xb8", text: "a\uFFFDb\uFFFD\uFFFD"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := checkSplits(t, tt.in, tt.opts)
			r := s.R
			if r.Text != tt.text {
				t.Errorf("text %q, want %q", r.Text, tt.text)
			}
			if r.Reasoning != tt.reasoning {
				t.Errorf("reasoning %q, want %q", r.Reasoning, tt.reasoning)
			}
			var calls []string
			for _, c := range r.ToolCalls {
				calls = append(calls, c.Name+" "+c.Arguments)
			}
			if !reflect.DeepEqual(calls, tt.calls) {
				t.Errorf("calls %q, want %q", calls, tt.calls)
			}
			if (r.Err != nil) != tt.err {
				t.Errorf("err %v, want error %v", r.Err, tt.err)
			}
			var se *SyntaxError
			if r.Err != nil && !errors.As(r.Err, &se) {
				t.Errorf("error %T is not a *SyntaxError", r.Err)
			}
			if r.Truncated != tt.truncated {
				t.Errorf("truncated %v, want %v", r.Truncated, tt.truncated)
			}
		})
	}
}

// TestStates walks a well-formed turn and checks the sampler state before
// each byte.
func TestStates(t *testing.T) {
	type span struct {
		text  string
		state State
	}
	spans := []span{
		{"plan", StateReasoning},
		{"</think>", StateReasoning},
		{"Sure.\n\n", StateText},
		{"<｜DSML｜tool_calls>", StateText},
		{"\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"cmd\" string=\"true\">", StateStructure},
		{"ls -la", StateString},
		{"</", StateString},
		{"｜DSML｜parameter>\n<｜DSML｜parameter name=\"o\" string=\"false\">", StateStructure},
		{"{\"", StateJSON},
		{"k\"", StateJSONString},
		{": \"", StateJSON},
		{"v\\\"\"", StateJSONString},
		{"}</", StateJSON},
		{"｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>", StateStructure},
		{"after", StateText},
		{"<｜end▁of▁sentence｜>", StateText},
		{"zzz", StateDone},
	}
	p := NewParser(Options{Thinking: true})
	for _, sp := range spans {
		for i := 0; i < len(sp.text); i++ {
			if got := p.State(); got != sp.state {
				t.Fatalf("before byte %d of %q: state %v, want %v", i, sp.text, got, sp.state)
			}
			if p.InStructure() != (sp.state == StateStructure || sp.state == StateJSON) {
				t.Fatalf("InStructure disagrees with %v", sp.state)
			}
			p.Feed(sp.text[i : i+1])
		}
	}
	p.Finish()
	r := p.Result()
	if r.Text != "Sure.after" || len(r.ToolCalls) != 1 || r.ToolCalls[0].Arguments != `{"cmd": "ls -la", "o": {"k": "v\""}}` {
		t.Fatalf("result %+v", r)
	}
}

func TestStreamingHoldback(t *testing.T) {
	p := NewParser(Options{})
	ev := p.Feed("Hello <｜DS")
	if len(ev) != 1 || ev[0].Kind != EventText || ev[0].Text != "Hello" {
		t.Fatalf("events %+v", ev)
	}
	ev = p.Feed("ML｜tool_calls>\n<｜DSML｜invoke name=\"f\">")
	if len(ev) != 2 || ev[0].Kind != EventToolCallBegin || ev[0].Name != "f" || ev[1].Kind != EventToolCallArgs || ev[1].Text != "{" {
		t.Fatalf("events %+v", ev)
	}
	ev = p.Feed("<｜DSML｜parameter name=\"t\" string=\"true\">日\xe6\x9c")
	if len(ev) != 1 || ev[0].Text != `"t": "日` {
		t.Fatalf("events %+v", ev)
	}
	ev = p.Feed("\xac</｜DSML｜par")
	if len(ev) != 1 || ev[0].Text != "本" {
		t.Fatalf("events %+v", ev)
	}
	ev = p.Feed("ameter></｜DSML｜invoke>")
	if len(ev) != 2 || ev[0].Text != `"}` || ev[1].Kind != EventToolCallEnd || ev[1].Call.Arguments != `{"t": "日本"}` {
		t.Fatalf("events %+v", ev)
	}
	if p.Feed("x") != nil {
		// A byte that breaks the block is reported at once.
	}
	if p.Result().Err == nil {
		t.Fatal("no error for text inside a block")
	}
	if p.Finish() == nil && p.Feed("more") != nil {
		t.Fatal("Feed after Finish returned events")
	}
}

func TestEventIndexes(t *testing.T) {
	in := blk + inv + ` name="a">` + invE + inv + ` name="b">` + par + ` name="x" string="false">1` + parE + invE + blkE
	p := NewParser(Options{})
	ev := append(p.Feed(in), p.Finish()...)
	want := []struct {
		kind  EventKind
		index int
	}{
		{EventToolCallBegin, 0}, {EventToolCallArgs, 0}, {EventToolCallEnd, 0},
		{EventToolCallBegin, 1}, {EventToolCallArgs, 1}, {EventToolCallEnd, 1},
	}
	if len(ev) != len(want) {
		t.Fatalf("events %+v", ev)
	}
	for i, w := range want {
		if ev[i].Kind != w.kind || ev[i].Index != w.index {
			t.Errorf("event %d: %v/%d, want %v/%d", i, ev[i].Kind, ev[i].Index, w.kind, w.index)
		}
	}
	if ev[5].Call.Raw != inv+` name="b">`+par+` name="x" string="false">1`+parE+invE {
		t.Errorf("raw %q", ev[5].Call.Raw)
	}
}

func FuzzParser(f *testing.F) {
	seeds := []string{
		"plain text",
		"reason</think>text\n\n" + blk + "\n" + inv + ` name="f">` + "\n" + par + ` name="a" string="true">x` + parE + "\n" + invE + "\n" + blkE,
		blk + inv + ` name="f">` + par + ` name="o">` + par + ` name="a" string="false">[1, {"b": "</think>"}]` + parE + parE + invE + blkE,
		"<DSML｜tool_calls><DSML｜invoke name=\"g\"><DSML｜parameter name=\"q\" string=\"true\">&amp;&lt;</DSML｜parameter></DSML｜invoke></DSML｜tool_calls>",
		blk + inv + ` name="f">` + par + ` name="a" string="true">cut off`,
		blk + "junk" + inv,
		"<think>" + blk + "</think>" + blkE + "<｜end▁of▁sentence｜>",
		"\xff\xe4\xb8" + blk + inv + ` name="\xe4">` + par + ` name="k" string="false">"\xe4` + parE,
	}
	for i, s := range seeds {
		f.Add(s, uint64(i*7919+1), uint8(i))
	}
	f.Fuzz(func(t *testing.T, in string, cutSeed uint64, flags uint8) {
		opts := Options{Thinking: flags&1 != 0, DecodeEntities: flags&2 != 0, DisableToolCalls: flags&4 != 0}
		whole := parseSplit(in, nil, opts)
		checkInvariants(t, in, whole)
		rng := rand.New(rand.NewPCG(cutSeed, uint64(len(in))))
		var cuts []int
		for i := 1; i < len(in); i++ {
			if rng.IntN(4) == 0 {
				cuts = append(cuts, i)
			}
		}
		if got := parseSplit(in, cuts, opts); !reflect.DeepEqual(got, whole) {
			t.Fatalf("split %v differs:\n got %+v\nwant %+v", cuts, got, whole)
		}
	})
}
