package engine

import (
	"errors"

	"ds4go/model"
)

// SubBlock names one of the two hyper-connected halves of a transformer
// block: the attention sub-block and the feed-forward (MoE) sub-block.
type SubBlock uint8

// The two sub-blocks of a layer, in the order the forward pass runs them.
const (
	AttnSub SubBlock = iota
	FFNSub
)

func (s SubBlock) String() string {
	if s == AttnSub {
		return "attn"
	}
	return "ffn"
}

// Backend runs the math of the DeepSeek V4 forward pass for one loaded model.
// The engine owns the schedule (which tokens, which positions, which layers,
// in which chunks); a backend owns the weights, the activations of a chunk
// (a Batch) and the per-session KV state (a State), all as opaque handles, so
// that a GPU backend can keep them in device memory and fuse or capture the
// work of each op however it likes.
//
// The ops are coarse on purpose: one call covers a whole sub-block of one
// layer for every token of the chunk. A forward pass over a chunk of n tokens
// at positions pos … pos+n−1 is exactly:
//
//	Embed(b, pos, tokens)
//	for layer := 0 .. Layers−1:
//	    HCPre(b, layer, AttnSub); Attention(b, st, layer); HCPost(b, layer, AttnSub)
//	    HCPre(b, layer, FFNSub);  FFN(b, layer);           HCPost(b, layer, FFNSub)
//	Head(b, rows, logits)
//
// Contracts every implementation keeps:
//   - Tokens of a chunk are causal: token t sees positions ≤ pos+t only, and
//     its results do not depend on how the sequence was cut into chunks
//     (the CPU backend is bit-for-bit chunking-invariant; a GPU backend may
//     differ by rounding).
//   - Attention reads the KV state of positions < pos and writes that of the
//     chunk's positions. All KV state is addressed by position or by
//     compressed-row index (StatePart); nothing else about the past is kept,
//     which is what lets the engine rewind, snapshot and restore sessions.
//   - Ops on different Batch/State handles may run concurrently; ops on the
//     same handles are called sequentially.
//
// backend/cpu is the reference implementation.
type Backend interface {
	// Name identifies the backend ("cpu", "cuda", …).
	Name() string
	// Config returns the model's hyperparameters.
	Config() *model.Config

	// NewState allocates an empty KV state with the given layout.
	NewState(layout *StateLayout) (State, error)
	// NewBatch allocates the activations of a chunk of up to maxTokens tokens.
	NewBatch(maxTokens int) (Batch, error)

	// Embed starts a chunk: the tokens at positions pos, pos+1, … become
	// the chunk's hyper-connection streams (each token's embedding row copied
	// into every stream). The tokens have been range-checked by the engine.
	Embed(b Batch, pos int, tokens []int32) error
	// HCPre mixes the streams into the sub-block input (hyper-connection
	// pre-weights from the Sinkhorn-normalised mixing) and applies the
	// sub-block's RMSNorm; it keeps the post-weights and combination matrix
	// for HCPost.
	HCPre(b Batch, layer int, sub SubBlock) error
	// Attention runs the attention sub-block on the sub-block input: query
	// LoRA, the shared KV row, the compressor(s) and indexer of compressed
	// layers, sparse attention with sinks over the window and the compressed
	// rows, inverse RoPE and the grouped output projection. It updates st for
	// the chunk's positions.
	Attention(b Batch, st State, layer int) error
	// FFN runs the MoE sub-block (router, routed experts, shared expert).
	FFN(b Batch, layer int) error
	// HCPost folds the sub-block output back into the streams.
	HCPost(b Batch, layer int, sub SubBlock) error
	// Head computes the output head (hyper-connection head, final norm and
	// the vocabulary projection) for the listed chunk rows (indices into the
	// chunk, ascending) into logits, len(rows)×Vocab values.
	Head(b Batch, rows []int, logits []float32) error

	// ReadState copies n entries of one part of a layer's state, starting at
	// position (or compressed-row index) first, into dst (n×width values,
	// width = StateLayout.Width). The engine only asks for entries it knows
	// to be retained (StateLayout describes what a state retains).
	ReadState(st State, layer int, part StatePart, first, n int, dst []float32) error
	// WriteState stores entries read by ReadState (snapshot restore).
	WriteState(st State, layer int, part StatePart, first, n int, src []float32) error
}

// State is a backend's per-session KV state (see StatePart).
type State interface {
	// Release frees the state's memory; the handle is unusable afterwards.
	Release()
}

// Batch is a backend's activations of one chunk.
type Batch interface {
	// Release frees the batch's memory; the handle is unusable afterwards.
	Release()
}

// Activation names an activation of the current chunk that an Inspector
// can read (for tests and debugging).
type Activation uint8

// Activations of a chunk, each with n rows.
const (
	// ActStreams is the hyper-connection streams, HC×Embed values per token.
	ActStreams Activation = iota
	// ActSubIn is the current sub-block's input after HCPre (mixing and
	// RMSNorm), Embed values per token.
	ActSubIn
	// ActSubOut is the current sub-block's output (before HCPost), Embed
	// values per token.
	ActSubOut
	// ActHeadIn is the head's input after the last Head call (hyper-connection
	// head and final norm), Embed values per token, for every chunk row.
	ActHeadIn
)

// Inspector is implemented by backends that can copy activations of a chunk
// back to the host (used by Session tracing).
type Inspector interface {
	ReadActivation(b Batch, a Activation, dst []float32) error
}

// Fingerprinter is implemented by backends that can identify their weights;
// snapshots record the value and refuse to restore under different weights.
type Fingerprinter interface {
	WeightsFingerprint() []byte
}

// DraftCoster is implemented by backends that know what speculative
// decoding's verification costs them. DraftPassCost is the time of a
// two-token pass that commits no draft, in the passes of paused speculation
// (one-token steps, every few checking their draft; more than 1):
// verification pays from an acceptance of about DraftPassCost − 1, where
// the session's policy pauses it (without it: 1.25, the CUDA backend's fast
// mode, cuda/NOTES.md v47).
type DraftCoster interface {
	DraftPassCost() float64
}

// DraftDepthCoster is implemented by backends that know what verifying
// passes of deeper drafts cost them (Options.DraftDepth). DraftDepthCost is
// the time of a verifying pass of k ≥ 1 drafts, drafting included, in
// DraftCoster's unit (one-token passes), or 0 where the backend has not
// measured it. With it a session drafts, pass by pass, as many tokens (up
// to Options.DraftDepth) as give the most tokens per cost at the measured
// acceptance rate — one where deeper passes do not pay — unless
// Options.DraftAlways (Session.DecodeGreedy).
type DraftDepthCoster interface {
	DraftDepthCost(k int) float64
}

// ChunkSizer is implemented by backends whose prefill wants another chunk
// size than DefaultChunkSize (Options.ChunkSize ≤ 0 takes it).
type ChunkSizer interface {
	// PreferredChunk is the prefill chunk size, in tokens.
	PreferredChunk() int
}

// GreedyPipeliner is implemented by backends that can take a decode step's
// greedy choice on the device and feed it to the next step without a round
// trip through the host, so that the host queues step k+1 while the device
// still runs step k (Session.DecodeGreedy). A one-token chunk queued this
// way runs the same ops, in the same order, as Embed … Head.
type GreedyPipeliner interface {
	// HeadGreedy is Head for the one row of a one-token chunk, without
	// waiting for it: the logits stay on the device, and their greedy choice
	// (as Greedy picks it) becomes the token of the next EmbedGreedy on b and
	// a result for GreedyToken.
	HeadGreedy(b Batch) error
	// EmbedGreedy is Embed of a one-token chunk at pos whose token is the
	// choice of the latest HeadGreedy on b, read on the device.
	EmbedGreedy(b Batch, pos int) error
	// GreedyToken waits for the oldest HeadGreedy on b whose choice it has
	// not returned yet, and returns that choice.
	GreedyToken(b Batch) (int32, error)
	// GreedyLogits waits for b's queued work and copies the logits of the
	// latest HeadGreedy on b (back 0) or of the one before it (back 1) into
	// dst (Vocab values).
	GreedyLogits(b Batch, back int, dst []float32) error
}

// Drafter is implemented by backends whose weights may carry the model's
// multi-token-prediction (MTP) block (model.MTP), the draft head of
// speculative decoding. The block runs through the layer ops with layer
// index Config().Layers on a batch of its own and a State allocated with
// an MTP layout (StateLayout.MTP):
//
//	StageMTP(mb, b, …)         after a main chunk's layers, before its Head
//	MTPEmbed(mb, pos, tokens)
//	HCPre(mb, L, AttnSub); Attention(mb, mst, L); HCPost(mb, L, AttnSub)
//	HCPre(mb, L, FFNSub);  FFN(mb, L);            HCPost(mb, L, FFNSub)
//	MTPHead(mb, rows, logits)                     (only when drafting)
//
// Row t of an MTP chunk at pos is the block's input at position pos+t: the
// main model's output streams at pos+t (staged) and the token at pos+t+1;
// its logits predict the token at pos+t+2.
type Drafter interface {
	// HasMTP reports whether the weights carry an MTP block; without one
	// the other methods fail.
	HasMTP() bool
	// StageMTP appends rows [first, first+n) of the main batch src's
	// streams, as they are after the last layer, to mb's staged rows, which
	// MTPEmbed consumes oldest first. A batch stages at most its capacity.
	StageMTP(mb, src Batch, first, n int) error
	// DropStagedMTP forgets mb's staged rows after the first keep.
	DropStagedMTP(mb Batch, keep int) error
	// MTPEmbed starts an MTP chunk on mb at positions pos, pos+1, …: row t
	// is e_proj(enorm(embed(tokens[t]))) added to h_proj(hnorm(·)) of each
	// stream of the t-th oldest staged row; those rows are consumed.
	MTPEmbed(mb Batch, pos int, tokens []int32) error
	// MTPHead is Head with the MTP block's hyper-connection head and norm
	// (and the model's vocabulary projection).
	MTPHead(mb Batch, rows []int, logits []float32) error
}

// SpecPipeliner is implemented by Drafters that can run speculative
// decoding's pass (Options.Draft) with its greedy choices made on the
// device: the MTP block's draft goes from its head into the verification
// chunk without the host, and the host reads three tokens a pass instead of
// the logits of three rows. A pass queued this way runs the same ops, in
// the same order, as the one through MTPHead, Embed and Head
// (Session.DecodeGreedy):
//
//	MTPEmbedDraft(mb, …); the block's layer ops; MTPHeadDraft(mb, b, row)
//	EmbedDraft(b, pos, tok); the layers; StageMTP(mb, b, …); HeadVerify(b)
//	VerifyResult(b)
//
// A pass that only checks its draft (speculation paused: Options.
// DraftAlways) embeds the one-token chunk [tok] with EmbedAfterDraft
// instead; its HeadVerify takes that one row. A paused run's steps between
// such passes draft nothing: Embed(b, pos, [tok]); the layers; StageMTP;
// HeadVerify(b); VerifyResult(b) (its draft meaningless).
type SpecPipeliner interface {
	// MTPEmbedDraft is MTPEmbed of an MTP chunk that MTPHeadDraft ends
	// (the backend may queue the chunk's work as one unit).
	MTPEmbedDraft(mb Batch, pos int, tokens []int32) error
	// MTPHeadDraft is MTPHead for row of mb's chunk, its logits kept on the
	// device: their greedy choice (as Greedy picks it) is the draft the next
	// EmbedDraft on the main batch b embeds.
	MTPHeadDraft(mb, b Batch, row int) error
	// EmbedDraft is Embed of the two-token chunk [tok, draft] at pos on b,
	// the draft being the latest MTPHeadDraft's choice, read on the device.
	EmbedDraft(b Batch, pos int, tok int32) error
	// EmbedAfterDraft is Embed of the one-token chunk [tok] at pos on b
	// after the latest MTPHeadDraft, whose draft is not embedded but
	// returned by the next VerifyResult: a pass that only checks the draft
	// against the greedy choice after tok.
	EmbedAfterDraft(b Batch, pos int, tok int32) error
	// HeadVerify is Head for every row of b's chunk (two after EmbedDraft,
	// one after EmbedAfterDraft or a one-token Embed), the logits kept on
	// the device, with the greedy choice after each row queued for
	// VerifyResult.
	HeadVerify(b Batch) error
	// VerifyResult waits for the latest HeadVerify on b and returns its
	// chunk's draft and the greedy choices after its rows (after1 is
	// meaningless after a one-token chunk).
	VerifyResult(b Batch) (draft, after0, after1 int32, err error)
	// VerifyLogits waits for b's queued work and copies the logits of row
	// (0 or 1; 0 after a one-token chunk; up to k after a DeepSpecPipeliner's
	// chunk of k drafts) of the latest HeadVerify on b into dst (Vocab
	// values).
	VerifyLogits(b Batch, row int, dst []float32) error
}

// DeepSpecPipeliner is implemented by SpecPipeliners that also queue
// passes of several drafts (Options.DraftDepth) on the device. After the
// first draft (MTPEmbedDraft … MTPHeadDraft, as SpecPipeliner's pass), each
// next one runs the block again at the next position over its own output
// streams of the chunk's row before, with the draft before as its token,
// read on the device:
//
//	StageMTP(mb, mb, row, 1); MTPEmbedNext(mb, b, pos); the block's layer ops; MTPHeadDraft(mb, b, 0)
//
// EmbedDraft then embeds [tok, d_1, …, d_k]: every draft of the
// MTPHeadDraft calls since the last embed on b; HeadVerify takes its k + 1
// rows, and VerifyResults returns the drafts and the greedy choices after
// each row. A pass of one draft runs exactly as SpecPipeliner's.
type DeepSpecPipeliner interface {
	SpecPipeliner
	// PassDrafts is the most drafts a pass can embed (≥ 1).
	PassDrafts() int
	// MTPEmbedNext is MTPEmbedDraft of the one-token chunk at pos whose
	// token is the latest MTPHeadDraft's draft for b, read on the device;
	// its staged row is the one before it consumes, as for MTPEmbed.
	MTPEmbedNext(mb, b Batch, pos int) error
	// VerifyResults waits for the latest HeadVerify on b and copies the
	// drafts its chunk embedded into drafts (at most that many) and the
	// greedy choices after its rows into choices (at most its rows).
	VerifyResults(b Batch, drafts, choices []int32) error
}

// SpecCandidater is implemented by SpecPipeliners whose verification head
// can also find min-p's candidates of its rows on the device, so that a
// sampled speculative pass (DecodePicked with Options.Draft and a
// PickFilter) downloads and draws from a few values instead of rows of the
// vocabulary.
type SpecCandidater interface {
	// SetVerifyFilter makes the following HeadVerify calls on b find each
	// row's min-p candidates under f; nil stops it.
	SetVerifyFilter(b Batch, f *PickFilter) error
	// VerifyCandidates returns the candidates of row (below the chunk's
	// rows: 1 + its drafts) of the latest HeadVerify on b, which
	// VerifyResult (or VerifyResults) has waited for; nil when that
	// head had no filter or found more candidates than the backend sends
	// (VerifyLogits then fetches the row). Valid until the next HeadVerify.
	VerifyCandidates(b Batch, row int) (*Candidates, error)
}

// ErrPickAhead is returned (wrapped) by a PickPipeliner's ops on a step
// queued with EmbedPicked that cannot run before its token is known.
var ErrPickAhead = errors.New("engine: the step cannot be queued before its token is known")

// PickPipeliner is implemented by backends that can queue a decode step
// before the host has chosen its token: the step waits for the token on the
// device, and the host gives it with SupplyToken once it has chosen it from
// the previous step's logits (Session.DecodePicked). The host then records
// and queues step k+1 while the device still runs step k, and the device
// waits between tokens only for the logits' download and the host's choice.
// A one-token chunk queued this way runs the same ops, in the same order, as
// Embed … Head.
type PickPipeliner interface {
	// HeadPicked is Head for the one row of a one-token chunk, without
	// waiting for it: the logits are copied to the host as the step ends,
	// for PickedLogits. With a filter the backend may find min-p's
	// candidates under it on the device and copy only those.
	HeadPicked(b Batch, f *PickFilter) error
	// EmbedPicked is Embed of a one-token chunk at pos whose token is not
	// known yet: the device waits for the next SupplyToken on b. At most one
	// EmbedPicked on b waits for its token at a time. The step's ops, up to
	// and including HeadPicked, may fail with ErrPickAhead when one of them
	// must wait for the device (which waits for the token); the backend has
	// then dropped the step, which the engine runs again once the token is
	// known (Embed … HeadPicked).
	EmbedPicked(b Batch, pos int) error
	// SupplyToken gives the EmbedPicked on b that waits for its token that
	// token. A step that will be discarded must still be given one (any id
	// in the vocabulary), or the device waits for it until the backend's
	// time limit.
	SupplyToken(b Batch, tok int32) error
	// PickedLogits waits for the oldest HeadPicked on b whose logits it has
	// not returned yet and returns them: all of them (Vocab values), or
	// min-p's candidates under its filter (dense nil). Both are owned by the
	// backend, valid until the second HeadPicked queued after that one runs.
	PickedLogits(b Batch) (dense []float32, cand *Candidates, err error)
	// PickedAll copies all the logits of the HeadPicked whose logits
	// PickedLogits returned last into dst (Vocab values). It may be called
	// until a step queued after that one is given its token.
	PickedAll(b Batch, dst []float32) error
}
