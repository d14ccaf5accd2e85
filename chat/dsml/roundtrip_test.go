package dsml

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"ds4go/chat"
)

// roundTrip renders calls with chat.RenderToolCalls, parses the block back
// and requires each call's Arguments to equal the official serialisation of
// the input (chat.PyJSON), and its Raw text to appear in the block.
func roundTrip(t *testing.T, calls []chat.ToolCall) {
	t.Helper()
	block, err := chat.RenderToolCalls(calls, false)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	out := "Working on it." + block
	r := checkSplits(t, out, Options{})
	if r.R.Err != nil {
		t.Fatalf("parse %q: %v", out, r.R.Err)
	}
	if r.R.Text != "Working on it." || r.R.ToolBlock != block {
		t.Fatalf("text %q block %q", r.R.Text, r.R.ToolBlock)
	}
	if len(r.R.ToolCalls) != len(calls) {
		t.Fatalf("%d calls parsed, %d rendered", len(r.R.ToolCalls), len(calls))
	}
	for i, c := range calls {
		want, err := chat.PyJSON([]byte(c.Arguments))
		if err != nil {
			t.Fatal(err)
		}
		got := r.R.ToolCalls[i]
		if got.Name != c.Name || got.Arguments != want {
			t.Errorf("call %d: got %s %s, want %s %s", i, got.Name, got.Arguments, c.Name, want)
		}
		if !strings.Contains(block, got.Raw) {
			t.Errorf("call %d: raw not in block", i)
		}
	}
}

func TestRoundTripRenderer(t *testing.T) {
	roundTrip(t, []chat.ToolCall{
		{Name: "bash", Arguments: `{"command":"echo \"hi\" && cat <f> | grep 'x'\nls","timeout":30}`},
		{Name: "edit", Arguments: `{"path":"a.go","old":"\tx := 1\n","new":"\tx := 2\n","n":1.50,"flags":[true,null,{"z":1e5}]}`},
		{Name: "empty", Arguments: `{}`},
		{Name: "uni", Arguments: `{"t":"中文 😀 \u0001 \\ end","e":""}`},
	})
}

func FuzzRoundTrip(f *testing.F) {
	f.Add("f", `{"a": "x", "b": [1, 2.5], "c": {"d": null}}`)
	f.Add("g", `{"s": "<p>a &amp; b</p>\n", "n": -0.0}`)
	f.Add("h", `{}`)
	f.Fuzz(func(t *testing.T, name, args string) {
		var obj map[string]json.RawMessage
		if json.Unmarshal([]byte(args), &obj) != nil {
			return
		}
		// The official format has no escaping: text that spells DSML or
		// think markup, quotes in names, and invalid UTF-8 cannot round-trip.
		bad := func(s string) bool {
			return strings.Contains(s, "DSML｜") || strings.Contains(s, "think>") ||
				strings.Contains(s, "<｜end▁of▁sentence｜>") || strings.ContainsAny(s, "\"<>")
		}
		if name == "" || bad(name) || strings.Contains(args, "DSML｜") {
			return
		}
		for k := range obj {
			if bad(k) {
				return
			}
		}
		if !validUTF8JSONStrings(args) {
			return
		}
		roundTrip(t, []chat.ToolCall{{Name: name, Arguments: args}})
	})
}

// validUTF8JSONStrings reports whether args decodes without replacing
// invalid UTF-8 or lone surrogates (which Go's decoder turns into U+FFFD).
func validUTF8JSONStrings(args string) bool {
	return !strings.Contains(args, `\ud`) && !strings.Contains(args, `\uD`) &&
		!strings.ContainsRune(args, '\uFFFD') && json.Valid([]byte(args)) && utf8.ValidString(args)
}

func TestRoundTripEscaped(t *testing.T) {
	args := `{"cmd": "echo 2>&1 && echo </｜DSML｜parameter> done", "o": {"k": "</｜DSML｜parameter>"}, "<k>": 1}`
	block, err := chat.RenderToolCalls([]chat.ToolCall{{Name: `a"b`, Arguments: args}}, true)
	if err != nil {
		t.Fatal(err)
	}
	r := checkSplits(t, block, Options{DecodeEntities: true})
	if r.R.Err != nil || len(r.R.ToolCalls) != 1 {
		t.Fatalf("%+v", r.R)
	}
	tc := r.R.ToolCalls[0]
	if tc.Name != `a"b` {
		t.Errorf("name %q", tc.Name)
	}
	var got, want any
	if err := json.Unmarshal([]byte(tc.Arguments), &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(args), &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %s want %s", tc.Arguments, args)
	}
}

// TestDS4NestedExample is the loose nested form from ds4-server's test
// test_dsml_parser_recovers_loose_nested_parameters, which decodes entities.
func TestDS4NestedExample(t *testing.T) {
	in := "review done\n\n" + blk + "\n" +
		inv + " name=\"edit\">\n" +
		par + " name=\"path\">/private/tmp/tetris.c" + parE + "\n" +
		par + " name=\"edits\">\n" +
		par + " name=\"oldText\" string=\"true\">old &lt;text&gt;" + parE + "\n" +
		par + " name=\"newText\" string=\"true\">new text" + parE + "\n" +
		invE + "\n" + blkE
	r := checkSplits(t, in, Options{DecodeEntities: true})
	if r.R.Err != nil || r.R.Text != "review done" || len(r.R.ToolCalls) != 1 {
		t.Fatalf("%+v", r.R)
	}
	want := `{"path": "/private/tmp/tetris.c", "edits": {"oldText": "old <text>", "newText": "new text"}}`
	if got := r.R.ToolCalls[0].Arguments; got != want {
		t.Errorf("got %s want %s", got, want)
	}
}
