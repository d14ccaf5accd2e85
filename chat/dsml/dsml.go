// Package dsml parses DeepSeek V4 output as it is generated: visible text,
// reasoning inside <think>…</think>, and tool calls written in DSML:
//
//	<｜DSML｜tool_calls>
//	<｜DSML｜invoke name="NAME">
//	<｜DSML｜parameter name="KEY" string="true">raw text</｜DSML｜parameter>
//	<｜DSML｜parameter name="KEY2" string="false">JSON value</｜DSML｜parameter>
//	</｜DSML｜invoke>
//	</｜DSML｜tool_calls>
//
// A Parser takes the text in pieces of any size (Feed) and returns events.
// Markers split across pieces are handled: the parser holds back only the
// bytes that could still begin a marker (plus an incomplete UTF-8 sequence,
// and in free text the trailing whitespace that might separate a tool-call
// block), so the result never depends on how the input was split.
//
// Besides the official syntax the parser accepts the short form with the
// first vertical bar dropped (<DSML｜invoke …>) and parameters without a
// string attribute whose body is further parameters (a nested object), as
// ds4's server does. DSML inside an open <think> block is reasoning text.
// Malformed DSML never panics: it yields an EventError and the offending
// bytes are returned as visible text.
package dsml

import "fmt"

// State tells the sampler what kind of text comes next.
type State uint8

// States.
const (
	// StateText is free visible text.
	StateText State = iota
	// StateReasoning is text inside <think>…</think>.
	StateReasoning
	// StateStructure is DSML markup: tags, attribute values, the whitespace
	// between tags, and a closing tag that has begun.
	StateStructure
	// StateString is the body of a string parameter.
	StateString
	// StateJSON is the body of a JSON parameter outside JSON strings.
	StateJSON
	// StateJSONString is a string inside a JSON parameter.
	StateJSONString
	// StateDone follows an end-of-sentence marker; further input is ignored.
	StateDone
)

// String names the state.
func (s State) String() string {
	switch s {
	case StateText:
		return "text"
	case StateReasoning:
		return "reasoning"
	case StateStructure:
		return "structure"
	case StateString:
		return "string"
	case StateJSON:
		return "json"
	case StateJSONString:
		return "json-string"
	case StateDone:
		return "done"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// EventKind identifies an Event.
type EventKind uint8

// Event kinds.
const (
	// EventText carries visible text in Text.
	EventText EventKind = iota + 1
	// EventReasoning carries reasoning text in Text.
	EventReasoning
	// EventToolCallBegin starts call Index; Name is known.
	EventToolCallBegin
	// EventToolCallArgs carries a piece of call Index's JSON arguments in
	// Text. The pieces of one call concatenate to its final Arguments.
	EventToolCallArgs
	// EventToolCallEnd completes call Index; Call holds the whole call.
	EventToolCallEnd
	// EventError reports malformed DSML in Err (a *SyntaxError). If a call
	// was open (Index >= 0) it is abandoned: discard what was streamed for
	// it. The block's text comes back as EventText.
	EventError
)

// String names the kind.
func (k EventKind) String() string {
	switch k {
	case EventText:
		return "text"
	case EventReasoning:
		return "reasoning"
	case EventToolCallBegin:
		return "tool-call-begin"
	case EventToolCallArgs:
		return "tool-call-args"
	case EventToolCallEnd:
		return "tool-call-end"
	case EventError:
		return "error"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event is one step of parsed output.
type Event struct {
	Kind EventKind
	// Text is the delta of EventText, EventReasoning and EventToolCallArgs.
	Text string
	// Index is the tool call's position in the output (0-based), or -1.
	Index int
	// Name is the function name of EventToolCallBegin.
	Name string
	// Call is the finished call of EventToolCallEnd.
	Call *ToolCall
	// Err is the error of EventError.
	Err error
}

// ToolCall is one parsed call.
type ToolCall struct {
	// Index is the call's position in the output.
	Index int
	// Name is the function name.
	Name string
	// Arguments is a JSON object: string parameters as JSON strings, the
	// others as the JSON text the model wrote, keys in the order written,
	// separators ", " and ": " as in the official decoder.
	Arguments string
	// Raw is the exact DSML text of the call, from <｜DSML｜invoke to
	// </｜DSML｜invoke>, for byte-exact replay. A repaired call's Raw stops
	// where the output stopped.
	Raw string
	// Truncated is set when the output ended inside the call and Finish
	// closed it.
	Truncated bool
	// Coerced is set when a string="false" value was not valid JSON and was
	// kept as a JSON string instead.
	Coerced bool
}

// SyntaxError describes malformed DSML.
type SyntaxError struct {
	// Offset is the byte offset in the whole output where the problem was
	// seen.
	Offset int64
	// Msg says what was wrong.
	Msg string
	// Raw is the text of the tool-call block up to the problem.
	Raw string
}

// Error implements error.
func (e *SyntaxError) Error() string {
	return fmt.Sprintf("dsml: byte %d: %s", e.Offset, e.Msg)
}

// Options configure a Parser.
type Options struct {
	// Thinking starts the parser inside a reasoning block, for prompts that
	// end with <think>.
	Thinking bool
	// DecodeEntities decodes &amp; &lt; &gt; &quot; &apos; in string
	// parameter bodies and attribute values, matching a renderer that
	// escapes them (ds4's server does). The official format has no escaping.
	DecodeEntities bool
	// DisableToolCalls treats DSML as plain text (for requests without
	// tools).
	DisableToolCalls bool
}

// Result is everything parsed so far.
type Result struct {
	// Text is the visible text.
	Text string
	// Reasoning is the reasoning text.
	Reasoning string
	// ToolCalls are the completed (or, after Finish, repaired) calls.
	ToolCalls []ToolCall
	// ToolBlock is the raw text of the tool-call block(s), including the
	// whitespace that separated them from the text.
	ToolBlock string
	// Err is the first syntax error, if any.
	Err error
	// Truncated is set when Finish had to close an open tool-call block.
	Truncated bool
	// ThinkingOpen is set when the output ended inside <think>.
	ThinkingOpen bool
}

// Parse parses a complete output.
func Parse(s string, opts Options) Result {
	p := NewParser(opts)
	p.Feed(s)
	p.Finish()
	return p.Result()
}
