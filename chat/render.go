package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Role is the author of a message.
type Role string

// Roles understood by Render.
const (
	// RoleSystem is a system prompt; tools and the response format attach to
	// the first one.
	RoleSystem Role = "system"
	// RoleUser is a user turn.
	RoleUser Role = "user"
	// RoleAssistant is a model turn: reasoning, content and tool calls.
	RoleAssistant Role = "assistant"
	// RoleTool carries one tool result; consecutive results (and user text
	// that follows them) merge into one user turn, as the official encoder
	// does.
	RoleTool Role = "tool"
	// RoleDeveloper is the official encoder's "developer" turn: rendered like
	// a user turn and dropped from history in thinking mode. It is not the
	// OpenAI developer role; servers should map that one to RoleSystem.
	RoleDeveloper Role = "developer"
	// RoleLatestReminder is a <｜latest_reminder｜> message (date, locale…).
	RoleLatestReminder Role = "latest_reminder"
)

// Message is one entry of a conversation. The JSON field names follow the
// OpenAI chat API where one exists.
type Message struct {
	Role Role `json:"role"`
	// Content is the message text.
	Content string `json:"content,omitempty"`
	// Reasoning is an assistant turn's thinking text (without the tags).
	Reasoning string `json:"reasoning_content,omitempty"`
	// ToolCalls are an assistant turn's tool calls.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// ToolCallID links a RoleTool result to the call it answers; it orders
	// results like the calls they answer.
	ToolCallID string `json:"tool_call_id,omitempty"`
	// Partial renders an assistant turn without its closing EOS, so that the
	// model continues it (the official encoder's wo_eos).
	Partial bool `json:"partial,omitempty"`
	// RawToolCalls, when set on an assistant turn, is written verbatim in
	// place of the DSML block rendered from ToolCalls: the exact text the
	// model sampled (dsml.Result.ToolBlock, with its leading whitespace), so
	// that history re-renders byte for byte.
	RawToolCalls string `json:"raw_tool_calls,omitempty"`
}

// ToolCall is a call made by the assistant.
type ToolCall struct {
	// ID is the client-visible id; only used to order tool results.
	ID string `json:"id,omitempty"`
	// Name is the function name.
	Name string `json:"name"`
	// Arguments is the JSON object text of the arguments, as the client sent
	// it (OpenAI "arguments"). Text that is not JSON renders as one string
	// parameter named "arguments", as the official encoder does.
	Arguments string `json:"arguments"`
}

// Conversation is what Render turns into a prompt.
type Conversation struct {
	// Messages in order.
	Messages []Message `json:"messages"`
	// Tools are function schemas: each the JSON object with name,
	// description and parameters (the value of OpenAI's "function" field).
	// Key order is kept as given.
	Tools []json.RawMessage `json:"tools,omitempty"`
	// ResponseFormat, when set, is a JSON schema rendered after the tools.
	ResponseFormat json.RawMessage `json:"response_format,omitempty"`
}

// Mode selects how the assistant turn is opened.
type Mode int

// Modes.
const (
	// ModeChat is non-thinking: the assistant turn starts with </think>.
	ModeChat Mode = iota
	// ModeThinking opens the assistant turn with <think>.
	ModeThinking
	// ModeThinkMax is ModeThinking plus the reasoning-effort prefix; it is
	// honoured only when Options.ContextSize >= ThinkMaxMinContext.
	ModeThinkMax
)

// String returns the mode's name as ds4 prints it.
func (m Mode) String() string {
	switch m {
	case ModeChat:
		return "none"
	case ModeThinking:
		return "high"
	case ModeThinkMax:
		return "max"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Thinking reports whether the mode opens a reasoning block.
func (m Mode) Thinking() bool { return m == ModeThinking || m == ModeThinkMax }

// EffectiveMode returns the mode Render will use for a context of ctxSize
// tokens: ModeThinkMax degrades to ModeThinking below ThinkMaxMinContext,
// as in ds4.
func EffectiveMode(m Mode, ctxSize int) Mode {
	if m == ModeThinkMax && ctxSize < ThinkMaxMinContext {
		return ModeThinking
	}
	return m
}

// Options control rendering.
type Options struct {
	// Mode is the thinking mode.
	Mode Mode
	// ContextSize is the model context in tokens; it gates ModeThinkMax.
	ContextSize int
	// KeepReasoning keeps the reasoning of earlier turns in thinking mode
	// (the official encoder's drop_thinking=False). Reasoning is always kept
	// when the conversation has tools.
	KeepReasoning bool
	// EscapeDSML applies ds4-server's escapes, which the official encoder
	// does not have: "</tool_result>" inside a tool result and
	// "</｜DSML｜parameter>" inside a string argument become "&lt;/…",
	// inside a JSON argument "\u003c/…", and & < > " in tool and parameter
	// names become entities. Parse the output with dsml's DecodeEntities.
	// Off by default: output then matches the official encoder.
	EscapeDSML bool
}

// Errors returned by Render.
var (
	// ErrBadMessage reports a message the official encoder rejects.
	ErrBadMessage = errors.New("chat: bad message")
	// ErrBadJSON reports a tool schema or argument that is not usable JSON.
	ErrBadJSON = errors.New("chat: bad JSON")
)

// toolsPreamble is the official TOOLS_TEMPLATE with its placeholders for the
// DSML and think tokens filled in; %s is the schema list.
const toolsPreamble = "## Tools\n\n" +
	"You have access to a set of tools to help answer the user's question. You can invoke tools by writing a \"<" + DSMLToken + "tool_calls>\" block like the following:\n\n" +
	"<" + DSMLToken + "tool_calls>\n" +
	"<" + DSMLToken + "invoke name=\"$TOOL_NAME\">\n" +
	"<" + DSMLToken + "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" + DSMLToken + "parameter>\n" +
	"...\n" +
	"</" + DSMLToken + "invoke>\n" +
	"<" + DSMLToken + "invoke name=\"$TOOL_NAME2\">\n" +
	"...\n" +
	"</" + DSMLToken + "invoke>\n" +
	"</" + DSMLToken + "tool_calls>\n\n" +
	"String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n" +
	"If thinking_mode is enabled (triggered by " + ThinkStart + "), you MUST output your complete reasoning inside " + ThinkStart + "..." + ThinkEnd + " BEFORE any tool calls or final response.\n\n" +
	"Otherwise, output directly after " + ThinkEnd + " with tool calls or final response.\n\n" +
	"### Available Tool Schemas\n\n" +
	"%s\n\n" +
	"You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"

const responseFormatPreamble = "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"

// block is one part of a merged user turn.
type block struct {
	tool   bool   // a tool result rather than text
	id     string // tool_call_id of a tool result
	text   string
	origin int // index of the source message, for error messages
}

// turn is a message after the official preprocessing (tool results merged
// into user turns).
type turn struct {
	role   Role
	msg    Message
	blocks []block // user turns only
	tools  bool    // carries the tools preamble / response format
	origin int
}

// Render returns the prompt text for c. A conversation that ends with a user,
// tool or developer message ends with the assistant opening
// (<｜Assistant｜> then <think> or </think>); one that ends with an assistant
// message ends with its EOS (or without it, if Partial).
func Render(c Conversation, opts Options) (string, error) {
	var sb strings.Builder
	if err := AppendRender(&sb, c, opts); err != nil {
		return "", err
	}
	return sb.String(), nil
}

// AppendRender is Render writing into sb.
func AppendRender(sb *strings.Builder, c Conversation, opts Options) error {
	mode := EffectiveMode(opts.Mode, opts.ContextSize)
	if mode < ModeChat || mode > ModeThinkMax {
		return fmt.Errorf("chat: unknown mode %d", int(opts.Mode))
	}
	thinking := mode.Thinking()

	// Pre-render the tools section so that schema errors surface first.
	var extra string
	if len(c.Tools) > 0 {
		schemas := make([]string, len(c.Tools))
		for i, raw := range c.Tools {
			s, err := PyJSON(raw)
			if err != nil {
				return fmt.Errorf("%w: tool %d schema: %w", ErrBadJSON, i, err)
			}
			schemas[i] = s
		}
		extra = "\n\n" + fmt.Sprintf(toolsPreamble, strings.Join(schemas, "\n"))
	}
	if len(c.ResponseFormat) > 0 {
		v, err := parsePyJSON(c.ResponseFormat)
		if err != nil {
			return fmt.Errorf("%w: response_format: %w", ErrBadJSON, err)
		}
		if pyTruthy(v) {
			s, err := pyDumps(v)
			if err != nil {
				return fmt.Errorf("%w: response_format: %w", ErrBadJSON, err)
			}
			extra += "\n\n" + responseFormatPreamble + s
		}
	}

	turns, err := mergeTurns(c.Messages)
	if err != nil {
		return err
	}
	if extra != "" {
		attached := false
		for i := range turns {
			if turns[i].role == RoleSystem {
				turns[i].tools = true
				attached = true
				break
			}
		}
		if !attached {
			turns = slices.Insert(turns, 0, turn{role: RoleSystem, tools: true, origin: -1})
		}
	}
	sortToolResults(turns)

	drop := !opts.KeepReasoning && len(c.Tools) == 0
	if thinking && drop {
		turns = dropOldThinking(turns)
	}
	lastUser := lastUserIndex(turns)

	sb.WriteString(BOS)
	for i := range turns {
		t := &turns[i]
		if i == 0 && mode == ModeThinkMax {
			sb.WriteString(ReasoningEffortMaxPrefix)
		}
		switch t.role {
		case RoleSystem:
			sb.WriteString(t.msg.Content)
			if t.tools {
				sb.WriteString(extra)
			}
		case RoleDeveloper:
			if t.msg.Content == "" {
				return fmt.Errorf("%w: message %d: developer message needs content", ErrBadMessage, t.origin)
			}
			sb.WriteString(UserToken)
			sb.WriteString(t.msg.Content)
		case RoleUser:
			sb.WriteString(UserToken)
			for j, b := range t.blocks {
				if j > 0 {
					sb.WriteString("\n\n")
				}
				if b.tool {
					sb.WriteString("<tool_result>")
					if opts.EscapeDSML {
						sb.WriteString(escapeClosing(b.text, "</tool_result>", "&lt;"))
					} else {
						sb.WriteString(b.text)
					}
					sb.WriteString("</tool_result>")
				} else {
					sb.WriteString(b.text)
				}
			}
		case RoleLatestReminder:
			sb.WriteString(LatestReminderToken)
			sb.WriteString(t.msg.Content)
		case RoleAssistant:
			if thinking && (!drop || i > lastUser) {
				sb.WriteString(t.msg.Reasoning)
				sb.WriteString(ThinkEnd)
			}
			sb.WriteString(t.msg.Content)
			if t.msg.RawToolCalls != "" {
				sb.WriteString(t.msg.RawToolCalls)
			} else if len(t.msg.ToolCalls) > 0 {
				if err := appendToolCalls(sb, t.msg.ToolCalls, opts.EscapeDSML); err != nil {
					return fmt.Errorf("message %d: %w", t.origin, err)
				}
			}
			if !t.msg.Partial {
				sb.WriteString(EOS)
			}
		}
		// The assistant opening follows a user-like turn that is last or
		// followed by an assistant or latest_reminder message.
		if i+1 < len(turns) && turns[i+1].role != RoleAssistant && turns[i+1].role != RoleLatestReminder {
			continue
		}
		if t.role == RoleUser || t.role == RoleDeveloper {
			sb.WriteString(AssistantToken)
			if thinking && (!drop || i >= lastUser) {
				sb.WriteString(ThinkStart)
			} else {
				sb.WriteString(ThinkEnd)
			}
		}
	}
	return nil
}

// mergeTurns applies the official merge_tool_messages: every tool result and
// every user message that follows a user turn joins that turn as a block.
func mergeTurns(msgs []Message) ([]turn, error) {
	turns := make([]turn, 0, len(msgs))
	for i, m := range msgs {
		switch m.Role {
		case RoleTool, RoleUser:
			b := block{tool: m.Role == RoleTool, id: m.ToolCallID, text: m.Content, origin: i}
			if n := len(turns); n > 0 && turns[n-1].role == RoleUser {
				turns[n-1].blocks = append(turns[n-1].blocks, b)
				continue
			}
			turns = append(turns, turn{role: RoleUser, blocks: []block{b}, origin: i})
		case RoleSystem, RoleAssistant, RoleDeveloper, RoleLatestReminder:
			turns = append(turns, turn{role: m.Role, msg: m, origin: i})
		default:
			return nil, fmt.Errorf("%w: message %d: unknown role %q", ErrBadMessage, i, m.Role)
		}
	}
	return turns, nil
}

// sortToolResults orders the tool results of each user turn like the calls
// of the latest assistant turn that made calls (a stable sort; results with
// unknown ids sort as if first).
func sortToolResults(turns []turn) {
	var order map[string]int
	for i := range turns {
		t := &turns[i]
		switch t.role {
		case RoleAssistant:
			if len(t.msg.ToolCalls) == 0 {
				continue
			}
			order = map[string]int{}
			for j, tc := range t.msg.ToolCalls {
				if tc.ID != "" {
					order[tc.ID] = j
				}
			}
		case RoleUser:
			if len(order) == 0 {
				continue
			}
			var results []block
			for _, b := range t.blocks {
				if b.tool {
					results = append(results, b)
				}
			}
			if len(results) < 2 {
				continue
			}
			slices.SortStableFunc(results, func(a, b block) int {
				return order[a.id] - order[b.id]
			})
			k := 0
			for j := range t.blocks {
				if t.blocks[j].tool {
					t.blocks[j] = results[k]
					k++
				}
			}
		}
	}
}

// lastUserIndex is the index of the last user or developer turn, or -1.
func lastUserIndex(turns []turn) int {
	for i := len(turns) - 1; i >= 0; i-- {
		if turns[i].role == RoleUser || turns[i].role == RoleDeveloper {
			return i
		}
	}
	return -1
}

// dropOldThinking applies the official _drop_thinking_messages: before the
// last user turn, assistant reasoning is removed and developer turns are
// dropped.
func dropOldThinking(turns []turn) []turn {
	last := lastUserIndex(turns)
	out := turns[:0:0]
	for i, t := range turns {
		switch {
		case i >= last, t.role == RoleUser, t.role == RoleSystem, t.role == RoleLatestReminder:
			out = append(out, t)
		case t.role == RoleAssistant:
			t.msg.Reasoning = ""
			out = append(out, t)
		}
	}
	return out
}

// RenderToolCalls returns the DSML block the official encoder appends to an
// assistant turn that made calls, including its leading "\n\n". escape
// applies the escapes of Options.EscapeDSML.
func RenderToolCalls(calls []ToolCall, escape bool) (string, error) {
	var sb strings.Builder
	if err := appendToolCalls(&sb, calls, escape); err != nil {
		return "", err
	}
	return sb.String(), nil
}

func appendToolCalls(sb *strings.Builder, calls []ToolCall, escape bool) error {
	sb.WriteString("\n\n<" + DSMLToken + "tool_calls>\n")
	for i, tc := range calls {
		if i > 0 {
			sb.WriteByte('\n')
		}
		sb.WriteString("<" + DSMLToken + "invoke name=\"")
		writeAttr(sb, tc.Name, escape)
		sb.WriteString("\">\n")
		if err := appendArguments(sb, tc.Arguments, escape); err != nil {
			return fmt.Errorf("tool call %d (%s): %w", i, tc.Name, err)
		}
		sb.WriteString("\n</" + DSMLToken + "invoke>")
	}
	sb.WriteString("\n</" + DSMLToken + "tool_calls>")
	return nil
}

// appendArguments renders the parameters of one call, one per line.
func appendArguments(sb *strings.Builder, args string, escape bool) error {
	v, err := parsePyJSON([]byte(args))
	if err != nil {
		// The official encoder wraps text it cannot parse as JSON.
		writeParam(sb, "arguments", true, args, escape)
		return nil
	}
	if v.kind != pyObject {
		return fmt.Errorf("%w: arguments are a JSON %s, not an object", ErrBadJSON, kindName(v.kind))
	}
	for i, key := range v.keys {
		if i > 0 {
			sb.WriteByte('\n')
		}
		item := v.items[i]
		if item.kind == pyString {
			writeParam(sb, key, true, item.text, escape)
			continue
		}
		s, err := pyDumps(item)
		if err != nil {
			return fmt.Errorf("%w: argument %q: %w", ErrBadJSON, key, err)
		}
		writeParam(sb, key, false, s, escape)
	}
	return nil
}

const paramClose = "</" + DSMLToken + "parameter>"

func writeParam(sb *strings.Builder, name string, isString bool, value string, escape bool) {
	sb.WriteString("<" + DSMLToken + "parameter name=\"")
	writeAttr(sb, name, escape)
	if isString {
		sb.WriteString("\" string=\"true\">")
	} else {
		sb.WriteString("\" string=\"false\">")
	}
	switch {
	case !escape:
		sb.WriteString(value)
	case isString:
		sb.WriteString(escapeClosing(value, paramClose, "&lt;"))
	default:
		sb.WriteString(escapeClosing(value, paramClose, `\u003c`))
	}
	sb.WriteString(paramClose)
}

// writeAttr writes an attribute value, entity-escaped when escape is set.
func writeAttr(sb *strings.Builder, s string, escape bool) {
	if !escape {
		sb.WriteString(s)
		return
	}
	attrEscaper.WriteString(sb, s)
}

var attrEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;")

// escapeClosing replaces the '<' of every occurrence of tag in s by lt.
func escapeClosing(s, tag, lt string) string {
	if !strings.Contains(s, tag) {
		return s
	}
	return strings.ReplaceAll(s, tag, lt+tag[1:])
}

func kindName(k pyKind) string {
	switch k {
	case pyNull:
		return "null"
	case pyBool:
		return "boolean"
	case pyNumber:
		return "number"
	case pyString:
		return "string"
	case pyArray:
		return "array"
	}
	return "object"
}

// pyTruthy reports whether Python would treat the parsed value as true.
func pyTruthy(v pyValue) bool {
	switch v.kind {
	case pyNull:
		return false
	case pyBool:
		return v.b
	case pyNumber:
		s, err := pyNumberRepr(v.text)
		return err == nil && s != "0" && s != "0.0" && s != "-0.0"
	case pyString:
		return v.text != ""
	}
	return len(v.items) > 0
}
