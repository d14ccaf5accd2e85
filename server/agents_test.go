package server

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAgentCLIs runs the real agent CLIs (installed from npm, which ships
// their native binaries as optional dependencies) against the server on the
// fake engine: each is asked to "call" its shell tool, which DemoScript
// turns into a DSML tool call; the CLI runs the command and sends the
// result back, and the fake echoes it. Opt-in:
//
//	DS4_AGENTS=1 go test ./server -run TestAgentCLIs -v
//
// DS4_AGENTS_DIR names an npm prefix that already has the packages
// (otherwise they are installed into a temporary one).
func TestAgentCLIs(t *testing.T) {
	if os.Getenv("DS4_AGENTS") != "1" {
		t.Skip("set DS4_AGENTS=1 to run Claude Code, Codex CLI and opencode against the server")
	}
	dir := os.Getenv("DS4_AGENTS_DIR")
	if dir == "" {
		dir = t.TempDir()
		cmd := exec.Command("npm", "install", "--no-audit", "--no-fund", "--prefix", dir,
			"@anthropic-ai/claude-code", "@openai/codex", "opencode-ai")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Skipf("npm install failed: %v\n%s", err, out)
		}
	}
	find := func(parts ...string) string {
		matches, _ := filepath.Glob(filepath.Join(append([]string{dir, "node_modules"}, parts...)...))
		if len(matches) == 0 {
			return ""
		}
		return matches[0]
	}
	e := newEnv(t, DemoScript, func(_ *Config, f *FakeEngine) { f.Ctx = 200000 })
	home := t.TempDir()
	work := t.TempDir()
	run := func(t *testing.T, bin string, env []string, args ...string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Dir = work
		cmd.Env = append(os.Environ(), append([]string{"HOME=" + home}, env...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", filepath.Base(bin), err, out)
		}
		return string(out)
	}
	check := func(t *testing.T, out, marker string) {
		if !strings.Contains(out, "<tool_result>") || !strings.Contains(out, marker) {
			t.Fatalf("the tool did not run through the server:\n%s", out)
		}
		t.Logf("%s", out[max(0, len(out)-300):])
	}

	t.Run("claude", func(t *testing.T) {
		bin := find("@anthropic-ai", "claude-code-linux-*", "claude")
		if bin == "" {
			t.Skip("claude binary not installed")
		}
		out := run(t, bin, []string{"ANTHROPIC_BASE_URL=" + e.hs.URL, "ANTHROPIC_AUTH_TOKEN=dsv4-local", "ANTHROPIC_API_KEY=",
			"ANTHROPIC_MODEL=deepseek-v4-flash", "ANTHROPIC_DEFAULT_HAIKU_MODEL=deepseek-v4-flash",
			"ANTHROPIC_DEFAULT_SONNET_MODEL=deepseek-v4-flash", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1"},
			"-p", `call Bash {"command":"echo claude-ran-$((6*7))","description":"test"}`, "--allowedTools", "Bash")
		check(t, out, "claude-ran-42")
	})
	t.Run("codex", func(t *testing.T) {
		bin := find("@openai", "codex-linux-*", "vendor", "*", "bin", "codex")
		if bin == "" {
			t.Skip("codex binary not installed")
		}
		out := run(t, bin, nil, "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
			"-c", "model_provider=ds4", "-c", `model_providers.ds4={name="DS4",base_url="`+e.hs.URL+`/v1",wire_api="responses"}`,
			"--model", "deepseek-v4-flash", `call exec_command {"cmd":"echo codex-ran-$((6*7))"}`)
		check(t, out, "codex-ran-42")
	})
	t.Run("opencode", func(t *testing.T) {
		bin := find("opencode-linux-x64", "bin", "opencode")
		if bin == "" {
			t.Skip("opencode binary not installed")
		}
		cfg := `{"$schema":"https://opencode.ai/config.json","provider":{"ds4":{"name":"ds4go","npm":"@ai-sdk/openai-compatible",` +
			`"options":{"baseURL":"` + e.hs.URL + `/v1","apiKey":"dsv4-local"},"models":{"deepseek-v4-flash":{"name":"DeepSeek V4 Flash",` +
			`"limit":{"context":100000,"output":384000}}}}}}`
		if err := os.MkdirAll(filepath.Join(home, ".config", "opencode"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(home, ".config", "opencode", "opencode.json"), []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		out := run(t, bin, nil, "run", "--model", "ds4/deepseek-v4-flash", `call bash {"command":"echo opencode-ran-$((6*7))","description":"test"}`)
		check(t, out, "opencode-ran-42")
	})
}
