// Package engine runs the DeepSeek V4 forward pass over a Backend and keeps
// sessions: sequences of tokens with their KV state.
//
// The engine owns the schedule: which tokens go through the model, in which
// chunks, at which positions, in which layer order, when cancellation is
// checked, and what the KV state retains. A Backend (backend/cpu today, a
// CUDA backend later) owns the math and the memory: weights, the
// activations of a chunk (Batch) and the KV state (State), behind a small
// interface of coarse ops — one call per sub-block of a layer for a whole
// chunk — so that a GPU backend can keep everything device-resident, fuse
// kernels and capture graphs. A new backend implements Backend (and
// optionally Inspector and Fingerprinter) and passes the same tests as
// backend/cpu; see docs/engine.md.
//
// A Session supports chunked prefill, single-token decode, the logits of the
// next token, sampling (Sampler: greedy, temperature, top-k, top-p, min-p,
// seeded), rewinding to a shorter prefix, and snapshots to bytes that
// restore bit for bit. The KV state is addressed by position and by
// compressed-row index only (StateLayout), which is what makes rewinds and
// portable snapshots possible.
package engine
