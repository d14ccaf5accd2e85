package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"ds4go/chat"
)

// apiKind is the wire protocol of a request.
type apiKind uint8

const (
	apiChat        apiKind = iota // OpenAI /v1/chat/completions
	apiCompletions                // OpenAI /v1/completions
	apiResponses                  // OpenAI /v1/responses
	apiMessages                   // Anthropic /v1/messages
)

func (a apiKind) String() string {
	switch a {
	case apiChat:
		return "chat"
	case apiCompletions:
		return "completions"
	case apiResponses:
		return "responses"
	case apiMessages:
		return "messages"
	}
	return "unknown"
}

// Model names.
const (
	// ModelID is the id the server reports and echoes by default.
	ModelID = "deepseek-v4-flash"
	// AliasChat selects non-thinking mode unless the request says otherwise.
	AliasChat = "deepseek-chat"
	// AliasReasoner selects thinking mode unless the request says otherwise.
	AliasReasoner = "deepseek-reasoner"
)

// toolWire is how a prompt tool name maps back to the client's names
// (Responses namespaces and the hosted tool_search tool).
type toolWire struct {
	name       string // client-facing name
	namespace  string // Responses namespace, if any
	toolSearch bool   // the Responses hosted tool_search tool
}

// genRequest is a parsed request of any API, normalised for generation.
type genRequest struct {
	api   apiKind
	model string

	conv         chat.Conversation // chat-like APIs
	rawPrompt    string            // completions
	mode         chat.Mode         // effective mode (after the Think-Max gate)
	sampling     SamplingParams
	seed         uint64
	hasSeed      bool
	maxTokens    int // < 0: server default
	stops        []string
	stream       bool
	incUsage     bool
	hasTools     bool
	toolWire     map[string]toolWire
	summary      bool // Responses: reasoning summary requested
	encReasoning bool // Responses: include reasoning.encrypted_content
	liveIDs      []string
	liveTail     string // rendered tail for a live tool-result continuation
	needsLive    bool   // the request cannot be served without live state
	replayNoRs   bool   // Responses replay of a tool turn without its reasoning

	promptText   string
	promptTokens []int32
}

// apiError is an error with the HTTP status and the fields each protocol
// reports.
type apiError struct {
	status  int
	typ     string // OpenAI "type" / Anthropic error type
	code    string // OpenAI "code"
	param   string
	msg     string
	nPrompt int // context_length_exceeded
	nCtx    int
}

func (e *apiError) Error() string { return e.msg }

func badRequest(format string, args ...any) *apiError {
	return &apiError{status: 400, typ: "invalid_request_error", msg: fmt.Sprintf(format, args...)}
}

// maxJSONDepth bounds nesting in request bodies (ds4 uses 256 too).
const maxJSONDepth = 256

// checkJSON rejects bodies that are empty or nest deeper than maxJSONDepth,
// before encoding/json sees them.
func checkJSON(body []byte) *apiError {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return badRequest("empty request body: expected a JSON object")
	}
	if body[0] != '{' {
		return badRequest("request body must be a JSON object")
	}
	depth := 0
	inStr, esc := false, false
	for _, c := range body {
		if inStr {
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
			continue
		}
		switch c {
		case '"':
			inStr = true
		case '{', '[':
			depth++
			if depth > maxJSONDepth {
				return badRequest("request JSON nests deeper than %d levels", maxJSONDepth)
			}
		case '}', ']':
			depth--
		}
	}
	return nil
}

// decodeJSON unmarshals a request body into v with a message that says
// where the problem is.
func decodeJSON(body []byte, v any) *apiError {
	if e := checkJSON(body); e != nil {
		return e
	}
	if err := json.Unmarshal(body, v); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			return badRequest("invalid JSON at byte %d: %v", se.Offset, se)
		case errors.As(err, &te):
			field := te.Field
			if field == "" {
				field = "(top level)"
			}
			return badRequest("invalid JSON: field %s: expected %s, got JSON %s", field, te.Type, te.Value)
		}
		return badRequest("invalid JSON: %v", err)
	}
	return nil
}

// optNumber is a JSON number that may be absent or null.
type optNumber struct {
	set bool
	v   float64
}

func (n *optNumber) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*n = optNumber{}
		return nil
	}
	v, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return fmt.Errorf("expected a number, got %s", clipJSON(b))
	}
	*n = optNumber{set: true, v: v}
	return nil
}

// int returns the number as an int, rejecting fractions.
func (n optNumber) int(name string) (int, *apiError) {
	if n.v != math.Trunc(n.v) || math.Abs(n.v) > 1<<31 {
		return 0, badRequest("%s must be an integer, got %v", name, n.v)
	}
	return int(n.v), nil
}

func clipJSON(b []byte) string {
	if len(b) > 40 {
		return string(b[:40]) + "…"
	}
	return string(b)
}

// effort is a requested reasoning effort.
type effort uint8

const (
	effHigh effort = iota // the default
	effNone
	effMax
)

// parseEffort maps reasoning_effort names as ds4 does: max → Think-Max;
// xhigh, high, medium, low, minimal → thinking; none → no thinking.
func parseEffort(s string) (effort, bool) {
	switch s {
	case "max":
		return effMax, true
	case "xhigh", "high", "medium", "low", "minimal":
		return effHigh, true
	case "none":
		return effNone, true
	}
	return effHigh, false
}

// thinkCtl collects a request's thinking controls.
type thinkCtl struct {
	got     bool // thinking/think set explicitly
	enabled bool
	eff     effort
}

func newThinkCtl() thinkCtl { return thinkCtl{enabled: true} }

// thinkingField parses "thinking": a bool, {"type":"enabled"|"disabled"},
// or null.
func (t *thinkCtl) thinkingField(raw json.RawMessage) *apiError {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	switch string(raw) {
	case "true":
		t.got, t.enabled = true, true
		return nil
	case "false":
		t.got, t.enabled = true, false
		return nil
	}
	var obj struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return badRequest("thinking must be a boolean or an object like {\"type\":\"enabled\"}")
	}
	t.got = true
	switch obj.Type {
	case "enabled", "adaptive":
		t.enabled = true
	case "disabled":
		t.enabled = false
	}
	return nil
}

// effortField parses a reasoning_effort string (null leaves it alone).
func (t *thinkCtl) effortField(name string, v *string) *apiError {
	if v == nil {
		return nil
	}
	e, ok := parseEffort(*v)
	if !ok {
		return badRequest("%s %q is not one of none, minimal, low, medium, high, xhigh, max", name, *v)
	}
	t.eff = e
	return nil
}

// mode resolves the controls and the model alias into a chat mode for a
// context of ctxSize tokens.
func (t thinkCtl) mode(model string, ctxSize int) chat.Mode {
	enabled := t.enabled
	if !t.got {
		switch model {
		case AliasChat:
			enabled = false
		case AliasReasoner:
			enabled = true
		}
	}
	var m chat.Mode
	switch {
	case !enabled || t.eff == effNone:
		m = chat.ModeChat
	case t.eff == effMax:
		m = chat.ModeThinkMax
	default:
		m = chat.ModeThinking
	}
	return chat.EffectiveMode(m, ctxSize)
}

// parseStop accepts a string or an array of strings (empty ones dropped).
func parseStop(raw json.RawMessage, name string) ([]string, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		if one == "" {
			return nil, nil
		}
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, badRequest("%s must be a string or an array of strings", name)
	}
	out := many[:0]
	for _, s := range many {
		if s != "" {
			out = append(out, s)
		}
	}
	if len(out) > 16 {
		return nil, badRequest("%s: at most 16 stop sequences", name)
	}
	return out, nil
}

// samplingFrom fills sampling settings; in thinking mode the client's knobs
// are ignored, like the official API and ds4.
func samplingFrom(mode chat.Mode, temp, topP, minP, topK optNumber) (SamplingParams, *apiError) {
	p := DefaultSampling()
	if temp.set {
		if temp.v < 0 || temp.v > 2 || math.IsNaN(temp.v) {
			return p, badRequest("temperature must be between 0 and 2, got %v", temp.v)
		}
		p.Temperature = temp.v
	}
	if topP.set {
		if topP.v < 0 || topP.v > 1 || math.IsNaN(topP.v) {
			return p, badRequest("top_p must be between 0 and 1, got %v", topP.v)
		}
		p.TopP = topP.v
	}
	if minP.set {
		if minP.v < 0 || minP.v > 1 || math.IsNaN(minP.v) {
			return p, badRequest("min_p must be between 0 and 1, got %v", minP.v)
		}
		p.MinP = minP.v
	}
	if topK.set {
		k, e := topK.int("top_k")
		if e != nil {
			return p, e
		}
		if k < 0 {
			return p, badRequest("top_k must not be negative")
		}
		p.TopK = k
	}
	if mode.Thinking() {
		return DefaultSampling(), nil
	}
	return p, nil
}

// jsonString returns s as a JSON string literal.
func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// functionSchema builds the function object the prompt shows for a tool:
// {"name":…, "description":…, "parameters":…}, parameters kept as sent (so
// their property order is the client's).
func functionSchema(name string, desc *string, params json.RawMessage) json.RawMessage {
	var sb strings.Builder
	sb.WriteString(`{"name":`)
	sb.WriteString(jsonString(name))
	if desc != nil {
		sb.WriteString(`,"description":`)
		sb.WriteString(jsonString(*desc))
	}
	params = bytes.TrimSpace(params)
	if len(params) == 0 || string(params) == "null" {
		params = json.RawMessage(`{"type":"object","properties":{}}`)
	}
	sb.WriteString(`,"parameters":`)
	sb.Write(params)
	sb.WriteByte('}')
	return json.RawMessage(sb.String())
}

// contentText flattens OpenAI-style message content: a string, null, or an
// array of parts whose text parts are concatenated.
func contentText(raw json.RawMessage, where string) (string, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", badRequest("%s: invalid string", where)
		}
		return s, nil
	}
	if raw[0] != '[' {
		return "", badRequest("%s must be a string or an array of content parts", where)
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", badRequest("%s: %v", where, err)
	}
	var sb strings.Builder
	for i, p := range parts {
		p = bytes.TrimSpace(p)
		if len(p) > 0 && p[0] == '"' {
			var s string
			_ = json.Unmarshal(p, &s)
			sb.WriteString(s)
			continue
		}
		var part struct {
			Type string  `json:"type"`
			Text *string `json:"text"`
		}
		if err := json.Unmarshal(p, &part); err != nil {
			return "", badRequest("%s[%d]: content parts must be objects with a type", where, i)
		}
		switch part.Type {
		case "text", "input_text", "output_text", "summary_text", "reasoning_text", "":
			if part.Text == nil {
				if part.Type == "" {
					return "", badRequest("%s[%d]: content part without type or text", where, i)
				}
				continue
			}
			sb.WriteString(*part.Text)
		case "refusal":
			// An assistant refusal part carries no prompt text of ours.
		default:
			return "", badRequest("%s[%d]: content type %q is not supported (text only)", where, i, part.Type)
		}
	}
	return sb.String(), nil
}
