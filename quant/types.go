// Package quant implements the ggml tensor block formats that DeepSeek V4
// GGUF files use: their byte layouts, dequantization, dot products against
// activations, and quantization.
//
// Type ids, block sizes and block byte sizes are facts of the ggml/GGUF
// format (ggml.h enum ggml_type and the type traits table); they are listed
// here for every type a GGUF file may declare, so that a reader can size
// any tensor, even one whose format this package cannot decode.
package quant

import (
	"fmt"
	"math/bits"
)

// Type is a ggml tensor element type, numbered as in GGUF files.
type Type uint32

// The ggml type ids. Gaps are ids that ggml retired.
const (
	F32     Type = 0
	F16     Type = 1
	Q4_0    Type = 2
	Q4_1    Type = 3
	Q5_0    Type = 6
	Q5_1    Type = 7
	Q8_0    Type = 8
	Q8_1    Type = 9
	Q2_K    Type = 10
	Q3_K    Type = 11
	Q4_K    Type = 12
	Q5_K    Type = 13
	Q6_K    Type = 14
	Q8_K    Type = 15
	IQ2_XXS Type = 16
	IQ2_XS  Type = 17
	IQ3_XXS Type = 18
	IQ1_S   Type = 19
	IQ4_NL  Type = 20
	IQ3_S   Type = 21
	IQ2_S   Type = 22
	IQ4_XS  Type = 23
	I8      Type = 24
	I16     Type = 25
	I32     Type = 26
	I64     Type = 27
	F64     Type = 28
	IQ1_M   Type = 29
	BF16    Type = 30
	TQ1_0   Type = 34
	TQ2_0   Type = 35
	MXFP4   Type = 39
)

// QK_K is the number of values in one K-quant / IQ super-block.
const QK_K = 256

type typeInfo struct {
	name       string
	blockSize  int // values per block
	blockBytes int // bytes per block
}

var typeTable = map[Type]typeInfo{
	F32:     {"F32", 1, 4},
	F16:     {"F16", 1, 2},
	Q4_0:    {"Q4_0", 32, 18},
	Q4_1:    {"Q4_1", 32, 20},
	Q5_0:    {"Q5_0", 32, 22},
	Q5_1:    {"Q5_1", 32, 24},
	Q8_0:    {"Q8_0", 32, 34},
	Q8_1:    {"Q8_1", 32, 36},
	Q2_K:    {"Q2_K", QK_K, 84},
	Q3_K:    {"Q3_K", QK_K, 110},
	Q4_K:    {"Q4_K", QK_K, 144},
	Q5_K:    {"Q5_K", QK_K, 176},
	Q6_K:    {"Q6_K", QK_K, 210},
	Q8_K:    {"Q8_K", QK_K, 292},
	IQ2_XXS: {"IQ2_XXS", QK_K, 66},
	IQ2_XS:  {"IQ2_XS", QK_K, 74},
	IQ3_XXS: {"IQ3_XXS", QK_K, 98},
	IQ1_S:   {"IQ1_S", QK_K, 50},
	IQ4_NL:  {"IQ4_NL", 32, 18},
	IQ3_S:   {"IQ3_S", QK_K, 110},
	IQ2_S:   {"IQ2_S", QK_K, 82},
	IQ4_XS:  {"IQ4_XS", QK_K, 136},
	I8:      {"I8", 1, 1},
	I16:     {"I16", 1, 2},
	I32:     {"I32", 1, 4},
	I64:     {"I64", 1, 8},
	F64:     {"F64", 1, 8},
	IQ1_M:   {"IQ1_M", QK_K, 56},
	BF16:    {"BF16", 1, 2},
	TQ1_0:   {"TQ1_0", QK_K, 54},
	TQ2_0:   {"TQ2_0", QK_K, 66},
	MXFP4:   {"MXFP4", 32, 17},
}

// Known reports whether t is a ggml type this package can size.
func (t Type) Known() bool {
	_, ok := typeTable[t]
	return ok
}

// String returns the ggml name of the type (e.g. "Q8_0"), or "type(N)".
func (t Type) String() string {
	if info, ok := typeTable[t]; ok {
		return info.name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// BlockSize is the number of values one block of t holds (1 for plain types).
// It is 0 for an unknown type.
func (t Type) BlockSize() int { return typeTable[t].blockSize }

// BlockBytes is the size in bytes of one block of t. It is 0 for an unknown type.
func (t Type) BlockBytes() int { return typeTable[t].blockBytes }

// ParseType returns the Type whose ggml name is s (case-sensitive, e.g. "IQ2_XXS").
func ParseType(s string) (Type, error) {
	for t, info := range typeTable {
		if info.name == s {
			return t, nil
		}
	}
	return 0, fmt.Errorf("quant: unknown type name %q", s)
}

// RowBytes returns the byte size of a row of n values of type t. It fails for
// an unknown type or when n is not a whole number of blocks.
func (t Type) RowBytes(n int64) (int64, error) {
	info, ok := typeTable[t]
	if !ok {
		return 0, fmt.Errorf("quant: unknown tensor type %d", uint32(t))
	}
	if n < 0 {
		return 0, fmt.Errorf("quant: negative row length %d", n)
	}
	if n%int64(info.blockSize) != 0 {
		return 0, fmt.Errorf("quant: row of %d values is not a multiple of the %s block size %d", n, info.name, info.blockSize)
	}
	return n / int64(info.blockSize) * int64(info.blockBytes), nil
}

// TensorBytes returns the byte size of a tensor of type t with the given
// dimensions (dims[0] is the row length, ggml's ne[0]). It reports overflow
// past 2^63 as an error rather than wrapping.
func (t Type) TensorBytes(dims []uint64) (uint64, error) {
	if len(dims) == 0 {
		return 0, fmt.Errorf("quant: tensor with no dimensions")
	}
	info, ok := typeTable[t]
	if !ok {
		return 0, fmt.Errorf("quant: unknown tensor type %d", uint32(t))
	}
	if dims[0]%uint64(info.blockSize) != 0 {
		return 0, fmt.Errorf("quant: row of %d values is not a multiple of the %s block size %d", dims[0], info.name, info.blockSize)
	}
	total := dims[0] / uint64(info.blockSize) * uint64(info.blockBytes)
	for _, d := range dims[1:] {
		hi, lo := bits.Mul64(total, d)
		if hi != 0 || lo > 1<<63 {
			return 0, fmt.Errorf("quant: tensor size overflows (dims %v, type %s)", dims, info.name)
		}
		total = lo
	}
	return total, nil
}
