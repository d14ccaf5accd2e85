// Command ds4-gguf inspects, validates, synthesises and converts DeepSeek V4
// (DS4) GGUF files.
//
//	ds4-gguf inspect FILE [--json] [--kv-max N]
//	ds4-gguf validate FILE [--scan]
//	ds4-gguf synth -o FILE [--tiny | --flash-q2 | --flash-q4] [flags]
//	ds4-gguf convert ...
//
// Run "ds4-gguf COMMAND -h" for each command's flags.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

const usage = `usage: ds4-gguf COMMAND [flags] [args]

commands:
  inspect FILE     print the metadata, the tensor table and a DS4 summary
  validate FILE    load a DS4 file as the engine does and report problems
  synth -o FILE    write a DS4-layout file with random weights
  convert ...      convert a checkpoint to a DS4 GGUF file

Run "ds4-gguf COMMAND -h" for a command's flags.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches a command line and returns the process exit code.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch cmd, rest := args[0], args[1:]; cmd {
	case "inspect":
		err = runInspect(rest, stdout, stderr)
	case "validate":
		err = runValidate(rest, stdout, stderr)
	case "synth":
		err = runSynth(rest, stdout, stderr)
	case "convert":
		err = runConvert(rest)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "ds4-gguf: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2 // the flag package has printed the problem and the usage
	}
	fmt.Fprintf(stderr, "ds4-gguf %s: %v\n", args[0], err)
	return 1
}

// errUsage marks a command-line error already reported with the usage text.
var errUsage = errors.New("usage error")

// newFlagSet returns a flag set that prints its usage (a synopsis and the
// flags) to stderr and returns errors instead of exiting.
func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: ds4-gguf %s\n\nflags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses flags that may come before or after the positional
// arguments ("inspect FILE --json" and "inspect --json FILE" both work).
func parseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, errUsage
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// usageError reports a command-line problem with the flag set's usage.
func usageError(fs *flag.FlagSet, format string, args ...any) error {
	fmt.Fprintf(fs.Output(), format+"\n", args...)
	fs.Usage()
	return errUsage
}
