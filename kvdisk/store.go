package kvdisk

import (
	"bufio"
	"crypto/rand"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Defaults (ds4's).
const (
	// DefaultBudgetMB is the disk budget when none is given.
	DefaultBudgetMB = 4096
)

// Options configure a Store.
type Options struct {
	// Dir holds the cache files (created if missing).
	Dir string
	// BudgetBytes bounds the total size of the files (DefaultBudgetMB MiB
	// when ≤ 0); the least recently used files are removed beyond it.
	BudgetBytes int64
	// Logger receives one line per hit, save, eviction and skipped file
	// (slog.Default() when nil).
	Logger *slog.Logger
	// Now is the clock (time.Now when nil); for tests.
	Now func() time.Time
}

// Entry describes one cache file.
type Entry struct {
	// Name is the hex SHA1 of the rendered text (the file name without ".kv").
	Name      string
	Path      string
	Header    Header
	TextBytes int
	// Size is the file size in bytes.
	Size int64
	// Unusable is set when the engine rejected the file's payload (another
	// model shape): Lookup skips it; it stays on disk and in the budget.
	Unusable bool
	use      uint64 // in-process recency (breaks ties of the 1 s clock)
}

// Store is a directory of cache files with an in-memory index. Its methods
// are safe for concurrent use; one server process should own a directory.
type Store struct {
	mu      sync.Mutex
	dir     string
	budget  int64
	log     *slog.Logger
	now     func() time.Time
	entries map[string]*Entry
	uses    uint64
}

const tmpPrefix = ".tmp-"

// Name returns the file name (without directory) for a rendered text.
func Name(text string) string {
	sum := sha1.Sum([]byte(text))
	return hex.EncodeToString(sum[:])
}

// Open opens (creating it if needed) a cache directory: it removes
// temporary files left by an interrupted write, indexes the files whose
// header is valid, removes the others with a log line, and enforces the
// budget.
func Open(o Options) (*Store, error) {
	if o.Dir == "" {
		return nil, errors.New("kvdisk: no directory")
	}
	if o.BudgetBytes <= 0 {
		o.BudgetBytes = DefaultBudgetMB << 20
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("kvdisk: create %s: %w", o.Dir, err)
	}
	s := &Store{dir: o.Dir, budget: o.BudgetBytes, log: o.Logger, now: o.Now, entries: map[string]*Entry{}}
	des, err := os.ReadDir(o.Dir)
	if err != nil {
		return nil, fmt.Errorf("kvdisk: read %s: %w", o.Dir, err)
	}
	for _, de := range des {
		n := de.Name()
		path := filepath.Join(o.Dir, n)
		if strings.HasPrefix(n, tmpPrefix) {
			if err := os.Remove(path); err == nil {
				s.log.Info("kv cache: removed an interrupted write", "file", path)
			}
			continue
		}
		name, ok := strings.CutSuffix(n, ".kv")
		if !ok || !isSHA1Hex(name) || !de.Type().IsRegular() {
			continue
		}
		e, err := readEntry(path, name)
		if errors.Is(err, ErrVersion) {
			s.log.Warn("kv cache: ignoring a file of another format version (left on disk)", "file", path, "err", err)
			continue
		}
		if err != nil {
			s.log.Warn("kv cache: skipping invalid file", "file", path, "err", err)
			_ = os.Remove(path)
			continue
		}
		s.entries[name] = e
	}
	s.mu.Lock()
	s.evictLocked("")
	s.mu.Unlock()
	s.log.Info("kv cache: opened", "dir", o.Dir, "files", len(s.entries), "bytes", s.Usage(), "budget_bytes", s.budget)
	return s, nil
}

func isSHA1Hex(s string) bool {
	if len(s) != 40 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// readEntry reads a file's header and checks its lengths against the file
// size (the checksum is verified when it is loaded).
func readEntry(path, name string) (*Entry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	var b [HeaderSize + 4]byte
	if _, err := io.ReadFull(f, b[:]); err != nil {
		return nil, fmt.Errorf("%w: header: %w", ErrCorrupt, err)
	}
	h, err := parseHeader(b[:])
	if err != nil {
		return nil, err
	}
	tl := int64(binary.LittleEndian.Uint32(b[HeaderSize:]))
	need := int64(HeaderSize+4) + tl
	if h.PayloadBytes > uint64(st.Size()) || need+int64(h.PayloadBytes) > st.Size() {
		return nil, fmt.Errorf("%w: %d bytes, the header describes at least %d", ErrCorrupt, st.Size(), need+int64(h.PayloadBytes))
	}
	if h.Flags&FlagToolMap == 0 && need+int64(h.PayloadBytes) != st.Size() {
		return nil, fmt.Errorf("%w: %d bytes, the header describes %d", ErrCorrupt, st.Size(), need+int64(h.PayloadBytes))
	}
	if h.Tokens == 0 {
		return nil, fmt.Errorf("%w: no tokens", ErrCorrupt)
	}
	return &Entry{Name: name, Path: path, Header: h, TextBytes: int(tl), Size: st.Size()}, nil
}

// Dir returns the cache directory.
func (s *Store) Dir() string { return s.dir }

// Budget returns the byte budget.
func (s *Store) Budget() int64 { return s.budget }

// Usage returns the total size of the indexed files.
func (s *Store) Usage() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, e := range s.entries {
		n += e.Size
	}
	return n
}

// Entries returns a copy of the index, longest text first.
func (s *Store) Entries() []Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Entry, 0, len(s.entries))
	for _, e := range s.entries {
		out = append(out, *e)
	}
	slices.SortFunc(out, func(a, b Entry) int {
		if a.TextBytes != b.TextBytes {
			return b.TextBytes - a.TextBytes
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// Has reports whether a file for this rendered text exists.
func (s *Store) Has(text string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.entries[Name(text)]
	return ok
}

// Lookup returns the entries whose rendered text is a byte prefix of
// prompt and that accept allows, longest first (the caller loads the first
// one that works).
func (s *Store) Lookup(prompt string, accept func(*Entry) bool) []Entry {
	var out []Entry
	// Entries come longest first: hash each prefix length once.
	hashedLen, hash := -1, ""
	for _, e := range s.Entries() {
		if e.Unusable || e.TextBytes > len(prompt) || (accept != nil && !accept(&e)) {
			continue
		}
		if e.TextBytes != hashedLen {
			hashedLen, hash = e.TextBytes, Name(prompt[:e.TextBytes])
		}
		if hash == e.Name {
			out = append(out, e)
		}
	}
	return out
}

// Load reads and verifies an entry's file: checksum, lengths, and that its
// text hashes to its name and has the token count of the header's. A file
// that fails these checks (corrupt) is removed from disk and the index,
// with a log line.
func (s *Store) Load(e Entry) (*File, error) {
	b, err := os.ReadFile(e.Path)
	if err != nil {
		s.forget(e.Name)
		return nil, fmt.Errorf("kvdisk: %w", err)
	}
	f, err := Parse(b)
	if err == nil && Name(f.Text) != e.Name {
		err = fmt.Errorf("%w: text does not hash to the file name", ErrCorrupt)
	}
	if err != nil {
		s.Discard(e, err)
		return nil, err
	}
	return f, nil
}

// Reject marks an entry whose file is valid but unusable here (the engine
// rejected its payload: another model shape), logging why. The file stays
// on disk, for the model that wrote it, and in the space budget.
func (s *Store) Reject(e Entry, why error) {
	s.log.Warn("kv cache: ignoring a file this model cannot use (left on disk)", "file", e.Path, "err", why)
	s.mu.Lock()
	defer s.mu.Unlock()
	if x, ok := s.entries[e.Name]; ok {
		x.Unusable = true
	}
}

// Discard removes an entry's file after it turned out corrupt, logging why.
func (s *Store) Discard(e Entry, why error) {
	s.log.Warn("kv cache: ignoring unusable file", "file", e.Path, "err", why)
	_ = os.Remove(e.Path)
	s.forget(e.Name)
}

func (s *Store) forget(name string) {
	s.mu.Lock()
	delete(s.entries, name)
	s.mu.Unlock()
}

// Touch records a hit: hit count + 1 and last-used = now, written in place
// (bytes 12..15 and 32..39; the checksum does not cover them).
func (s *Store) Touch(e Entry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.entries[e.Name]
	if !ok {
		return fmt.Errorf("kvdisk: %s is not in the index", e.Name)
	}
	f, err := os.OpenFile(cur.Path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("kvdisk: touch: %w", err)
	}
	defer f.Close()
	hits := cur.Header.Hits + 1
	now := uint64(s.now().Unix())
	var b [8]byte
	binary.LittleEndian.PutUint32(b[:4], hits)
	if _, err := f.WriteAt(b[:4], 12); err != nil {
		return fmt.Errorf("kvdisk: touch: %w", err)
	}
	binary.LittleEndian.PutUint64(b[:], now)
	if _, err := f.WriteAt(b[:], 32); err != nil {
		return fmt.Errorf("kvdisk: touch: %w", err)
	}
	cur.Header.Hits, cur.Header.LastUsed = hits, now
	s.uses++
	cur.use = s.uses
	return nil
}

// Save writes a checkpoint for text: the header fields from h (Hits,
// LastUsed, Created, CRC and the flags are set here), the text, a payload
// of exactly payloadBytes written by writePayload, and the tool mappings
// (a KTM section when non-empty). The file is written to a temporary name,
// synced, renamed and the directory synced; then the budget is enforced
// (never removing the new file). A file that would not fit the budget is
// not written (nil entry, nil error). An existing file for the same text is
// replaced.
func (s *Store) Save(h Header, text string, payloadBytes int64, writePayload func(io.Writer) error, tools []ToolMapping) (*Entry, error) {
	if len(text) > maxText {
		return nil, fmt.Errorf("kvdisk: rendered text of %d bytes is too long", len(text))
	}
	var ktm []byte
	if len(tools) > 0 {
		ktm = appendKTM(nil, tools)
	}
	size := int64(HeaderSize+4+len(text)) + payloadBytes + int64(len(ktm))
	if size > s.budget {
		s.log.Info("kv cache: checkpoint larger than the budget, not saved", "tokens", h.Tokens, "bytes", size, "budget_bytes", s.budget)
		return nil, nil
	}
	now := uint64(s.now().Unix())
	h.Hits, h.LastUsed, h.Created, h.CRC = 0, now, now, 0
	h.Flags = FlagCRC
	if len(ktm) > 0 {
		h.Flags |= FlagToolMap
	}
	h.PayloadBytes = uint64(payloadBytes)
	name := Name(text)
	final := filepath.Join(s.dir, name+".kv")
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(s.dir, tmpPrefix+strconv.Itoa(os.Getpid())+"-"+hex.EncodeToString(rnd[:]))
	t0 := time.Now()
	if err := writeFile(tmp, h, text, payloadBytes, writePayload, ktm); err != nil {
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("kvdisk: write %s: %w", final, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("kvdisk: rename into %s: %w", final, err)
	}
	if d, err := os.Open(s.dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	e := &Entry{Name: name, Path: final, Header: h, TextBytes: len(text), Size: size}
	s.mu.Lock()
	s.uses++
	e.use = s.uses
	s.entries[name] = e
	s.evictLocked(name)
	s.mu.Unlock()
	s.log.Info("kv cache: saved", "reason", h.Reason.String(), "tokens", h.Tokens, "text_bytes", len(text),
		"bytes", size, "tools", len(tools), "ms", time.Since(t0).Milliseconds(), "file", final)
	return e, nil
}

// writeFile writes and syncs a complete cache file at path.
func writeFile(path string, h Header, text string, payloadBytes int64, writePayload func(io.Writer) error, ktm []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	var hb [HeaderSize + 4]byte
	h.put(hb[:])
	binary.LittleEndian.PutUint32(hb[HeaderSize:], uint32(len(text)))
	crc := &crcWriter{sum: crcHeader(hb[:])}
	bw := bufio.NewWriterSize(f, 1<<20)
	if _, err := bw.Write(hb[:]); err != nil {
		return err
	}
	body := io.MultiWriter(bw, crc)
	if _, err := crc.Write(hb[HeaderSize:]); err != nil {
		return err
	}
	if _, err := io.WriteString(body, text); err != nil {
		return err
	}
	cw := &countWriter{w: body}
	if err := writePayload(cw); err != nil {
		return fmt.Errorf("payload: %w", err)
	}
	if cw.n != payloadBytes {
		return fmt.Errorf("payload: wrote %d bytes, announced %d", cw.n, payloadBytes)
	}
	if _, err := body.Write(ktm); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	var cb [4]byte
	binary.LittleEndian.PutUint32(cb[:], crc.sum)
	if _, err := f.WriteAt(cb[:], 20); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	return f.Close()
}

type crcWriter struct{ sum uint32 }

func (c *crcWriter) Write(p []byte) (int, error) {
	c.sum = crc32.Update(c.sum, castagnoli, p)
	return len(p), nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// evictLocked removes least-recently-used files until the total fits the
// budget, never the protected one.
func (s *Store) evictLocked(protect string) {
	var total int64
	for _, e := range s.entries {
		total += e.Size
	}
	for total > s.budget {
		var victim *Entry
		for _, e := range s.entries {
			if e.Name == protect {
				continue
			}
			if victim == nil || older(e, victim) {
				victim = e
			}
		}
		if victim == nil {
			return
		}
		if err := os.Remove(victim.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("kv cache: eviction failed", "file", victim.Path, "err", err)
		}
		s.log.Info("kv cache: evicted", "reason", "disk-budget", "tokens", victim.Header.Tokens,
			"hits", victim.Header.Hits, "bytes", victim.Size, "file", victim.Path)
		delete(s.entries, victim.Name)
		total -= victim.Size
	}
}

// older orders entries by last use: the time, then the in-process order,
// then the name.
func older(a, b *Entry) bool {
	if la, lb := lastUse(a), lastUse(b); la != lb {
		return la < lb
	}
	if a.use != b.use {
		return a.use < b.use
	}
	return a.Name < b.Name
}

func lastUse(e *Entry) uint64 {
	if e.Header.LastUsed != 0 {
		return e.Header.LastUsed
	}
	return e.Header.Created
}

// ReadToolMap reads only the KTM section of an entry's file (it sits after
// the text and the payload, whose lengths the header gives). The section is
// auxiliary replay memory; the whole-file checksum is verified only when
// the checkpoint is loaded.
func ReadToolMap(e Entry) ([]ToolMapping, error) {
	if e.Header.Flags&FlagToolMap == 0 {
		return nil, nil
	}
	f, err := os.Open(e.Path)
	if err != nil {
		return nil, fmt.Errorf("kvdisk: %w", err)
	}
	defer f.Close()
	off := int64(HeaderSize+4+e.TextBytes) + int64(e.Header.PayloadBytes)
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("kvdisk: %w", err)
	}
	if off > st.Size() || st.Size()-off > 1<<30 {
		return nil, fmt.Errorf("%w: tool-id map at %d of a %d-byte file", ErrCorrupt, off, st.Size())
	}
	b := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(b, off); err != nil {
		return nil, fmt.Errorf("kvdisk: %w", err)
	}
	return parseKTM(b)
}
