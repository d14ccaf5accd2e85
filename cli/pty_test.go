//go:build linux

package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// TestMain lets the test binary run ds4 itself (for the pseudo-terminal
// test): DS4_CLI_MAIN=1 runs Main on the arguments in DS4_CLI_ARGS.
func TestMain(m *testing.M) {
	if os.Getenv("DS4_CLI_MAIN") == "1" {
		os.Exit(Main(strings.Split(os.Getenv("DS4_CLI_ARGS"), "\x1f"), Env{}))
	}
	os.Exit(m.Run())
}

func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals: %v", err)
	}
	var unlock int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		m.Close()
		t.Skipf("unlockpt: %v", e)
	}
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		m.Close()
		t.Skipf("ptsname: %v", e)
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(int(n)), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		t.Skipf("open pts: %v", err)
	}
	// A terminal of 120×40 (a new pty has 0×0, too narrow for editing).
	ws := [4]uint16{40, 120, 0, 0}
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCSWINSZ, uintptr(unsafe.Pointer(&ws))); e != 0 {
		t.Logf("TIOCSWINSZ: %v", e)
	}
	return m, s
}

// TestPTYSession drives ds4 as a person would, in a pseudo-terminal: a turn
// interrupted with Ctrl+C mid-generation, /nothink, another turn on the same
// session, a line edited with backspace, one recalled from the history with
// Up, then Ctrl+D; the history file holds the lines.
func TestPTYSession(t *testing.T) {
	master, slave := openPTY(t)
	defer master.Close()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	history := filepath.Join(t.TempDir(), "history")
	cmd.Env = append(os.Environ(), "DS4_CLI_MAIN=1", "DS4_HISTORY="+history, "TERM=xterm",
		"DS4_CLI_ARGS="+strings.Join([]string{"--demo", "--temp", "0", "-n", "600"}, "\x1f"))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
		}
	}()

	var mu sync.Mutex
	var out strings.Builder
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			mu.Lock()
			out.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	snapshot := func() string { mu.Lock(); defer mu.Unlock(); return out.String() }
	// waitFor waits until the output after byte from contains s, returns
	// where it ends.
	waitFor := func(from int, s string) int {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			o := snapshot()
			if i := strings.Index(o[min(from, len(o)):], s); i >= 0 {
				return from + i + len(s)
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatalf("no %q in the output after byte %d:\n%s", s, from, snapshot())
		return 0
	}
	send := func(s string) {
		if _, err := master.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}

	at := waitFor(0, "ds4> ")
	send("/nothink\n")
	at = waitFor(at, "mode: nothink")
	at = waitFor(at, "ds4> ")
	send("hello\n") // greedy: about 2300 tokens before EOS, so it stops at -n 600
	at = waitFor(at, "hello")
	at = waitFor(at, "\n")
	for start := time.Now(); len(snapshot()) < at+16; { // the answer has started
		if time.Since(start) > time.Minute {
			t.Fatalf("no answer:\n%s", snapshot())
		}
		time.Sleep(time.Millisecond)
	}
	send("\x03") // Ctrl+C
	at = waitFor(at, "ds4: interrupted")
	at = waitFor(at, "stop: interrupted")
	at = waitFor(at, "ds4> ")
	send("and another\n")
	at = waitFor(at, "stop: ")
	at = waitFor(at, "ds4> ")
	// Line editing: two backspaces turn "/ctx 99" into "/ctx " before 512.
	send("/ctx 99\x7f\x7f512\n")
	at = waitFor(at, "context: 512 tokens")
	at = waitFor(at, "ds4> ")
	// History: Up recalls the last line.
	send("\x1b[A\n")
	at = waitFor(at, "context: 512 tokens")
	waitFor(at, "ds4> ")
	send("\x04") // Ctrl+D
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, snapshot())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("ds4 did not exit:\n%s", snapshot())
	}
	h, err := os.ReadFile(history)
	if err != nil {
		t.Fatal(err)
	}
	want := "/nothink\nhello\nand another\n/ctx 512\n" // a repeated line is kept once
	if string(h) != want {
		t.Errorf("history file %q, want %q", h, want)
	}
}
