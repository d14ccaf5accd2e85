// Package cuda runs ds4go's kernels on an NVIDIA GPU through libds4cuda.so,
// a shared library built with nvcc from the repository's cuda/ directory and
// loaded at run time with purego, so the Go program needs no cgo and builds
// (CGO_ENABLED=0) and tests on machines without CUDA.
//
// Load finds the library ($DS4_CUDA_LIB, next to the executable, ./build/
// or a parent's build/); Open initialises a device. Without the library,
// Load and Open return an error wrapping ErrNotFound, and the package's
// tests skip (set DS4_CUDA_REQUIRE=1 to make them fail instead, as the GPU
// machine's script does).
//
// Weights are uploaded once (UploadWeight converts the GGUF blocks into the
// library's device layout: scales apart from the quants, 16-byte aligned).
// A product first quantizes its float32 input on the device into the
// activation format that ds4go/quant pairs with the weight type (Quantize;
// bit-exact with quant.Activation.Set), then MatMul or MatVecIDs compute
// rows of weights against it. docs/cuda.md describes layouts, numerics and
// the device workflow.
package cuda
