// Command ds4 runs DeepSeek V4 Flash from the command line: a one-shot
// answer (-p), an interactive chat (no -p) or a token dump (--dump-tokens).
// See docs/cli.md and package ds4go/cli.
package main

import (
	"os"

	"ds4go/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], cli.Env{}))
}
