package server

import (
	"errors"
	"slices"
	"strings"

	"ds4go/chat"
)

// liveFrontier describes the live session right after a turn that ended in
// tool calls: which API made it, the call ids in order, and the session
// length at that point. A Responses or Anthropic request whose trailing tool
// results answer exactly those calls continues from the live KV (hidden
// reasoning and exact DSML included) by appending only the results.
type liveFrontier struct {
	api    apiKind
	ids    []string
	tokens int
}

// attachToolMemory replaces the JSON tool calls of assistant turns with the
// exact sampled DSML when every call id of the turn maps to the same
// remembered block. It returns how many turns were replayed exactly and how
// many fell back to canonical rendering.
func attachToolMemory(mem *toolMemory, msgs []chat.Message) (exact, canonical int) {
	for i := range msgs {
		m := &msgs[i]
		if m.Role != chat.RoleAssistant || len(m.ToolCalls) == 0 || m.RawToolCalls != "" {
			continue
		}
		block, ok := "", true
		for _, tc := range m.ToolCalls {
			b, n, found := mem.get(tc.ID)
			if !found || n != len(m.ToolCalls) || (block != "" && b != block) {
				ok = false
				break
			}
			block = b
		}
		if ok && block != "" {
			m.RawToolCalls = block
			exact++
		} else {
			canonical++
		}
	}
	return exact, canonical
}

// toolContext reports whether the conversation involves tools (ds4 keeps
// earlier reasoning then, not only when schemas are present).
func toolContext(c *chat.Conversation) bool {
	if len(c.Tools) > 0 {
		return true
	}
	for _, m := range c.Messages {
		if m.Role == chat.RoleTool || (m.Role == chat.RoleAssistant && len(m.ToolCalls) > 0) {
			return true
		}
	}
	return false
}

// renderOptions are the chat options the server renders with.
func renderOptions(r *genRequest, ctxSize int) chat.Options {
	return chat.Options{
		Mode:          r.mode,
		ContextSize:   ctxSize,
		EscapeDSML:    true,
		KeepReasoning: toolContext(&r.conv),
	}
}

// priorCall reports whether an assistant message before index i made a
// call with this id.
func priorCall(msgs []chat.Message, i int, id string) bool {
	for j := i - 1; j >= 0; j-- {
		if msgs[j].Role != chat.RoleAssistant {
			continue
		}
		for _, tc := range msgs[j].ToolCalls {
			if tc.ID == id {
				return true
			}
		}
	}
	return false
}

// validateToolResults checks Responses function_call_output and Anthropic
// tool_result ids: each must answer a call replayed in the same request or
// one the live session just made. Results known only live mark the request
// as needing live state.
func validateToolResults(r *genRequest, live *liveFrontier) *apiError {
	if r.api != apiResponses && r.api != apiMessages {
		return nil
	}
	msgs := r.conv.Messages
	for i, m := range msgs {
		if m.Role != chat.RoleTool || m.ToolCallID == "" {
			continue
		}
		prior := priorCall(msgs, i, m.ToolCallID)
		isLive := live != nil && live.api == r.api && slices.Contains(live.ids, m.ToolCallID)
		if !prior && !isLive {
			if r.api == apiResponses {
				return badRequest("Responses continuation state is not available for call_id %s; retry by replaying the full input history", m.ToolCallID)
			}
			return badRequest("Anthropic continuation state is not available for tool_use_id %s; retry by replaying the full messages history", m.ToolCallID)
		}
		if !prior {
			r.needsLive = true
		}
		if prior && r.api == apiResponses && r.mode.Thinking() {
			// A stateless replay of a tool turn in thinking mode should carry
			// the reasoning that led to the call; without it the prompt is
			// lower fidelity (rendered from the visible transcript).
			for j := i - 1; j >= 0; j-- {
				if msgs[j].Role == chat.RoleAssistant && slices.ContainsFunc(msgs[j].ToolCalls, func(tc chat.ToolCall) bool { return tc.ID == m.ToolCallID }) {
					if msgs[j].Reasoning == "" {
						r.replayNoRs = true
					}
					break
				}
			}
		}
	}
	return nil
}

// liveTail renders the text to append to the live session for a request
// whose trailing tool results answer the live frontier's calls: the
// assistant turn's EOS, one user turn with the results (ordered like the
// calls, text blocks kept in place, "\n\n" between blocks, as chat.Render
// merges them) and the next assistant opening. It returns "" when the
// request's tail does not answer exactly the live calls.
func liveTail(r *genRequest, live *liveFrontier) (string, []string) {
	if live == nil || live.api != r.api || (r.api != apiResponses && r.api != apiMessages) {
		return "", nil
	}
	msgs := r.conv.Messages
	start := len(msgs)
	for start > 0 && (msgs[start-1].Role == chat.RoleTool || msgs[start-1].Role == chat.RoleUser) {
		start--
	}
	tail := msgs[start:]
	var ids []string
	for _, m := range tail {
		if m.Role == chat.RoleTool {
			if !slices.Contains(live.ids, m.ToolCallID) || slices.Contains(ids, m.ToolCallID) {
				return "", nil
			}
			ids = append(ids, m.ToolCallID)
		}
	}
	if len(ids) == 0 {
		return "", nil
	}
	// The results must follow the live calls directly: no user text before
	// the first result (that would be a new user turn, not tool output).
	if tail[0].Role != chat.RoleTool {
		return "", nil
	}
	// Order tool results like the calls (stable), text blocks stay put.
	results := make([]chat.Message, 0, len(ids))
	for _, m := range tail {
		if m.Role == chat.RoleTool {
			results = append(results, m)
		}
	}
	order := func(id string) int { return slices.Index(live.ids, id) }
	slices.SortStableFunc(results, func(a, b chat.Message) int { return order(a.ToolCallID) - order(b.ToolCallID) })
	var sb strings.Builder
	sb.WriteString(chat.EOS)
	sb.WriteString(chat.UserToken)
	k := 0
	for j, m := range tail {
		if j > 0 {
			sb.WriteString("\n\n")
		}
		if m.Role == chat.RoleTool {
			m = results[k]
			k++
			sb.WriteString("<tool_result>")
			sb.WriteString(strings.ReplaceAll(m.Content, "</tool_result>", "&lt;/tool_result>"))
			sb.WriteString("</tool_result>")
		} else {
			sb.WriteString(m.Content)
		}
	}
	sb.WriteString(chat.AssistantToken)
	if r.mode.Thinking() {
		sb.WriteString(chat.ThinkStart)
	} else {
		sb.WriteString(chat.ThinkEnd)
	}
	return sb.String(), ids
}

// prepare validates tool results against the live state, restores exact
// DSML, renders and tokenizes the prompt, and works out a live-tail
// continuation when one applies.
func (s *Server) prepare(r *genRequest) *apiError {
	live := s.sched.frontier()
	if e := validateToolResults(r, live); e != nil {
		return e
	}
	r.conv.Messages = hoistSystem(r.conv.Messages)
	exact, canonical := attachToolMemory(s.toolMem, r.conv.Messages)
	if exact+canonical > 0 {
		s.metrics.toolReplay.WithLabelValues("exact").Add(float64(exact))
		s.metrics.toolReplay.WithLabelValues("canonical").Add(float64(canonical))
	}
	text, err := renderPrompt(r, s.ctxSize)
	if err != nil {
		msg := err.Error()
		if errors.Is(err, chat.ErrBadJSON) || errors.Is(err, chat.ErrBadMessage) {
			msg = strings.TrimPrefix(msg, "chat: ")
		}
		return badRequest("cannot render the conversation: %s", msg)
	}
	r.promptText = text
	r.promptTokens = s.tok.EncodeWithSpecial(text)
	if tail, ids := liveTail(r, live); tail != "" {
		r.liveTail, r.liveIDs = tail, ids
	} else if r.needsLive {
		return &apiError{status: 409, typ: "invalid_request_error",
			msg: "continuation state is not available; retry by replaying the full history"}
	}
	return nil
}

// renderPrompt renders a request's conversation as the server does.
func renderPrompt(r *genRequest, ctxSize int) (string, error) {
	return chat.Render(r.conv, renderOptions(r, ctxSize))
}

// hoistSystem moves every system message to the front, joined by "\n\n",
// as ds4 does: the official template has no role marker for system text, so
// a system message in the middle of a conversation would otherwise be glued
// to the previous turn.
func hoistSystem(msgs []chat.Message) []chat.Message {
	n, first := 0, -1
	for i, m := range msgs {
		if m.Role == chat.RoleSystem {
			n++
			if first < 0 {
				first = i
			}
		}
	}
	if n == 0 || (n == 1 && first == 0) {
		return msgs
	}
	var parts []string
	out := make([]chat.Message, 1, len(msgs)-n+1)
	for _, m := range msgs {
		if m.Role == chat.RoleSystem {
			if m.Content != "" {
				parts = append(parts, m.Content)
			}
			continue
		}
		out = append(out, m)
	}
	out[0] = chat.Message{Role: chat.RoleSystem, Content: strings.Join(parts, "\n\n")}
	return out
}
