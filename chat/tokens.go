// Package chat renders conversations into the exact DeepSeek V4 prompt text
// produced by the official encoder (encoding_dsv4.py, published with the
// model). The result is a string that contains the protocol's special-token
// strings; a tokenizer turns it into ids.
//
// The subpackage chat/dsml parses what the model generates back into visible
// text, reasoning and tool calls.
//
// See docs/chat.md for the format, the modes and where each fact comes from.
package chat

// Special-token strings of the DeepSeek V4 chat protocol.
const (
	// BOS begins every rendered conversation.
	BOS = "<｜begin▁of▁sentence｜>"
	// EOS ends every completed assistant turn.
	EOS = "<｜end▁of▁sentence｜>"
	// UserToken opens a user turn (and a developer turn, and tool results).
	UserToken = "<｜User｜>"
	// AssistantToken opens an assistant turn.
	AssistantToken = "<｜Assistant｜>"
	// LatestReminderToken opens a latest_reminder message.
	LatestReminderToken = "<｜latest_reminder｜>"
	// ThinkStart opens a reasoning block.
	ThinkStart = "<think>"
	// ThinkEnd closes a reasoning block; a non-thinking turn starts with it.
	ThinkEnd = "</think>"
	// DSMLToken is the marker inside DSML tags such as <｜DSML｜invoke>.
	DSMLToken = "｜DSML｜"
)

// ReasoningEffortMaxPrefix is the text the official encoder puts right after
// BOS when reasoning_effort is "max" in thinking mode (Think-Max).
const ReasoningEffortMaxPrefix = "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n" +
	"You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n" +
	"Explicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n"

// ThinkMaxMinContext is the smallest context size (in tokens) at which
// Think-Max is honoured; below it ds4 falls back to plain thinking. ds4.c
// uses 393216 (384K).
const ThinkMaxMinContext = 393216
