package tokenizer

import "sync"

// BPE on one pre-tokenized piece: start from the byte tokens of the piece and
// repeatedly apply the merge of lowest rank among adjacent pairs, the leftmost
// one when several pairs have that rank, until no adjacent pair has a merge.
// This is Hugging Face's BPE model without dropout (its ignore_merges is off
// in the DeepSeek tokenizer.json, so a piece that is itself a token is still
// merged step by step).

// smallWord is the longest piece merged by the quadratic algorithm, which is
// the fastest for short pieces; longer ones use a heap.
const smallWord = 48

// Words of up to maxCachedWord bytes have their tokens cached; the cache is
// emptied when it reaches maxCacheEntries.
const (
	maxCachedWord   = 256
	maxCacheEntries = 1 << 16
)

// wordCache maps a piece to its tokens. It is safe for concurrent use.
type wordCache struct {
	mu sync.RWMutex
	m  map[string][]int32
}

func (c *wordCache) init() { c.m = make(map[string][]int32) }

func (c *wordCache) get(w string) ([]int32, bool) {
	c.mu.RLock()
	ids, ok := c.m[w]
	c.mu.RUnlock()
	return ids, ok
}

func (c *wordCache) put(w string, ids []int32) {
	c.mu.Lock()
	if len(c.m) >= maxCacheEntries {
		clear(c.m)
	}
	c.m[w] = ids
	c.mu.Unlock()
}

// appendWord appends the BPE tokens of one piece to dst.
func (t *Tokenizer) appendWord(dst []int32, w string) []int32 {
	switch {
	case len(w) == 0:
		return dst
	case len(w) == 1:
		return append(dst, t.byteTok[w[0]])
	case len(w) > maxCachedWord:
		return t.bpeHeap(dst, w)
	}
	if ids, ok := t.cache.get(w); ok {
		return append(dst, ids...)
	}
	start := len(dst)
	if len(w) <= smallWord {
		dst = t.bpeSmall(dst, w)
	} else {
		dst = t.bpeHeap(dst, w)
	}
	t.cache.put(w, append([]int32(nil), dst[start:]...))
	return dst
}

func (t *Tokenizer) lookupMerge(a, b int32) merge {
	if m, ok := t.merges[pairKey(a, b)]; ok {
		return m
	}
	return merge{rank: noRank, id: -1}
}

// bpeSmall merges a piece of at most smallWord bytes, keeping the rank of
// every adjacent pair in an array and scanning it for the minimum.
func (t *Tokenizer) bpeSmall(dst []int32, w string) []int32 {
	var symBuf [smallWord]int32
	var pairBuf [smallWord]merge
	syms := symBuf[:len(w)]
	for i := 0; i < len(w); i++ {
		syms[i] = t.byteTok[w[i]]
	}
	pairs := pairBuf[:len(w)-1]
	for i := range pairs {
		pairs[i] = t.lookupMerge(syms[i], syms[i+1])
	}
	for len(pairs) > 0 {
		best, bestRank := -1, int32(noRank)
		for i, p := range pairs {
			if p.rank < bestRank {
				best, bestRank = i, p.rank
			}
		}
		if best < 0 {
			break
		}
		syms[best] = pairs[best].id
		syms = append(syms[:best+1], syms[best+2:]...)
		pairs = append(pairs[:best], pairs[best+1:]...)
		if best > 0 {
			pairs[best-1] = t.lookupMerge(syms[best-1], syms[best])
		}
		if best < len(pairs) {
			pairs[best] = t.lookupMerge(syms[best], syms[best+1])
		}
	}
	return append(dst, syms...)
}

// pairItem is a candidate merge in bpeHeap: the pair of symbols left (at
// position pos) and right, which merge into id with the given rank.
type pairItem struct {
	rank, pos   int32
	left, right int32
	id          int32
}

func (a pairItem) less(b pairItem) bool {
	return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos)
}

// bpeHeap merges a piece of any length in O(n log n): the symbols form a
// linked list and candidate pairs wait in a min-heap ordered by (rank,
// position). A candidate is stale, and skipped, once either of its symbols
// has changed; a symbol only ever grows, so comparing ids suffices.
func (t *Tokenizer) bpeHeap(dst []int32, w string) []int32 {
	n := len(w)
	sym := make([]int32, n)
	next := make([]int32, n)
	prev := make([]int32, n)
	for i := 0; i < n; i++ {
		sym[i] = t.byteTok[w[i]]
		next[i] = int32(i + 1)
		prev[i] = int32(i - 1)
	}
	next[n-1] = -1
	h := make(pairHeap, 0, n)
	push := func(pos int32) {
		r := next[pos]
		if r < 0 {
			return
		}
		if m := t.lookupMerge(sym[pos], sym[r]); m.rank != noRank {
			h.push(pairItem{rank: m.rank, pos: pos, left: sym[pos], right: sym[r], id: m.id})
		}
	}
	for i := 0; i < n-1; i++ {
		push(int32(i))
	}
	for len(h) > 0 {
		it := h.pop()
		r := next[it.pos]
		if sym[it.pos] != it.left || r < 0 || sym[r] != it.right {
			continue // stale
		}
		sym[it.pos] = it.id
		sym[r] = -1
		next[it.pos] = next[r]
		if nr := next[r]; nr >= 0 {
			prev[nr] = it.pos
		}
		if p := prev[it.pos]; p >= 0 {
			push(p)
		}
		push(it.pos)
	}
	for i := int32(0); i >= 0; i = next[i] {
		dst = append(dst, sym[i])
	}
	return dst
}

// pairHeap is a binary min-heap of pairItem.
type pairHeap []pairItem

func (h *pairHeap) push(it pairItem) {
	*h = append(*h, it)
	a := *h
	i := len(a) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !a[i].less(a[p]) {
			break
		}
		a[i], a[p] = a[p], a[i]
		i = p
	}
}

func (h *pairHeap) pop() pairItem {
	a := *h
	top := a[0]
	last := len(a) - 1
	a[0] = a[last]
	a = a[:last]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(a) && a[l].less(a[m]) {
			m = l
		}
		if r < len(a) && a[r].less(a[m]) {
			m = r
		}
		if m == i {
			break
		}
		a[i], a[m] = a[m], a[i]
		i = m
	}
	*h = a
	return top
}
