package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"ds4go/chat"
)

const helpText = `commands:
  /help          this text
  /think         thinking mode (reasoning before the answer)
  /think-max     Think-Max mode (needs a context of at least 393216 tokens, else plain thinking)
  /nothink       direct answers, no reasoning
  /ctx N         new context of N tokens (starts a new conversation)
  /read FILE     send the contents of FILE as your message
  /quit, /exit   leave (Ctrl+D too)
Ctrl+C stops the answer being generated; at the prompt it exits.
`

// interactive runs the chat loop over env.Stdin (plain line reading, no
// line editing or history yet).
func interactive(c *Chat, env Env) int {
	lines := make(chan string)
	go func() {
		defer close(lines)
		r := bufio.NewReader(env.Stdin)
		for {
			s, err := r.ReadString('\n')
			if s != "" || err == nil {
				lines <- strings.TrimRight(s, "\r\n")
			}
			if err != nil {
				return
			}
		}
	}()
	fmt.Fprintf(env.Stderr, "ds4: model %s, context %d tokens, mode %s; /help for commands\n", c.m.name, c.ctxSize, modeName(c.mode))
	for {
		fmt.Fprint(env.Stdout, "ds4> ")
		var line string
		select {
		case s, ok := <-lines:
			if !ok {
				fmt.Fprintln(env.Stdout)
				return 0
			}
			line = s
		case <-env.Interrupts:
			fmt.Fprintln(env.Stdout)
			return 130
		}
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if strings.HasPrefix(line, "/") {
			text, quit, err := c.command(line, env.Stdout)
			if err != nil {
				fmt.Fprintln(env.Stderr, "ds4:", err)
				continue
			}
			if quit {
				return 0
			}
			if text == "" {
				continue
			}
			line = text
		}
		ctx, stop := turnCtx(env.Interrupts)
		st, err := c.Turn(ctx, line)
		stop()
		if env.onTurn != nil {
			env.onTurn(c, st)
		}
		switch {
		case errors.Is(err, context.Canceled):
			fmt.Fprintln(env.Stderr, "ds4: interrupted during the prompt; the message was dropped")
		case err != nil:
			fmt.Fprintln(env.Stderr, "ds4:", err)
		default:
			if st.Stop == "interrupted" {
				fmt.Fprintln(env.Stderr, "ds4: interrupted")
			}
			st.print(env.Stderr)
		}
	}
}

func modeName(m chat.Mode) string {
	switch m {
	case chat.ModeChat:
		return "nothink"
	case chat.ModeThinkMax:
		return "think-max"
	}
	return "think"
}

// command runs a /command. It returns text to send as a user message
// (/read), or quit.
func (c *Chat) command(line string, out io.Writer) (text string, quit bool, err error) {
	name, arg, _ := strings.Cut(line, " ")
	arg = strings.TrimSpace(arg)
	switch name {
	case "/help", "/?":
		io.WriteString(out, helpText)
	case "/quit", "/exit", "/q":
		return "", true, nil
	case "/think":
		c.mode = chat.ModeThinking
		fmt.Fprintln(out, "mode: think")
	case "/nothink":
		c.mode = chat.ModeChat
		fmt.Fprintln(out, "mode: nothink")
	case "/think-max":
		c.mode = chat.ModeThinkMax
		if chat.EffectiveMode(c.mode, c.ctxSize) != chat.ModeThinkMax {
			fmt.Fprintf(out, "mode: think-max (context %d < %d: runs as plain thinking; /ctx %d to enable)\n", c.ctxSize, chat.ThinkMaxMinContext, chat.ThinkMaxMinContext)
		} else {
			fmt.Fprintln(out, "mode: think-max")
		}
	case "/ctx":
		n, perr := strconv.Atoi(arg)
		if perr != nil || n <= 0 {
			return "", false, fmt.Errorf("/ctx needs a positive number of tokens")
		}
		if err := c.setContext(n); err != nil {
			return "", false, err
		}
		fmt.Fprintf(out, "context: %d tokens (new conversation)\n", c.ctxSize)
	case "/read":
		if arg == "" {
			return "", false, fmt.Errorf("/read needs a file name")
		}
		b, rerr := os.ReadFile(arg)
		if rerr != nil {
			return "", false, rerr
		}
		if len(strings.TrimSpace(string(b))) == 0 {
			return "", false, fmt.Errorf("%s is empty", arg)
		}
		return string(b), false, nil
	default:
		return "", false, fmt.Errorf("unknown command %s (/help lists them)", name)
	}
	return "", false, nil
}
