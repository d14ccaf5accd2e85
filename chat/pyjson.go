package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// The official DeepSeek V4 encoder serialises tool schemas and non-string
// tool-call argument values with Python's json.dumps(value,
// ensure_ascii=False). This file reproduces that output from raw JSON text
// while keeping object keys in the order the client sent them.

// pyKind identifies the type of a parsed JSON value.
type pyKind uint8

const (
	pyNull pyKind = iota
	pyBool
	pyNumber
	pyString
	pyArray
	pyObject
)

// pyValue is an order-preserving JSON tree.
type pyValue struct {
	kind  pyKind
	b     bool
	text  string // number literal or string contents
	items []pyValue
	keys  []string // object keys, parallel to items
}

// maxJSONDepth bounds nesting so hostile input cannot exhaust the stack.
const maxJSONDepth = 512

// parsePyJSON parses one JSON value from data. Trailing non-space data is an
// error. Duplicate object keys keep the position of their first occurrence
// and the value of their last one, as Python dicts do.
func parsePyJSON(data []byte) (pyValue, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := readPyValue(dec, 0)
	if err != nil {
		return pyValue{}, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return pyValue{}, errors.New("trailing data after JSON value")
	}
	return v, nil
}

func readPyValue(dec *json.Decoder, depth int) (pyValue, error) {
	if depth > maxJSONDepth {
		return pyValue{}, errors.New("JSON nested too deeply")
	}
	tok, err := dec.Token()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return pyValue{}, io.ErrUnexpectedEOF
		}
		return pyValue{}, err
	}
	switch t := tok.(type) {
	case nil:
		return pyValue{kind: pyNull}, nil
	case bool:
		return pyValue{kind: pyBool, b: t}, nil
	case json.Number:
		return pyValue{kind: pyNumber, text: string(t)}, nil
	case string:
		return pyValue{kind: pyString, text: t}, nil
	case json.Delim:
		switch t {
		case '[':
			v := pyValue{kind: pyArray}
			for dec.More() {
				item, err := readPyValue(dec, depth+1)
				if err != nil {
					return pyValue{}, err
				}
				v.items = append(v.items, item)
			}
			if _, err := dec.Token(); err != nil {
				return pyValue{}, err
			}
			return v, nil
		case '{':
			v := pyValue{kind: pyObject}
			index := map[string]int{}
			for dec.More() {
				ktok, err := dec.Token()
				if err != nil {
					return pyValue{}, err
				}
				key, ok := ktok.(string)
				if !ok {
					return pyValue{}, fmt.Errorf("object key is %T, not a string", ktok)
				}
				item, err := readPyValue(dec, depth+1)
				if err != nil {
					return pyValue{}, err
				}
				if i, dup := index[key]; dup {
					v.items[i] = item
					continue
				}
				index[key] = len(v.keys)
				v.keys = append(v.keys, key)
				v.items = append(v.items, item)
			}
			if _, err := dec.Token(); err != nil {
				return pyValue{}, err
			}
			return v, nil
		}
	}
	return pyValue{}, fmt.Errorf("unexpected JSON token %v", tok)
}

// pyDumps renders v the way Python's json.dumps(v, ensure_ascii=False) does:
// ", " and ": " separators, Python float repr, minimal string escaping.
func pyDumps(v pyValue) (string, error) {
	var sb strings.Builder
	if err := writePy(&sb, v); err != nil {
		return "", err
	}
	return sb.String(), nil
}

func writePy(sb *strings.Builder, v pyValue) error {
	switch v.kind {
	case pyNull:
		sb.WriteString("null")
	case pyBool:
		if v.b {
			sb.WriteString("true")
		} else {
			sb.WriteString("false")
		}
	case pyNumber:
		s, err := pyNumberRepr(v.text)
		if err != nil {
			return err
		}
		sb.WriteString(s)
	case pyString:
		writePyString(sb, v.text)
	case pyArray:
		sb.WriteByte('[')
		for i, item := range v.items {
			if i > 0 {
				sb.WriteString(", ")
			}
			if err := writePy(sb, item); err != nil {
				return err
			}
		}
		sb.WriteByte(']')
	case pyObject:
		sb.WriteByte('{')
		for i, item := range v.items {
			if i > 0 {
				sb.WriteString(", ")
			}
			writePyString(sb, v.keys[i])
			sb.WriteString(": ")
			if err := writePy(sb, item); err != nil {
				return err
			}
		}
		sb.WriteByte('}')
	}
	return nil
}

// pyNumberRepr converts a JSON number literal to the text Python prints after
// json.loads: integers keep their digits, floats use repr().
func pyNumberRepr(lit string) (string, error) {
	if !strings.ContainsAny(lit, ".eE") {
		if lit == "-0" {
			return "0", nil
		}
		return lit, nil
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil {
		var numErr *strconv.NumError
		if !errors.As(err, &numErr) || !errors.Is(numErr.Err, strconv.ErrRange) {
			return "", fmt.Errorf("bad number %q: %w", lit, err)
		}
	}
	return pyFloatRepr(f), nil
}

// pyFloatRepr formats f like Python's float.__repr__ (as used by json.dumps).
func pyFloatRepr(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	case math.IsNaN(f):
		return "NaN"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64)
	i := strings.LastIndexByte(e, 'e')
	exp, _ := strconv.Atoi(e[i+1:])
	// Python switches to exponent notation when the decimal point position
	// (exp+1) is below -3 or above 16.
	if exp < -4 || exp >= 16 {
		return e
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsAny(s, ".") {
		s += ".0"
	}
	return s
}

// writePyString writes s as a JSON string escaped like Python's json.dumps
// with ensure_ascii=False: only '"', '\\' and control characters are escaped.
func writePyString(sb *strings.Builder, s string) {
	sb.WriteByte('"')
	appendPyEscaped(sb, s)
	sb.WriteByte('"')
}

const hexDigits = "0123456789abcdef"

// appendPyEscaped writes the escaped body of a JSON string (no quotes).
func appendPyEscaped(sb *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '"':
			sb.WriteString(`\"`)
		case '\\':
			sb.WriteString(`\\`)
		case '\n':
			sb.WriteString(`\n`)
		case '\r':
			sb.WriteString(`\r`)
		case '\t':
			sb.WriteString(`\t`)
		case '\b':
			sb.WriteString(`\b`)
		case '\f':
			sb.WriteString(`\f`)
		default:
			if c < 0x20 {
				sb.WriteString(`\u00`)
				sb.WriteByte(hexDigits[c>>4])
				sb.WriteByte(hexDigits[c&0xf])
			} else {
				sb.WriteByte(c)
			}
		}
	}
}

// PyJSON re-serialises the JSON value in raw the way the official DeepSeek V4
// encoder prints it (Python json.dumps with ensure_ascii=False), keeping the
// order of object keys. It is exported for callers that build DSML by hand.
func PyJSON(raw []byte) (string, error) {
	v, err := parsePyJSON(raw)
	if err != nil {
		return "", fmt.Errorf("chat: parse JSON: %w", err)
	}
	return pyDumps(v)
}

// PyQuote returns s as a JSON string literal escaped like Python's json.dumps
// with ensure_ascii=False.
func PyQuote(s string) string {
	var sb strings.Builder
	writePyString(&sb, s)
	return sb.String()
}
