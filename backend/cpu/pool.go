package cpu

import (
	"sync"
	"sync/atomic"
)

// pool is a fixed set of worker goroutines that help run parallel loops.
// A loop is cut into chunks that the caller and the helpers grab from a
// shared counter, so uneven chunks balance themselves, and a loop started
// while the helpers are busy (another session's op) completes on the
// caller alone: the caller waits for chunks to finish, never for a helper
// to show up.
type pool struct {
	workers int
	jobs    chan *loop
	quit    chan struct{}
	closed  atomic.Bool
	once    sync.Once
}

type loop struct {
	fn    func(lo, hi int)
	n     int
	grain int
	next  atomic.Int64
	done  sync.WaitGroup // one count per chunk
}

func newPool(workers int) *pool {
	workers = max(workers, 1)
	p := &pool{workers: workers, jobs: make(chan *loop, 4*workers), quit: make(chan struct{})}
	for i := 1; i < workers; i++ {
		go p.helper()
	}
	return p
}

func (p *pool) close() {
	p.once.Do(func() {
		p.closed.Store(true)
		close(p.quit)
	})
}

func (p *pool) helper() {
	for {
		select {
		case l := <-p.jobs:
			l.work()
		case <-p.quit:
			return
		}
	}
}

func (l *loop) work() {
	for {
		lo := int(l.next.Add(int64(l.grain))) - l.grain
		if lo >= l.n {
			return
		}
		l.fn(lo, min(lo+l.grain, l.n))
		l.done.Done()
	}
}

// run calls fn on disjoint ranges covering [0, n), in parallel, and returns
// when all have returned. Ranges have at least minGrain items (except the
// last); work is cut into about four chunks per worker.
func (p *pool) run(n, minGrain int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	grain := max(minGrain, (n+4*p.workers-1)/(4*p.workers), 1)
	chunks := (n + grain - 1) / grain
	if chunks <= 1 || p.workers == 1 || p.closed.Load() {
		fn(0, n)
		return
	}
	l := &loop{fn: fn, n: n, grain: grain}
	l.done.Add(chunks)
	for i := min(chunks, p.workers) - 1; i > 0; i-- {
		select {
		case p.jobs <- l:
		default: // helpers busy: the caller does more itself
		}
	}
	l.work()
	l.done.Wait()
}
