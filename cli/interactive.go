package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/peterh/liner"

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

// errPromptInterrupted is returned by a lineReader when Ctrl+C is pressed
// at the prompt.
var errPromptInterrupted = errors.New("interrupted at the prompt")

// lineReader reads the user's lines: with line editing and history on a
// terminal (liner), plain lines otherwise (pipes, tests).
type lineReader interface {
	// ReadLine shows prompt and returns the next line (without its
	// newline), io.EOF at the end of input, or errPromptInterrupted.
	ReadLine(prompt string) (string, error)
	Close()
}

// plainReader reads lines from a reader in a goroutine, so an interrupt
// can end the wait.
type plainReader struct {
	out   io.Writer
	lines chan string
	intr  <-chan struct{}
}

func newPlainReader(in io.Reader, out io.Writer, intr <-chan struct{}) *plainReader {
	p := &plainReader{out: out, lines: make(chan string), intr: intr}
	go func() {
		defer close(p.lines)
		r := bufio.NewReader(in)
		for {
			s, err := r.ReadString('\n')
			if s != "" || err == nil {
				p.lines <- strings.TrimRight(s, "\r\n")
			}
			if err != nil {
				return
			}
		}
	}()
	return p
}

func (p *plainReader) ReadLine(prompt string) (string, error) {
	fmt.Fprint(p.out, prompt)
	select {
	case s, ok := <-p.lines:
		if !ok {
			return "", io.EOF
		}
		return s, nil
	case <-p.intr:
		return "", errPromptInterrupted
	}
}

func (p *plainReader) Close() {}

// linerReader edits lines on the terminal (arrows, Ctrl+A/E/W/R, history
// search) and keeps a history file.
type linerReader struct {
	st      *liner.State
	history string
}

// maxHistory bounds the history kept in the file.
const maxHistory = 1000

func newLinerReader(history string) *linerReader {
	st := liner.NewLiner()
	st.SetCtrlCAborts(true)
	st.SetMultiLineMode(true)
	st.SetTabCompletionStyle(liner.TabPrints)
	st.SetCompleter(completeCommand)
	l := &linerReader{st: st, history: history}
	if history != "" {
		if f, err := os.Open(history); err == nil {
			st.ReadHistory(f)
			f.Close()
		}
	}
	return l
}

func (l *linerReader) ReadLine(prompt string) (string, error) {
	s, err := l.st.Prompt(prompt)
	switch {
	case errors.Is(err, liner.ErrPromptAborted):
		return "", errPromptInterrupted
	case err != nil:
		return "", err
	}
	if strings.TrimSpace(s) != "" {
		l.st.AppendHistory(s)
	}
	return s, nil
}

// Close saves the history and gives the terminal back its mode.
func (l *linerReader) Close() {
	if l.history != "" {
		if err := writeFileAtomic(l.history, func(w io.Writer) error {
			_, err := l.st.WriteHistory(w)
			return err
		}); err != nil {
			fmt.Fprintln(os.Stderr, "ds4: history not saved:", err)
		}
	}
	l.st.Close()
}

// commands lists the interactive commands (for tab completion).
var commands = []string{"/help", "/think", "/think-max", "/nothink", "/ctx ", "/read ", "/quit", "/exit"}

func completeCommand(line string) []string {
	if !strings.HasPrefix(line, "/") {
		return nil
	}
	var out []string
	for _, c := range commands {
		if strings.HasPrefix(c, line) {
			out = append(out, c)
		}
	}
	return out
}

// historyPath returns where the line history is kept: $DS4_HISTORY if set
// ("" there disables it), else ~/.ds4_history.
func historyPath() string {
	if p, ok := os.LookupEnv("DS4_HISTORY"); ok {
		return p
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".ds4_history")
}

// interactive runs the chat loop: line editing and history when stdin and
// stdout are the process's terminal, plain line reading otherwise.
func interactive(c *Chat, env Env) int {
	var lr lineReader
	if env.Stdin == io.Reader(os.Stdin) && env.Stdout == io.Writer(os.Stdout) && isTerminal(os.Stdin) && isTerminal(os.Stdout) {
		lr = newLinerReader(historyPath())
	} else {
		lr = newPlainReader(env.Stdin, env.Stdout, env.Interrupts)
	}
	defer lr.Close()
	fmt.Fprintf(env.Stderr, "ds4: model %s, context %d tokens, mode %s; /help for commands\n", c.m.Name, c.ctxSize, modeName(c.mode))
	for {
		// An interrupt that arrived after the last answer ended is stale.
		select {
		case <-env.Interrupts:
		default:
		}
		line, err := lr.ReadLine("ds4> ")
		switch {
		case errors.Is(err, errPromptInterrupted):
			fmt.Fprintln(env.Stdout)
			return 130
		case err != nil:
			fmt.Fprintln(env.Stdout)
			return 0
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
