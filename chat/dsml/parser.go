package dsml

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// mode is the parser's position in the grammar.
type mode uint8

const (
	mText      mode = iota // visible text
	mReasoning             // inside <think>
	mBlock                 // inside <tool_calls>, between invokes
	mInvokeTag             // reading the attributes of <invoke …>
	mInvoke                // inside <invoke>, between parameters
	mParamTag              // reading the attributes of <parameter …>
	mUntyped               // body of a parameter without a string attribute, only whitespace so far
	mString                // body of a string parameter
	mJSON                  // body of a JSON parameter
	mDone                  // after EOS
)

// markerID names the strings the parser looks for.
type markerID uint8

const (
	mkThinkStart markerID = iota
	mkThinkEnd
	mkEOS
	mkBlockStart
	mkBlockEnd
	mkInvokeStart
	mkInvokeEnd
	mkParamStart
	mkParamEnd
	mkEntity
)

type marker struct {
	id   markerID
	text string
	// repl is the decoded character of an entity marker.
	repl byte
}

const (
	dsmlFull  = "｜DSML｜"
	dsmlShort = "DSML｜"
	eosText   = "<｜end▁of▁sentence｜>"
)

func dsmlMarkers(id markerID, format string) []marker {
	return []marker{
		{id: id, text: fmtTag(format, dsmlFull)},
		{id: id, text: fmtTag(format, dsmlShort)},
	}
}

func fmtTag(format, tok string) string {
	out := make([]byte, 0, len(format)+len(tok))
	for i := 0; i < len(format); i++ {
		if format[i] == '%' {
			out = append(out, tok...)
			continue
		}
		out = append(out, format[i])
	}
	return string(out)
}

var (
	thinkStartM = marker{id: mkThinkStart, text: "<think>"}
	thinkEndM   = marker{id: mkThinkEnd, text: "</think>"}
	eosM        = marker{id: mkEOS, text: eosText}
	blockStartM = dsmlMarkers(mkBlockStart, "<%tool_calls>")
	blockEndM   = dsmlMarkers(mkBlockEnd, "</%tool_calls>")
	invokeM     = dsmlMarkers(mkInvokeStart, "<%invoke")
	invokeEndM  = dsmlMarkers(mkInvokeEnd, "</%invoke>")
	paramM      = dsmlMarkers(mkParamStart, "<%parameter")
	paramEndM   = dsmlMarkers(mkParamEnd, "</%parameter>")
	entityM     = []marker{
		{id: mkEntity, text: "&amp;", repl: '&'},
		{id: mkEntity, text: "&lt;", repl: '<'},
		{id: mkEntity, text: "&gt;", repl: '>'},
		{id: mkEntity, text: "&quot;", repl: '"'},
		{id: mkEntity, text: "&apos;", repl: '\''},
	}
)

func join(sets ...[]marker) []marker {
	var out []marker
	for _, s := range sets {
		out = append(out, s...)
	}
	return out
}

var (
	textMarkers          = join([]marker{thinkStartM, eosM}, blockStartM, blockEndM)
	textMarkersNoTools   = []marker{thinkStartM, eosM}
	reasoningMarkers     = []marker{thinkEndM, eosM}
	blockMarkers         = join(invokeM, blockEndM)
	invokeMarkers        = join(paramM, invokeEndM)
	nestedMarkers        = join(paramM, invokeEndM, paramEndM)
	untypedMarkers       = join(paramM, paramEndM)
	stringMarkers        = paramEndM
	stringEntityMarkers  = join(paramEndM, entityM)
	jsonMarkers          = paramEndM
	maxTagLen            = 4096
	maxNesting           = 64
	replacementCharBytes = []byte("\uFFFD")
)

// Parser is a streaming DSML parser. The zero value is not usable; call
// NewParser. A Parser is not safe for concurrent use.
type Parser struct {
	opts Options
	mode mode
	off  int64  // bytes fed so far
	pend []byte // bytes that may still begin a marker (pend[0] is the next to consume)

	// Output channel: the kind and call index of the delta being written,
	// an incomplete UTF-8 sequence held back, and the coalesced delta.
	chKind     EventKind
	chIndex    int
	u8         []byte
	delta      []byte
	deltaKind  EventKind
	deltaIndex int
	events     []Event

	ws []byte // trailing whitespace of visible text, held back

	text      []byte
	reasoning []byte
	calls     []ToolCall
	block     []byte
	err       error
	truncated bool
	finished  bool

	// Tool-call block state.
	inBlock   bool
	raw       []byte // separator whitespace and block text so far
	tag       []byte
	tagQuote  bool
	nextIndex int
	call      *openCall

	// Parameter state.
	paramName string
	untyped   []byte
	jsonBuf   []byte
	jsonStr   bool
	jsonEsc   bool
}

// openCall is a call being parsed.
type openCall struct {
	index    int
	name     string
	args     []byte
	rawStart int
	levels   []level
	coerced  bool
}

// level is one JSON object of the arguments (the top one, or a nested
// parameter).
type level struct {
	keys map[string]bool
	n    int
}

// NewParser returns a parser for one generated assistant turn.
func NewParser(opts Options) *Parser {
	p := &Parser{opts: opts, chIndex: -1, deltaIndex: -1}
	if opts.Thinking {
		p.mode = mReasoning
	}
	return p
}

// Feed parses the next piece of output and returns the events it
// completes. The returned slice is owned by the caller.
func (p *Parser) Feed(s string) []Event {
	if p.finished {
		return nil
	}
	for i := 0; i < len(s); i++ {
		p.step(s[i])
	}
	return p.takeEvents()
}

// FeedBytes is Feed for a byte slice.
func (p *Parser) FeedBytes(b []byte) []Event {
	if p.finished {
		return nil
	}
	for _, c := range b {
		p.step(c)
	}
	return p.takeEvents()
}

// Finish ends the output: bytes held back are resolved, and an open
// tool-call block is closed, keeping what is complete (a string value cut
// short is kept, a JSON value that does not parse is dropped) and marking
// the open call Truncated. Later calls to Feed and Finish do nothing.
func (p *Parser) Finish() []Event {
	if p.finished {
		return nil
	}
	pend := p.pend
	p.pend = nil
	switch p.mode {
	case mText:
		for _, c := range pend {
			p.textByte(c)
		}
	case mReasoning:
		p.out(EventReasoning, -1, pend)
	case mString:
		if !isPrefixOf(pend, paramEndM, 2) {
			for _, c := range pend {
				p.stringByte(c)
			}
		}
	case mJSON:
		if !isPrefixOf(pend, paramEndM, 2) {
			for _, c := range pend {
				p.jsonByte(c)
			}
		}
	}
	if p.inBlock {
		p.repair()
	}
	if len(p.ws) > 0 {
		p.out(EventText, -1, p.ws)
		p.ws = nil
	}
	p.endChannel()
	p.flushDelta()
	p.finished = true
	return p.takeEvents()
}

// Result returns what has been parsed so far. Before Finish it leaves out
// held-back bytes and the call in progress.
func (p *Parser) Result() Result {
	r := Result{
		Text:         string(p.text),
		Reasoning:    string(p.reasoning),
		ToolCalls:    append([]ToolCall(nil), p.calls...),
		ToolBlock:    string(p.block),
		Err:          p.err,
		Truncated:    p.truncated,
		ThinkingOpen: p.mode == mReasoning,
	}
	return r
}

// State reports what the next generated token belongs to.
func (p *Parser) State() State {
	switch p.mode {
	case mText:
		return StateText
	case mReasoning:
		return StateReasoning
	case mDone:
		return StateDone
	case mString:
		if isPrefixOf(p.pend, paramEndM, 2) {
			return StateStructure
		}
		return StateString
	case mJSON:
		if p.jsonStr {
			return StateJSONString
		}
		if isPrefixOf(p.pend, paramEndM, 2) {
			return StateStructure
		}
		return StateJSON
	}
	return StateStructure
}

// InStructure reports whether the next token is DSML structure that the
// sampler should pick greedily: tags, the whitespace between them, a
// closing tag that has begun, and JSON values outside their strings. Free
// text, reasoning and string bodies report false.
func (p *Parser) InStructure() bool {
	s := p.State()
	return s == StateStructure || s == StateJSON
}

// takeEvents flushes the coalesced delta and hands the events over.
func (p *Parser) takeEvents() []Event {
	p.flushDelta()
	ev := p.events
	p.events = nil
	return ev
}

// step consumes one byte of output.
func (p *Parser) step(c byte) {
	if p.mode == mDone {
		return
	}
	p.off++
	if p.inBlock {
		p.raw = append(p.raw, c)
	}
	p.pend = append(p.pend, c)
	p.drain()
}

// drain consumes pending bytes until the rest could still begin a marker.
func (p *Parser) drain() {
	for len(p.pend) > 0 {
		switch p.mode {
		case mDone:
			p.pend = p.pend[:0]
			return
		case mInvokeTag, mParamTag:
			if p.tagByte(p.pend[0]) {
				p.pend = p.pend[1:]
			}
			continue
		}
		m, partial := match(p.pend, p.markers())
		if m != nil {
			// Bytes after the marker (possible only when bytes are read
			// again after an error) stay pending for the next mode.
			p.pend = p.pend[len(m.text):]
			p.onMarker(m)
			continue
		}
		if partial {
			return
		}
		if p.onByte(p.pend[0]) {
			p.pend = p.pend[1:]
		}
	}
	p.pend = p.pend[:0]
}

// match finds a marker that pend begins with, or reports whether pend is a
// proper prefix of one.
func match(pend []byte, set []marker) (*marker, bool) {
	partial := false
	for i := range set {
		t := set[i].text
		if len(pend) >= len(t) {
			if string(pend[:len(t)]) == t {
				return &set[i], false
			}
			continue
		}
		if string(pend) == t[:len(pend)] {
			partial = true
		}
	}
	return nil, partial
}

// isPrefixOf reports whether b, at least min bytes long, begins a marker of
// set without completing it.
func isPrefixOf(b []byte, set []marker, min int) bool {
	if len(b) < min {
		return false
	}
	for _, m := range set {
		if len(b) < len(m.text) && string(b) == m.text[:len(b)] {
			return true
		}
	}
	return false
}

func (p *Parser) markers() []marker {
	switch p.mode {
	case mText:
		if p.opts.DisableToolCalls {
			return textMarkersNoTools
		}
		return textMarkers
	case mReasoning:
		return reasoningMarkers
	case mBlock:
		return blockMarkers
	case mInvoke:
		if p.call != nil && len(p.call.levels) > 1 {
			return nestedMarkers
		}
		return invokeMarkers
	case mUntyped:
		return untypedMarkers
	case mString:
		if p.opts.DecodeEntities {
			return stringEntityMarkers
		}
		return stringMarkers
	case mJSON:
		return jsonMarkers
	}
	return nil
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

// onByte consumes a byte that begins no marker. It returns false when the
// byte must be read again in the mode it switched to.
func (p *Parser) onByte(c byte) bool {
	switch p.mode {
	case mText:
		p.textByte(c)
	case mReasoning:
		p.out(EventReasoning, -1, []byte{c})
	case mBlock:
		if !isSpace(c) {
			p.fail(fmt.Sprintf("unexpected %q between tool calls", c))
			return false
		}
	case mInvoke:
		if !isSpace(c) {
			p.fail(fmt.Sprintf("unexpected %q between parameters", c))
			return false
		}
	case mUntyped:
		if isSpace(c) {
			p.untyped = append(p.untyped, c)
			return true
		}
		// Not a nested parameter: a string whose text began with the
		// whitespace seen so far.
		p.writeKey(p.paramName)
		p.out(EventToolCallArgs, p.call.index, []byte{'"'})
		ws := p.untyped
		p.untyped = nil
		p.mode = mString
		for _, w := range ws {
			p.stringByte(w)
		}
		return false
	case mString:
		p.stringByte(c)
	case mJSON:
		p.jsonByte(c)
	}
	return true
}

// textByte writes visible text, holding back trailing whitespace.
func (p *Parser) textByte(c byte) {
	if isSpace(c) {
		p.ws = append(p.ws, c)
		return
	}
	if len(p.ws) > 0 {
		p.out(EventText, -1, p.ws)
		p.ws = p.ws[:0]
	}
	p.out(EventText, -1, []byte{c})
}

const hexDigits = "0123456789abcdef"

// stringByte writes one byte of a string parameter into the arguments,
// escaped like Python's json.dumps(ensure_ascii=False).
func (p *Parser) stringByte(c byte) {
	var e []byte
	switch c {
	case '"':
		e = []byte(`\"`)
	case '\\':
		e = []byte(`\\`)
	case '\n':
		e = []byte(`\n`)
	case '\r':
		e = []byte(`\r`)
	case '\t':
		e = []byte(`\t`)
	case '\b':
		e = []byte(`\b`)
	case '\f':
		e = []byte(`\f`)
	default:
		if c < 0x20 {
			e = []byte{'\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf]}
		} else {
			e = []byte{c}
		}
	}
	p.out(EventToolCallArgs, p.call.index, e)
}

// jsonByte collects one byte of a JSON parameter, tracking JSON strings for
// State.
func (p *Parser) jsonByte(c byte) {
	p.jsonBuf = append(p.jsonBuf, c)
	switch {
	case p.jsonEsc:
		p.jsonEsc = false
	case p.jsonStr && c == '\\':
		p.jsonEsc = true
	case c == '"':
		p.jsonStr = !p.jsonStr
	}
}

// tagByte collects the attributes of an invoke or parameter tag. It returns
// false when the byte must be read again after an error.
func (p *Parser) tagByte(c byte) bool {
	if c == '<' && !p.tagQuote {
		p.fail("'<' inside a tag")
		return false
	}
	if len(p.tag) >= maxTagLen {
		p.fail("tag too long")
		return false
	}
	p.tag = append(p.tag, c)
	switch {
	case c == '"':
		p.tagQuote = !p.tagQuote
	case c == '>' && !p.tagQuote:
		attrs, err := parseAttrs(p.tag[:len(p.tag)-1], p.opts.DecodeEntities)
		p.tag = p.tag[:0]
		if err != nil {
			p.fail(err.Error())
			return false
		}
		if p.mode == mInvokeTag {
			p.openInvoke(attrs)
		} else {
			p.openParam(attrs)
		}
		// After a failure the '>' is read again as text.
		return p.mode != mText
	}
	return true
}

// onMarker acts on a complete marker.
func (p *Parser) onMarker(m *marker) {
	switch p.mode {
	case mText:
		switch m.id {
		case mkThinkStart:
			p.flushWS()
			p.mode = mReasoning
		case mkEOS:
			p.mode = mDone
		case mkBlockStart:
			p.raw = append(append(append(p.raw[:0], p.ws...), m.text...), p.pend...)
			p.ws = p.ws[:0]
			p.inBlock = true
			p.mode = mBlock
		case mkBlockEnd:
			// An orphan end marker is dropped.
		}
	case mReasoning:
		if m.id == mkEOS {
			p.mode = mDone
			return
		}
		p.mode = mText
	case mBlock:
		if m.id == mkInvokeStart {
			p.call = &openCall{index: -1, rawStart: len(p.raw) - len(p.pend) - len(m.text)}
			p.tag, p.tagQuote = p.tag[:0], false
			p.mode = mInvokeTag
			return
		}
		p.block = append(p.block, p.raw[:len(p.raw)-len(p.pend)]...)
		p.raw = p.raw[:0]
		p.inBlock = false
		p.mode = mText
	case mInvoke:
		switch m.id {
		case mkParamStart:
			p.tag, p.tagQuote = p.tag[:0], false
			p.mode = mParamTag
		case mkParamEnd: // closes a nested parameter
			p.closeLevel()
		case mkInvokeEnd:
			for len(p.call.levels) > 1 {
				p.closeLevel()
			}
			p.closeCall(false)
			p.mode = mBlock
		}
	case mUntyped:
		if m.id == mkParamStart {
			if len(p.call.levels) >= maxNesting {
				p.fail("parameters nested too deeply")
				return
			}
			p.writeKey(p.paramName)
			p.out(EventToolCallArgs, p.call.index, []byte{'{'})
			p.call.levels = append(p.call.levels, level{})
			p.untyped = nil
			p.tag, p.tagQuote = p.tag[:0], false
			p.mode = mParamTag
			return
		}
		p.writeKey(p.paramName)
		p.out(EventToolCallArgs, p.call.index, []byte{'"'})
		for _, w := range p.untyped {
			p.stringByte(w)
		}
		p.untyped = nil
		p.out(EventToolCallArgs, p.call.index, []byte{'"'})
		p.mode = mInvoke
	case mString:
		if m.id == mkEntity {
			p.stringByte(m.repl)
			return
		}
		p.out(EventToolCallArgs, p.call.index, []byte{'"'})
		p.mode = mInvoke
	case mJSON:
		p.endJSONParam()
		p.mode = mInvoke
	}
}

// flushWS writes held whitespace as visible text.
func (p *Parser) flushWS() {
	if len(p.ws) > 0 {
		p.out(EventText, -1, p.ws)
		p.ws = p.ws[:0]
	}
}

// openInvoke starts a call once its tag is read.
func (p *Parser) openInvoke(attrs map[string]string) {
	name, ok := attrs["name"]
	if !ok || name == "" {
		p.fail("invoke without a name")
		return
	}
	p.call.index = p.nextIndex
	p.call.name = name
	p.call.levels = []level{{}}
	p.nextIndex++
	p.push(Event{Kind: EventToolCallBegin, Index: p.call.index, Name: name})
	p.out(EventToolCallArgs, p.call.index, []byte{'{'})
	p.mode = mInvoke
}

// openParam starts a parameter once its tag is read.
func (p *Parser) openParam(attrs map[string]string) {
	name, ok := attrs["name"]
	if !ok {
		p.fail("parameter without a name")
		return
	}
	lv := &p.call.levels[len(p.call.levels)-1]
	if lv.keys[name] {
		p.fail(fmt.Sprintf("duplicate parameter %q", name))
		return
	}
	if lv.keys == nil {
		lv.keys = map[string]bool{}
	}
	lv.keys[name] = true
	p.paramName = name
	typ, typed := attrs["string"]
	switch {
	case !typed:
		p.untyped = p.untyped[:0]
		p.mode = mUntyped
	case typ == "true":
		p.writeKey(name)
		p.out(EventToolCallArgs, p.call.index, []byte{'"'})
		p.mode = mString
	case typ == "false":
		p.jsonBuf = p.jsonBuf[:0]
		p.jsonStr, p.jsonEsc = false, false
		p.mode = mJSON
	default:
		p.fail(fmt.Sprintf("parameter %q has string=%q, want true or false", name, typ))
	}
}

// writeKey writes `"key": ` (with a leading ", " after the first member).
func (p *Parser) writeKey(name string) {
	lv := &p.call.levels[len(p.call.levels)-1]
	var b []byte
	if lv.n > 0 {
		b = append(b, ", "...)
	}
	lv.n++
	b = appendQuoted(b, name)
	b = append(b, ": "...)
	p.out(EventToolCallArgs, p.call.index, b)
}

// endJSONParam writes a finished JSON parameter.
func (p *Parser) endJSONParam() {
	v := trimSpace(p.jsonBuf)
	p.writeKey(p.paramName)
	if json.Valid(v) {
		p.out(EventToolCallArgs, p.call.index, v)
	} else {
		p.call.coerced = true
		p.out(EventToolCallArgs, p.call.index, appendQuoted(nil, string(v)))
	}
	p.jsonBuf = p.jsonBuf[:0]
	p.jsonStr, p.jsonEsc = false, false
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

// closeLevel ends a nested parameter object.
func (p *Parser) closeLevel() {
	p.call.levels = p.call.levels[:len(p.call.levels)-1]
	p.out(EventToolCallArgs, p.call.index, []byte{'}'})
}

// closeCall finishes the open call.
func (p *Parser) closeCall(truncated bool) {
	c := p.call
	p.out(EventToolCallArgs, c.index, []byte{'}'})
	p.endChannel()
	tc := ToolCall{
		Index:     c.index,
		Name:      c.name,
		Arguments: string(c.args),
		Raw:       string(p.raw[c.rawStart : len(p.raw)-len(p.pend)]),
		Truncated: truncated,
		Coerced:   c.coerced,
	}
	p.calls = append(p.calls, tc)
	p.push(Event{Kind: EventToolCallEnd, Index: c.index, Call: &tc})
	p.call = nil
}

// repair closes an open block at the end of the output.
func (p *Parser) repair() {
	if p.call != nil && p.call.index >= 0 {
		switch p.mode {
		case mString:
			p.out(EventToolCallArgs, p.call.index, []byte{'"'})
		case mJSON:
			if v := trimSpace(p.jsonBuf); json.Valid(v) {
				p.writeKey(p.paramName)
				p.out(EventToolCallArgs, p.call.index, v)
			}
		}
		for len(p.call.levels) > 1 {
			p.closeLevel()
		}
		p.closeCall(true)
	}
	p.call = nil
	p.block = append(p.block, p.raw...)
	p.raw = nil
	p.inBlock = false
	p.truncated = true
	p.mode = mText
}

// fail reports malformed DSML at the byte pend[0], returns the block text
// before it as visible text, and resumes in text mode.
func (p *Parser) fail(msg string) {
	consumed := p.raw[:len(p.raw)-len(p.pend)]
	e := &SyntaxError{Offset: p.off - int64(len(p.pend)), Msg: msg, Raw: string(consumed)}
	if p.err == nil {
		p.err = e
	}
	idx := -1
	if p.call != nil {
		idx = p.call.index
	}
	p.push(Event{Kind: EventError, Index: idx, Err: e})
	p.call = nil
	p.inBlock = false
	p.raw = nil
	p.tag = p.tag[:0]
	p.untyped = nil
	p.mode = mText
	for _, c := range consumed {
		p.textByte(c)
	}
}

// push appends a non-delta event after finishing the current delta.
func (p *Parser) push(ev Event) {
	p.endChannel()
	p.flushDelta()
	p.events = append(p.events, ev)
}

// out writes delta bytes of kind (for call index) through the UTF-8 guard:
// complete characters pass, an incomplete one waits for the next byte, and
// each byte that cannot start or continue a character becomes U+FFFD.
func (p *Parser) out(kind EventKind, index int, b []byte) {
	if kind != p.chKind || index != p.chIndex {
		p.endChannel()
		p.chKind, p.chIndex = kind, index
	}
	for _, c := range b {
		if len(p.u8) == 0 && c < utf8.RuneSelf {
			p.accept([]byte{c})
			continue
		}
		p.u8 = append(p.u8, c)
		p.settleUTF8(false)
	}
}

// settleUTF8 passes on what the held bytes can decide; final forces the
// rest out as replacement characters.
func (p *Parser) settleUTF8(final bool) {
	for len(p.u8) > 0 {
		if !final && !utf8.FullRune(p.u8) {
			return
		}
		r, n := utf8.DecodeRune(p.u8)
		if r == utf8.RuneError && n <= 1 {
			p.accept(replacementCharBytes)
			n = 1
		} else {
			p.accept(p.u8[:n])
		}
		p.u8 = p.u8[n:]
	}
	p.u8 = p.u8[:0]
}

// endChannel forces out a held incomplete character of the current channel.
func (p *Parser) endChannel() {
	if len(p.u8) > 0 {
		p.settleUTF8(true)
	}
}

// accept records settled output bytes of the current channel.
func (p *Parser) accept(b []byte) {
	switch p.chKind {
	case EventText:
		p.text = append(p.text, b...)
	case EventReasoning:
		p.reasoning = append(p.reasoning, b...)
	case EventToolCallArgs:
		if p.call != nil && p.call.index == p.chIndex {
			p.call.args = append(p.call.args, b...)
		}
	}
	if len(p.delta) > 0 && (p.deltaKind != p.chKind || p.deltaIndex != p.chIndex) {
		p.flushDelta()
	}
	p.deltaKind, p.deltaIndex = p.chKind, p.chIndex
	p.delta = append(p.delta, b...)
}

// flushDelta turns the coalesced delta into an event.
func (p *Parser) flushDelta() {
	if len(p.delta) == 0 {
		return
	}
	p.events = append(p.events, Event{Kind: p.deltaKind, Index: p.deltaIndex, Text: string(p.delta)})
	p.delta = p.delta[:0]
}

// appendQuoted appends s as a JSON string escaped like Python's
// json.dumps(ensure_ascii=False).
func appendQuoted(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '"':
			b = append(b, '\\', '"')
		case '\\':
			b = append(b, '\\', '\\')
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		case '\b':
			b = append(b, '\\', 'b')
		case '\f':
			b = append(b, '\\', 'f')
		default:
			if c < 0x20 {
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			} else {
				b = append(b, c)
			}
		}
	}
	return append(b, '"')
}

// parseAttrs reads ` key="value" …` from the inside of a tag.
func parseAttrs(b []byte, decode bool) (map[string]string, error) {
	attrs := map[string]string{}
	i := 0
	for {
		for i < len(b) && isSpace(b[i]) {
			i++
		}
		if i == len(b) {
			return attrs, nil
		}
		if i == 0 {
			return nil, fmt.Errorf("tag name runs into %q", b[i])
		}
		start := i
		for i < len(b) && b[i] != '=' && !isSpace(b[i]) && b[i] != '"' {
			i++
		}
		key := string(b[start:i])
		if key == "" || i+1 >= len(b) || b[i] != '=' || b[i+1] != '"' {
			return nil, fmt.Errorf("bad attribute near %q", clip(b[start:]))
		}
		i += 2
		end := bytes.IndexByte(b[i:], '"')
		if end < 0 {
			return nil, fmt.Errorf("unterminated attribute %q", key)
		}
		val := string(b[i : i+end])
		if decode {
			val = decodeEntities(val)
		}
		if _, dup := attrs[key]; dup {
			return nil, fmt.Errorf("duplicate attribute %q", key)
		}
		attrs[key] = val
		i += end + 1
		if i < len(b) && !isSpace(b[i]) {
			return nil, fmt.Errorf("attribute %q runs into %q", key, b[i])
		}
	}
}

func clip(b []byte) string {
	if len(b) > 32 {
		b = b[:32]
	}
	return string(b)
}

// decodeEntities undoes the five XML entities.
func decodeEntities(s string) string {
	if !strings.Contains(s, "&") {
		return s
	}
	r := strings.NewReplacer("&amp;", "&", "&lt;", "<", "&gt;", ">", "&quot;", `"`, "&apos;", "'")
	return r.Replace(s)
}
