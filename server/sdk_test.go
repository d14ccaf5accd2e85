package server

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	aoption "github.com/anthropics/anthropic-sdk-go/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/param"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"

	"ds4go/chat"
)

// agentScript behaves like a tiny agent model: with tools it calls bash,
// after a tool result it reports the result, otherwise it greets.
func agentScript(p string) string {
	var out string
	if strings.HasSuffix(p, chat.ThinkStart) {
		out = "Reasoning about it." + chat.ThinkEnd
	}
	u := LastUserText(p)
	if i := strings.LastIndex(u, "<tool_result>"); i >= 0 {
		res := u[i+len("<tool_result>"):]
		res, _, _ = strings.Cut(res, "</tool_result>")
		return out + "The tool said: " + res
	}
	if strings.Contains(p, "## Tools") {
		return out + "Calling." + bashCall
	}
	return out + "Hello from ds4go."
}

const testKey = "sk-test-key"

func sdkEnv(t *testing.T) *testEnv {
	return newEnv(t, agentScript, func(c *Config, _ *FakeEngine) { c.APIKey = testKey })
}

func openaiClient(e *testEnv) openai.Client {
	return openai.NewClient(option.WithBaseURL(e.hs.URL+"/v1"), option.WithAPIKey(testKey), option.WithMaxRetries(0))
}

func TestOpenAISDKChat(t *testing.T) {
	e := sdkEnv(t)
	c := openaiClient(e)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	resp, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:    ModelID,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be kind."), openai.UserMessage("Hi")},
	})
	if err != nil {
		t.Fatal(err)
	}
	msg := resp.Choices[0].Message
	if msg.Content != "Hello from ds4go." || resp.Choices[0].FinishReason != "stop" {
		t.Fatalf("reply: %+v", resp.Choices[0])
	}
	var reasoning string
	_ = json.Unmarshal([]byte(msg.JSON.ExtraFields["reasoning_content"].Raw()), &reasoning)
	if reasoning != "Reasoning about it." || resp.Usage.CompletionTokensDetails.ReasoningTokens == 0 {
		t.Fatalf("reasoning %q usage %+v", reasoning, resp.Usage)
	}

	// Streaming tool call, accumulated by the SDK, then the tool round trip.
	params := openai.ChatCompletionNewParams{
		Model:         AliasChat,
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("List files")},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		Tools: []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name: "bash", Description: openai.String("Run a shell command."),
			Parameters: shared.FunctionParameters{"type": "object", "properties": map[string]any{
				"command": map[string]any{"type": "string"}, "timeout": map[string]any{"type": "integer"}}},
		})},
	}
	stream := c.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	choice := acc.Choices[0]
	if choice.FinishReason != "tool_calls" || len(choice.Message.ToolCalls) != 1 {
		t.Fatalf("accumulated: %+v", choice)
	}
	call := choice.Message.ToolCalls[0]
	if call.Function.Name != "bash" || call.Function.Arguments != `{"command": "ls -la", "timeout": 30}` {
		t.Fatalf("call: %+v", call)
	}
	if acc.Usage.TotalTokens == 0 {
		t.Fatalf("no usage: %+v", acc.Usage)
	}
	first := acc.Usage.PromptTokens + acc.Usage.CompletionTokens

	params.Messages = append(params.Messages, choice.Message.ToParam(), openai.ToolMessage("file1 file2", call.ID))
	resp, err = c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Choices[0].Message.Content; got != "The tool said: file1 file2" {
		t.Fatalf("after tool: %q", got)
	}
	// Exact DSML replay: the whole previous turn is reused from the live KV.
	if cached := resp.Usage.PromptTokensDetails.CachedTokens; cached < int64(first) {
		t.Fatalf("cached %d < previous prompt+completion %d", cached, first)
	}
}

func TestOpenAISDKResponses(t *testing.T) {
	e := sdkEnv(t)
	c := openaiClient(e)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tools := []responses.ToolUnionParam{{OfFunction: &responses.FunctionToolParam{
		Name: "bash", Parameters: map[string]any{"type": "object", "properties": map[string]any{
			"command": map[string]any{"type": "string"}, "timeout": map[string]any{"type": "integer"}}},
	}}}
	params := responses.ResponseNewParams{
		Model:        ModelID,
		Instructions: openai.String("You are an agent."),
		Input:        responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{responses.ResponseInputItemParamOfMessage("List files", responses.EasyInputMessageRoleUser)}},
		Tools:        tools,
		Reasoning:    shared.ReasoningParam{Effort: shared.ReasoningEffortHigh, Summary: shared.ReasoningSummaryAuto},
		Include:      []responses.ResponseIncludable{responses.ResponseIncludableReasoningEncryptedContent},
	}
	stream := c.Responses.NewStreaming(ctx, params)
	var final responses.Response
	var deltaArgs string
	for stream.Next() {
		ev := stream.Current()
		switch ev.Type {
		case "response.function_call_arguments.delta":
			deltaArgs += ev.Delta
		case "response.completed":
			final = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if final.Status != "completed" || len(final.Output) != 3 {
		t.Fatalf("final: %s", final.RawJSON())
	}
	rs, msg, fc := final.Output[0], final.Output[1], final.Output[2]
	if rs.Type != "reasoning" || msg.Type != "message" || fc.Type != "function_call" || fc.Name != "bash" ||
		fc.Arguments.OfString != deltaArgs || deltaArgs != `{"command": "ls -la", "timeout": 30}` {
		t.Fatalf("output: %s", final.RawJSON())
	}
	// Stateless replay of the whole turn (reasoning item included) plus the
	// tool output.
	in := responses.ResponseInputParam{responses.ResponseInputItemParamOfMessage("List files", responses.EasyInputMessageRoleUser)}
	for _, it := range final.Output {
		in = append(in, param.Override[responses.ResponseInputItemUnionParam](json.RawMessage(it.RawJSON())))
	}
	out := responses.ResponseInputItemParamOfFunctionCallOutput("a.txt")
	out.OfFunctionCallOutput.CallID = openai.String(fc.CallID)
	in = append(in, out)
	params.Input = responses.ResponseNewParamsInputUnion{OfInputItemList: in}
	resp, err := c.Responses.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.OutputText(); got != "The tool said: a.txt" {
		t.Fatalf("after tool: %q (%s)", got, resp.RawJSON())
	}
	if resp.Usage.InputTokensDetails.CachedTokens == 0 {
		t.Fatalf("no reuse: %+v", resp.Usage)
	}
}

func TestAnthropicSDK(t *testing.T) {
	e := sdkEnv(t)
	c := anthropic.NewClient(aoption.WithBaseURL(e.hs.URL), aoption.WithAPIKey(testKey), aoption.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	msg, err := c.Messages.New(ctx, anthropic.MessageNewParams{
		Model: "deepseek-v4-flash", MaxTokens: 256,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Hi"))},
		Thinking: anthropic.ThinkingConfigParamOfEnabled(1024),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(msg.Content) != 2 || msg.Content[0].Type != "thinking" || msg.Content[0].Thinking != "Reasoning about it." ||
		msg.Content[1].Text != "Hello from ds4go." || msg.StopReason != "end_turn" {
		t.Fatalf("message: %s", msg.RawJSON())
	}

	params := anthropic.MessageNewParams{
		Model: "deepseek-v4-flash", MaxTokens: 256,
		System:   []anthropic.TextBlockParam{{Text: "x-anthropic-billing-header: cc_version=1"}, {Text: "You are Claude Code."}},
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("List files"))},
		Tools: []anthropic.ToolUnionParam{{OfTool: &anthropic.ToolParam{Name: "bash", Description: anthropic.String("Run."),
			InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{
				"command": map[string]any{"type": "string"}, "timeout": map[string]any{"type": "integer"}}}}}},
	}
	stream := c.Messages.NewStreaming(ctx, params)
	var acc anthropic.Message
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if acc.StopReason != "tool_use" || len(acc.Content) != 3 {
		t.Fatalf("streamed: %s", acc.RawJSON())
	}
	tu := acc.Content[2]
	if tu.Type != "tool_use" || tu.Name != "bash" || string(tu.Input) != `{"command": "ls -la", "timeout": 30}` {
		t.Fatalf("tool_use: %+v input %s", tu, tu.Input)
	}
	params.Messages = append(params.Messages, acc.ToParam(),
		anthropic.NewUserMessage(anthropic.NewToolResultBlock(tu.ID, "README.md", false)))
	msg, err = c.Messages.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Content[len(msg.Content)-1].Text != "The tool said: README.md" {
		t.Fatalf("after tool: %s", msg.RawJSON())
	}
	if msg.Usage.CacheReadInputTokens == 0 {
		t.Fatalf("no reuse: %s", msg.RawJSON())
	}

	// A wrong key is refused in Anthropic's error shape.
	bad := anthropic.NewClient(aoption.WithBaseURL(e.hs.URL), aoption.WithAPIKey("wrong"), aoption.WithMaxRetries(0))
	_, err = bad.Messages.New(ctx, params)
	var ae *anthropic.Error
	if err == nil || !asErr(err, &ae) || ae.StatusCode != 401 {
		t.Fatalf("bad key: %v", err)
	}
}
