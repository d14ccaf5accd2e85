package server

import (
	"container/list"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"sync"

	"ds4go/kvdisk"
)

// Tool-memory bounds (ds4's defaults).
const (
	DefaultToolMemoryMaxIDs   = 100000
	DefaultToolMemoryMaxBytes = 512 << 20
)

// toolMemory maps tool-call ids to the exact DSML block the model sampled,
// so that when a client sends the calls back as JSON the prompt re-renders
// byte for byte (and the live KV prefix still matches). It is an LRU bounded
// by id count and bytes; the oldest ids are pruned first.
type toolMemory struct {
	mu       sync.Mutex
	maxIDs   int
	maxBytes int
	bytes    int
	ll       *list.List // front = most recent
	m        map[string]*list.Element
	disabled bool
}

type toolMemEntry struct {
	id     string
	block  string
	ncalls int // calls in the block
}

func newToolMemory(maxIDs, maxBytes int, disabled bool) *toolMemory {
	if maxIDs <= 0 {
		maxIDs = DefaultToolMemoryMaxIDs
	}
	if maxBytes <= 0 {
		maxBytes = DefaultToolMemoryMaxBytes
	}
	return &toolMemory{maxIDs: maxIDs, maxBytes: maxBytes, ll: list.New(), m: map[string]*list.Element{}, disabled: disabled}
}

// put remembers block (which holds ncalls calls) for id.
func (t *toolMemory) put(id, block string, ncalls int) {
	if t.disabled || id == "" || block == "" {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if el, ok := t.m[id]; ok {
		e := el.Value.(*toolMemEntry)
		t.bytes += len(block) - len(e.block)
		e.block, e.ncalls = block, ncalls
		t.ll.MoveToFront(el)
	} else {
		t.m[id] = t.ll.PushFront(&toolMemEntry{id: id, block: block, ncalls: ncalls})
		t.bytes += len(id) + len(block)
	}
	for t.ll.Len() > t.maxIDs || (t.bytes > t.maxBytes && t.ll.Len() > 1) {
		el := t.ll.Back()
		e := el.Value.(*toolMemEntry)
		t.ll.Remove(el)
		delete(t.m, e.id)
		t.bytes -= len(e.id) + len(e.block)
	}
}

// get returns the block for id and its number of calls.
func (t *toolMemory) get(id string) (string, int, bool) {
	if t.disabled || id == "" {
		return "", 0, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	el, ok := t.m[id]
	if !ok {
		return "", 0, false
	}
	t.ll.MoveToFront(el)
	e := el.Value.(*toolMemEntry)
	return e.block, e.ncalls, true
}

func (t *toolMemory) has(id string) bool {
	if t.disabled {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.m[id]
	return ok
}

// mappingsIn returns the remembered ids whose DSML block occurs in text
// (what a disk checkpoint of that text stores in its KTM section).
func (t *toolMemory) mappingsIn(text string) []kvdisk.ToolMapping {
	if t.disabled {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []kvdisk.ToolMapping
	for el := t.ll.Back(); el != nil; el = el.Prev() {
		e := el.Value.(*toolMemEntry)
		if strings.Contains(text, e.block) {
			out = append(out, kvdisk.ToolMapping{ID: e.id, DSML: e.block})
		}
	}
	return out
}

func (t *toolMemory) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ll.Len()
}

// newToolID returns an unguessable id: "call_" (OpenAI) or "toolu_"
// (Anthropic) and 32 hex digits.
func newToolID(api apiKind) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	prefix := "call_"
	if api == apiMessages {
		prefix = "toolu_"
	}
	return prefix + hex.EncodeToString(b[:])
}

// randomID returns prefix and 24 hex digits (Responses item ids).
func randomID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
