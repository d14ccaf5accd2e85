package server

import (
	"encoding/json"
	"net/http"
	"time"
)

// sse writes a Server-Sent Events stream. Headers go out with the first
// write (an event or a keepalive comment), so errors found before that can
// still be plain HTTP errors. Every write has a deadline: a client that
// stops reading is dropped instead of stalling the stream forever.
type sse struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	started bool
	last    time.Time
	err     error
}

func newSSE(w http.ResponseWriter, timeout time.Duration) *sse {
	return &sse{w: w, rc: http.NewResponseController(w), timeout: timeout, last: time.Now()}
}

func (x *sse) write(p []byte) error {
	if x.err != nil {
		return x.err
	}
	if !x.started {
		h := x.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Accel-Buffering", "no")
		x.w.WriteHeader(http.StatusOK)
		x.started = true
	}
	_ = x.rc.SetWriteDeadline(time.Now().Add(x.timeout))
	if _, err := x.w.Write(p); err != nil {
		x.err = err
		return err
	}
	if err := x.rc.Flush(); err != nil {
		x.err = err
		return err
	}
	x.last = time.Now()
	return nil
}

// data writes "data: JSON".
func (x *sse) data(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	p := make([]byte, 0, len(b)+8)
	p = append(p, "data: "...)
	p = append(p, b...)
	p = append(p, "\n\n"...)
	return x.write(p)
}

// event writes "event: NAME" and "data: JSON".
func (x *sse) event(name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	p := make([]byte, 0, len(b)+len(name)+16)
	p = append(p, "event: "...)
	p = append(p, name...)
	p = append(p, "\ndata: "...)
	p = append(p, b...)
	p = append(p, "\n\n"...)
	return x.write(p)
}

func (x *sse) raw(s string) error { return x.write([]byte(s)) }

// comment writes an SSE comment line, ignored by clients (keepalive).
func (x *sse) comment(s string) error { return x.write([]byte(": " + s + "\n\n")) }

// streamer translates generation events into one API's SSE events.
type streamer interface {
	start(x *sse, res *genResult) error
	event(x *sse, ev *event) error
	done(x *sse, res *genResult) error
	fail(x *sse, e *apiError) error
}

func newStreamer(s *Server, r *genRequest) streamer {
	switch r.api {
	case apiMessages:
		return newAnthropicStream(s, r)
	case apiResponses:
		return newResponsesStream(s, r)
	case apiCompletions:
		return &completionStream{s: s, r: r, id: s.nextID("cmpl-"), created: time.Now().Unix()}
	}
	return &chatStream{s: s, r: r, id: s.nextID("chatcmpl-"), created: time.Now().Unix()}
}

// stream relays a generation as SSE, with keepalive comments while nothing
// else is sent. It returns when the generation ends or the client goes.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, j *job, st streamer) {
	x := newSSE(w, s.cfg.WriteTimeout)
	tick := time.NewTicker(max(s.cfg.KeepAlive/2, time.Millisecond))
	defer tick.Stop()
	var buf []event
	for {
		select {
		case <-j.ctx.Done():
			return
		case <-tick.C:
			if time.Since(x.last) >= s.cfg.KeepAlive {
				if x.comment("keepalive") != nil {
					return
				}
			}
			continue
		case <-j.q.notify:
		}
		evs, closed := j.q.take(buf)
		buf = evs
		for i := range evs {
			ev := &evs[i]
			var err error
			switch ev.kind {
			case evStart:
				err = st.start(x, ev.res)
			case evDone:
				if e := ev.res.err; e != nil {
					if !x.started {
						writeError(w, j.req.api, e)
					} else {
						_ = st.fail(x, e)
					}
					return
				}
				_ = st.done(x, ev.res)
				return
			default:
				err = st.event(x, ev)
			}
			if err != nil {
				s.log.Info("client stream write failed; cancelling", "err", err)
				return
			}
		}
		if closed {
			return
		}
	}
}
