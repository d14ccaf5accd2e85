package gguf

import (
	"encoding/binary"
	"fmt"
	"math"
)

// ValueType is the type tag of a GGUF metadata value.
type ValueType uint32

// The GGUF metadata value types, numbered as in the file format.
const (
	TypeUint8   ValueType = 0
	TypeInt8    ValueType = 1
	TypeUint16  ValueType = 2
	TypeInt16   ValueType = 3
	TypeUint32  ValueType = 4
	TypeInt32   ValueType = 5
	TypeFloat32 ValueType = 6
	TypeBool    ValueType = 7
	TypeString  ValueType = 8
	TypeArray   ValueType = 9
	TypeUint64  ValueType = 10
	TypeInt64   ValueType = 11
	TypeFloat64 ValueType = 12
)

var valueTypeNames = [...]string{
	"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
}

// String returns the short name of the type ("u32", "string", ...).
func (t ValueType) String() string {
	if int(t) < len(valueTypeNames) {
		return valueTypeNames[t]
	}
	return fmt.Sprintf("valuetype(%d)", uint32(t))
}

// scalarSize is the encoded size of a fixed-size scalar, 0 for string/array/unknown.
func (t ValueType) scalarSize() int {
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		return 1
	case TypeUint16, TypeInt16:
		return 2
	case TypeUint32, TypeInt32, TypeFloat32:
		return 4
	case TypeUint64, TypeInt64, TypeFloat64:
		return 8
	}
	return 0
}

// Value is one metadata value. Scalars are held widened: unsigned integers
// and bools in U, signed integers in I, floats in F. Arrays hold their
// element type and count, with the elements in Strings (string arrays), Raw
// (numeric arrays: the little-endian encoded elements, as in the file) or
// Elems (arrays of arrays, legal GGUF but unused by DS4 files).
type Value struct {
	Type ValueType
	U    uint64
	I    int64
	F    float64
	S    string

	ElemType ValueType
	Count    uint64
	Strings  []string
	Raw      []byte
	Elems    []Value
}

// KV is one metadata key/value pair, in file order.
type KV struct {
	Key   string
	Value Value
}

// Len returns the element count of an array value, 0 for scalars.
func (v Value) Len() int {
	if v.Type != TypeArray {
		return 0
	}
	return int(v.Count)
}

// Elem returns element i of an array value as a scalar (or nested array) Value.
func (v Value) Elem(i int) Value {
	switch {
	case v.Type != TypeArray || i < 0 || uint64(i) >= v.Count:
		return Value{}
	case v.ElemType == TypeString:
		return Str(v.Strings[i])
	case v.ElemType == TypeArray:
		return v.Elems[i]
	}
	sz := v.ElemType.scalarSize()
	return decodeScalar(v.ElemType, v.Raw[i*sz:(i+1)*sz])
}

// decodeScalar decodes a fixed-size scalar from its little-endian bytes.
func decodeScalar(t ValueType, b []byte) Value {
	v := Value{Type: t}
	switch t {
	case TypeUint8, TypeBool:
		v.U = uint64(b[0])
	case TypeInt8:
		v.I = int64(int8(b[0]))
	case TypeUint16:
		v.U = uint64(binary.LittleEndian.Uint16(b))
	case TypeInt16:
		v.I = int64(int16(binary.LittleEndian.Uint16(b)))
	case TypeUint32:
		v.U = uint64(binary.LittleEndian.Uint32(b))
	case TypeInt32:
		v.I = int64(int32(binary.LittleEndian.Uint32(b)))
	case TypeFloat32:
		v.F = f32to64(binary.LittleEndian.Uint32(b))
	case TypeUint64:
		v.U = binary.LittleEndian.Uint64(b)
	case TypeInt64:
		v.I = int64(binary.LittleEndian.Uint64(b))
	case TypeFloat64:
		v.F = math.Float64frombits(binary.LittleEndian.Uint64(b))
	}
	return v
}

// appendScalar appends the little-endian encoding of a scalar value.
func appendScalar(b []byte, v Value) []byte {
	switch v.Type {
	case TypeUint8:
		return append(b, byte(v.U))
	case TypeBool:
		if v.U != 0 {
			return append(b, 1)
		}
		return append(b, 0)
	case TypeInt8:
		return append(b, byte(v.I))
	case TypeUint16:
		return binary.LittleEndian.AppendUint16(b, uint16(v.U))
	case TypeInt16:
		return binary.LittleEndian.AppendUint16(b, uint16(v.I))
	case TypeUint32:
		return binary.LittleEndian.AppendUint32(b, uint32(v.U))
	case TypeInt32:
		return binary.LittleEndian.AppendUint32(b, uint32(v.I))
	case TypeFloat32:
		return binary.LittleEndian.AppendUint32(b, f64to32(v.F))
	case TypeUint64:
		return binary.LittleEndian.AppendUint64(b, v.U)
	case TypeInt64:
		return binary.LittleEndian.AppendUint64(b, uint64(v.I))
	case TypeFloat64:
		return binary.LittleEndian.AppendUint64(b, math.Float64bits(v.F))
	}
	return b
}

// f32to64 widens the bits of a float32 to a float64 exactly, NaN payloads
// included: the hardware conversion quiets a signalling NaN, which would make
// a file's f32 metadata change when it is read and written back.
func f32to64(b uint32) float64 {
	if b&0x7f800000 == 0x7f800000 && b&0x007fffff != 0 {
		return math.Float64frombits(uint64(b>>31)<<63 | 0x7ff<<52 | uint64(b&0x007fffff)<<29)
	}
	return float64(math.Float32frombits(b))
}

// f64to32 narrows a float64 to the bits of a float32, the inverse of f32to64
// for every value f32to64 returns. A NaN keeps its sign and the top 23 bits of
// its payload (a NaN whose payload is all in the low bits becomes a quiet NaN).
func f64to32(f float64) uint32 {
	if f != f {
		b := math.Float64bits(f)
		m := uint32(b>>29) & 0x007fffff
		if m == 0 {
			m = 0x00400000
		}
		return uint32(b>>63)<<31 | 0x7f800000 | m
	}
	return math.Float32bits(float32(f))
}

// scalarArray builds a numeric array value from scalar values of type t.
func scalarArray(t ValueType, n int, elem func(i int) Value) Value {
	raw := make([]byte, 0, n*t.scalarSize())
	for i := 0; i < n; i++ {
		raw = appendScalar(raw, elem(i))
	}
	return Value{Type: TypeArray, ElemType: t, Count: uint64(n), Raw: raw}
}

// Constructors used when writing files.

// U8 returns a u8 value.
func U8(x uint8) Value { return Value{Type: TypeUint8, U: uint64(x)} }

// I8 returns an i8 value.
func I8(x int8) Value { return Value{Type: TypeInt8, I: int64(x)} }

// U16 returns a u16 value.
func U16(x uint16) Value { return Value{Type: TypeUint16, U: uint64(x)} }

// I16 returns an i16 value.
func I16(x int16) Value { return Value{Type: TypeInt16, I: int64(x)} }

// I64 returns an i64 value.
func I64(x int64) Value { return Value{Type: TypeInt64, I: x} }

// F64 returns an f64 value.
func F64(x float64) Value { return Value{Type: TypeFloat64, F: x} }

// U32 returns a u32 value.
func U32(x uint32) Value { return Value{Type: TypeUint32, U: uint64(x)} }

// U64 returns a u64 value.
func U64(x uint64) Value { return Value{Type: TypeUint64, U: x} }

// I32 returns an i32 value.
func I32(x int32) Value { return Value{Type: TypeInt32, I: int64(x)} }

// F32 returns an f32 value.
func F32(x float32) Value { return Value{Type: TypeFloat32, F: f32to64(math.Float32bits(x))} }

// Bool returns a bool value.
func Bool(b bool) Value {
	v := Value{Type: TypeBool}
	if b {
		v.U = 1
	}
	return v
}

// Str returns a string value.
func Str(s string) Value { return Value{Type: TypeString, S: s} }

// StrArray returns an array of strings.
func StrArray(s []string) Value {
	return Value{Type: TypeArray, ElemType: TypeString, Count: uint64(len(s)), Strings: s}
}

// U32Array returns an array of u32.
func U32Array(xs []uint32) Value {
	return scalarArray(TypeUint32, len(xs), func(i int) Value { return U32(xs[i]) })
}

// I32Array returns an array of i32.
func I32Array(xs []int32) Value {
	return scalarArray(TypeInt32, len(xs), func(i int) Value { return I32(xs[i]) })
}

// F32Array returns an array of f32.
func F32Array(xs []float32) Value {
	return scalarArray(TypeFloat32, len(xs), func(i int) Value { return F32(xs[i]) })
}

// isUnsigned reports whether the scalar type stores its payload in U.
func isUnsigned(t ValueType) bool {
	switch t {
	case TypeUint8, TypeUint16, TypeUint32, TypeUint64, TypeBool:
		return true
	}
	return false
}

func isSigned(t ValueType) bool {
	switch t {
	case TypeInt8, TypeInt16, TypeInt32, TypeInt64:
		return true
	}
	return false
}

func isFloat(t ValueType) bool { return t == TypeFloat32 || t == TypeFloat64 }

// AsUint64 converts any integer scalar (or bool) to uint64, failing for
// negative values and non-integer types.
func (v Value) AsUint64() (uint64, error) {
	switch {
	case isUnsigned(v.Type):
		return v.U, nil
	case isSigned(v.Type):
		if v.I < 0 {
			return 0, fmt.Errorf("value %d is negative", v.I)
		}
		return uint64(v.I), nil
	}
	return 0, fmt.Errorf("value of type %s is not an integer", v.Type)
}

// AsUint32 converts any integer scalar to uint32, failing when out of range.
func (v Value) AsUint32() (uint32, error) {
	x, err := v.AsUint64()
	if err != nil {
		return 0, err
	}
	if x > math.MaxUint32 {
		return 0, fmt.Errorf("value %d does not fit in u32", x)
	}
	return uint32(x), nil
}

// AsInt64 converts any integer scalar to int64, failing when out of range.
func (v Value) AsInt64() (int64, error) {
	switch {
	case isSigned(v.Type):
		return v.I, nil
	case isUnsigned(v.Type):
		if v.U > math.MaxInt64 {
			return 0, fmt.Errorf("value %d does not fit in i64", v.U)
		}
		return int64(v.U), nil
	}
	return 0, fmt.Errorf("value of type %s is not an integer", v.Type)
}

// AsFloat64 converts a float or integer scalar to float64.
func (v Value) AsFloat64() (float64, error) {
	switch {
	case isFloat(v.Type):
		return v.F, nil
	case isSigned(v.Type):
		return float64(v.I), nil
	case v.Type == TypeBool:
		return 0, fmt.Errorf("value of type bool is not a number")
	case isUnsigned(v.Type):
		return float64(v.U), nil
	}
	return 0, fmt.Errorf("value of type %s is not a number", v.Type)
}

// AsBool returns a bool value (integers are not accepted).
func (v Value) AsBool() (bool, error) {
	if v.Type != TypeBool {
		return false, fmt.Errorf("value of type %s is not a bool", v.Type)
	}
	return v.U != 0, nil
}

// AsString returns a string value.
func (v Value) AsString() (string, error) {
	if v.Type != TypeString {
		return "", fmt.Errorf("value of type %s is not a string", v.Type)
	}
	return v.S, nil
}

// AsStrings returns the elements of an array of strings.
func (v Value) AsStrings() ([]string, error) {
	if v.Type != TypeArray || v.ElemType != TypeString {
		return nil, fmt.Errorf("value of type %s is not an array of strings", v.describe())
	}
	return v.Strings, nil
}

// AsUint32s converts an array of integers to []uint32.
func (v Value) AsUint32s() ([]uint32, error) {
	if v.Type != TypeArray || v.ElemType == TypeString {
		return nil, fmt.Errorf("value of type %s is not an array of integers", v.describe())
	}
	out := make([]uint32, v.Len())
	for i := range out {
		x, err := v.Elem(i).AsUint32()
		if err != nil {
			return nil, fmt.Errorf("element %d: %w", i, err)
		}
		out[i] = x
	}
	return out, nil
}

// AsInt32s converts an array of integers to []int32.
func (v Value) AsInt32s() ([]int32, error) {
	if v.Type != TypeArray || v.ElemType == TypeString {
		return nil, fmt.Errorf("value of type %s is not an array of integers", v.describe())
	}
	out := make([]int32, v.Len())
	for i := range out {
		x, err := v.Elem(i).AsInt64()
		if err != nil {
			return nil, fmt.Errorf("element %d: %w", i, err)
		}
		if x < math.MinInt32 || x > math.MaxInt32 {
			return nil, fmt.Errorf("element %d: value %d does not fit in i32", i, x)
		}
		out[i] = int32(x)
	}
	return out, nil
}

// AsFloat32s converts an array of numbers to []float32.
func (v Value) AsFloat32s() ([]float32, error) {
	if v.Type != TypeArray || v.ElemType == TypeString {
		return nil, fmt.Errorf("value of type %s is not an array of numbers", v.describe())
	}
	out := make([]float32, v.Len())
	for i := range out {
		x, err := v.Elem(i).AsFloat64()
		if err != nil {
			return nil, fmt.Errorf("element %d: %w", i, err)
		}
		out[i] = float32(x)
	}
	return out, nil
}

func (v Value) describe() string {
	if v.Type == TypeArray {
		return "array of " + v.ElemType.String()
	}
	return v.Type.String()
}

// Format renders the value for humans; arrays longer than maxElems are
// abbreviated with their length.
func (v Value) Format(maxElems int) string {
	switch {
	case v.Type == TypeBool:
		return fmt.Sprint(v.U != 0)
	case isUnsigned(v.Type):
		return fmt.Sprint(v.U)
	case isSigned(v.Type):
		return fmt.Sprint(v.I)
	case v.Type == TypeFloat32:
		return fmt.Sprint(float32(v.F))
	case v.Type == TypeFloat64:
		return fmt.Sprint(v.F)
	case v.Type == TypeString:
		return fmt.Sprintf("%q", v.S)
	case v.Type == TypeArray:
		n := v.Len()
		s := fmt.Sprintf("[%s × %d]", v.ElemType, n)
		shown := min(n, maxElems)
		if shown == 0 {
			return s
		}
		s += " ["
		for i := 0; i < shown; i++ {
			if i > 0 {
				s += ", "
			}
			s += v.Elem(i).Format(maxElems)
		}
		if shown < n {
			s += ", …"
		}
		return s + "]"
	}
	return "?"
}
