// Package progress makes the commands' progress bars
// (github.com/schollz/progressbar), so that loading, prefill and scoring
// bars look and behave alike.
package progress

import (
	"fmt"
	"io"
	"time"

	"github.com/schollz/progressbar/v3"
)

// throttle bounds how often a bar redraws.
const throttle = 100 * time.Millisecond

// Bytes returns a bar on w counting total bytes (loading, uploading); it
// clears itself when finished.
func Bytes(w io.Writer, total int64, what string) *progressbar.ProgressBar {
	return progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(what),
		progressbar.OptionShowBytes(true),
		progressbar.OptionThrottle(throttle),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }),
		progressbar.OptionClearOnFinish(),
	)
}

// Tokens returns a bar on w counting total tokens with their rate. keep
// leaves the finished bar on screen (a report's last line); otherwise it
// clears itself.
func Tokens(w io.Writer, total int, what string, keep bool) *progressbar.ProgressBar {
	opts := []progressbar.Option{
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(what),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("tok"),
		progressbar.OptionThrottle(throttle),
	}
	if keep {
		opts = append(opts, progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }))
	} else {
		opts = append(opts, progressbar.OptionClearOnFinish())
	}
	return progressbar.NewOptions(total, opts...)
}
