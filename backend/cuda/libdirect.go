package cuda

import (
	"fmt"

	"github.com/ebitengine/purego"
)

// Direct calls. purego.RegisterFunc builds each entry point's Go function
// by reflection, which costs ≈ 0.5 µs a call with one argument and ≈ 1.5 µs
// with 17 (2-core development machine; purego.SyscallN: 0.15–0.2 µs). A
// decode step records ≈ 1900 kernels, one library call each, and the host
// spent ≈ 4.4 ms a token recording them on the H200 (cuda/NOTES.md v10), so
// the entry points made for every kernel whose parameters are all integers
// or device pointers (SyscallN cannot place float arguments, and Go
// pointers stay with RegisterFunc) are replaced by wrappers that call
// SyscallN. Same C functions, same arguments: only the call path differs.
// DS4_CUDA_REFLECT_CALLS=1 keeps RegisterFunc's functions, for comparison.

// arg converts an integer argument of a C function to a register value (C
// reads the low 32 bits of an int argument).
func arg[T ~int32 | ~int64 | ~uint64 | ~uintptr](v T) uintptr { return uintptr(v) }

// cint is a C int result (the low 32 bits of the first result register).
func cint(r1, _, _ uintptr) int32 { return int32(r1) }

// direct replaces the per-kernel entry points with SyscallN wrappers; sym
// returns a symbol by name (0: not loaded). A wrapper for an entry point
// that sym lacks is an error.
func (l *lib) direct(sym func(name string) uintptr) error {
	call := purego.SyscallN
	var missing []string
	f := func(name string) uintptr {
		p := sym(name)
		if p == 0 {
			missing = append(missing, name)
		}
		return p
	}

	memcpyD2DAsync, memsetAsync := f("ds4c_memcpy_d2d_async"), f("ds4c_memset_async")
	l.memcpyD2DAsync = func(dst, src uintptr, n uint64, s uintptr) int32 {
		return cint(call(memcpyD2DAsync, dst, src, arg(n), s))
	}
	l.memsetAsync = func(dst uintptr, v int32, n uint64, s uintptr) int32 {
		return cint(call(memsetAsync, dst, arg(v), arg(n), s))
	}
	streamSync, streamWaitEvent, eventRecord := f("ds4c_stream_synchronize"), f("ds4c_stream_wait_event"), f("ds4c_event_record")
	l.streamSync = func(s uintptr) int32 { return cint(call(streamSync, s)) }
	l.streamWaitEvent = func(s, e uintptr) int32 { return cint(call(streamWaitEvent, s, e)) }
	l.eventRecord = func(e, s uintptr) int32 { return cint(call(eventRecord, e, s)) }
	graphLaunch, recBegin := f("ds4c_graph_launch"), f("ds4c_rec_begin")
	l.graphLaunch = func(exec, s uintptr) int32 { return cint(call(graphLaunch, exec, s)) }
	l.recBegin = func(rec uintptr) int32 { return cint(call(recBegin, rec)) }

	quantize := f("ds4c_quantize")
	l.quantize = func(t int32, x uintptr, xStride int64, act uintptr, cols int64, nTok int32, s uintptr) int32 {
		return cint(call(quantize, arg(t), x, arg(xStride), act, arg(cols), arg(nTok), s))
	}
	matmul, matvecIDs, matmulEx := f("ds4c_matmul"), f("ds4c_matvec_ids"), f("ds4c_matmul_ex")
	l.matmul = func(t int32, w uintptr, rows, cols, nMat int64, act uintptr, actStride int64, nTok int32, y uintptr, yStride int64, s uintptr) int32 {
		return cint(call(matmul, arg(t), w, arg(rows), arg(cols), arg(nMat), act, arg(actStride), arg(nTok), y, arg(yStride), s))
	}
	l.matvecIDs = func(t int32, w uintptr, rows, cols, nMat int64, ids uintptr, nSel int32, act uintptr, actStride int64, y uintptr, yStride int64, s uintptr) int32 {
		return cint(call(matvecIDs, arg(t), w, arg(rows), arg(cols), arg(nMat), ids, arg(nSel), act, arg(actStride), y, arg(yStride), s))
	}
	l.matmulEx = func(t int32, w uintptr, rows, cols, nMat int64, ids uintptr, nSel int32, act uintptr, actTok, actSel int64, actDiv, nTok int32, y uintptr, yTok, ySel int64, flags int32, s uintptr) int32 {
		return cint(call(matmulEx, arg(t), w, arg(rows), arg(cols), arg(nMat), ids, arg(nSel), act, arg(actTok), arg(actSel), arg(actDiv), arg(nTok), y, arg(yTok), arg(ySel), arg(flags), s))
	}
	matmulQ8Out := f("ds4c_matmul_q8out")
	l.matmulQ8Out = func(t int32, w uintptr, rows, cols, nMat int64, nSel int32, act uintptr, actTok, actSel int64, actDiv, nTok int32, y, yq uintptr, flags int32, s uintptr) int32 {
		return cint(call(matmulQ8Out, arg(t), w, arg(rows), arg(cols), arg(nMat), arg(nSel), act, arg(actTok), arg(actSel), arg(actDiv), arg(nTok), y, yq, arg(flags), s))
	}
	group, matmulGroup := f("ds4c_group"), f("ds4c_matmul_grouped")
	l.group = func(ids uintptr, nSel int32, nMat int64, scratch, s uintptr) int32 {
		return cint(call(group, ids, arg(nSel), arg(nMat), scratch, s))
	}
	l.matmulGroup = func(t int32, w uintptr, rows, cols, nMat int64, ids uintptr, nSel int32, act uintptr, actSel int64, actDiv int32, y uintptr, ySel int64, scratch uintptr, flags int32, s uintptr) int32 {
		return cint(call(matmulGroup, arg(t), w, arg(rows), arg(cols), arg(nMat), ids, arg(nSel), act, arg(actSel), arg(actDiv), y, arg(ySel), scratch, arg(flags), s))
	}
	matmulPair := f("ds4c_matmul_grouped_pair")
	l.matmulPair = func(t int32, w1, w2 uintptr, rows, cols, nMat int64, ids uintptr, nSel int32, act uintptr, actSel int64, actDiv int32, y1, y2 uintptr, ySel int64, scratch uintptr, flags int32, s uintptr) int32 {
		return cint(call(matmulPair, arg(t), w1, w2, arg(rows), arg(cols), arg(nMat), ids, arg(nSel), act, arg(actSel), arg(actDiv), y1, y2, arg(ySel), scratch, arg(flags), s))
	}
	groupedHalfOK := f("ds4c_grouped_half_ok")
	l.groupedHalfOK = func(t int32, cols int64, nSel int32) int32 {
		return cint(call(groupedHalfOK, arg(t), arg(cols), arg(nSel)))
	}

	getRows, hcPost := f("ds4c_get_rows"), f("ds4c_hc_post")
	l.getRows = func(t int32, w uintptr, totalRows, cols int64, ids uintptr, n int32, dst uintptr, dstStride int64, copies int32, copyStride int64, s uintptr) int32 {
		return cint(call(getRows, arg(t), w, arg(totalRows), arg(cols), ids, arg(n), dst, arg(dstStride), arg(copies), arg(copyStride), s))
	}
	l.hcPost = func(h, out, post, comb uintptr, hc int32, d int64, n int32, s uintptr) int32 {
		return cint(call(hcPost, h, out, post, comb, arg(hc), arg(d), arg(n), s))
	}
	hcPostMix := f("ds4c_hc_post_mix")
	l.hcPostMix = func(h, out, post, comb uintptr, hc int32, d int64, fnType int32, fn uintptr, m, parts int32, part uintptr, n int32, s uintptr) int32 {
		return cint(call(hcPostMix, h, out, post, comb, arg(hc), arg(d), arg(fnType), fn, arg(m), arg(parts), part, arg(n), s))
	}
	hcPostMixMoE := f("ds4c_hc_post_mix_moe")
	l.hcPostMixMoE = func(h, ye, sel, ysh uintptr, k int32, post, comb uintptr, hc int32, d int64, fnType int32, fn uintptr, m, parts int32, part uintptr, n int32, s uintptr) int32 {
		return cint(call(hcPostMixMoE, h, ye, sel, ysh, arg(k), post, comb, arg(hc), arg(d), arg(fnType), fn, arg(m), arg(parts), part, arg(n), s))
	}
	hcPostMixEx := f("ds4c_hc_post_mix_ex")
	l.hcPostMixEx = func(h, out, ye, sel, ysh uintptr, k int32, post, comb uintptr, hc int32, d int64, fnType int32, fn uintptr, m int32, part uintptr, n int32, s uintptr) int32 {
		return cint(call(hcPostMixEx, h, out, ye, sel, ysh, arg(k), post, comb, arg(hc), arg(d), arg(fnType), fn, arg(m), part, arg(n), s))
	}
	argmax := f("ds4c_argmax")
	l.argmax = func(x uintptr, n int64, work, out, s uintptr) int32 {
		return cint(call(argmax, x, arg(n), work, out, s))
	}
	rope, fp8Sim, fp4Sim := f("ds4c_rope"), f("ds4c_fp8_sim"), f("ds4c_fp4_sim")
	l.rope = func(x uintptr, tokStride int64, heads int32, headStride, off int64, freqs uintptr, rd int32, pos0, posStep int64, nTok, inverse int32, s uintptr) int32 {
		return cint(call(rope, x, arg(tokStride), arg(heads), arg(headStride), arg(off), freqs, arg(rd), arg(pos0), arg(posStep), arg(nTok), arg(inverse), s))
	}
	l.fp8Sim = func(x uintptr, stride int64, rows int32, n int64, s uintptr) int32 {
		return cint(call(fp8Sim, x, arg(stride), arg(rows), arg(n), s))
	}
	l.fp4Sim = func(x uintptr, stride int64, rows int32, n int64, s uintptr) int32 {
		return cint(call(fp4Sim, x, arg(stride), arg(rows), arg(n), s))
	}
	addAPE, ringWrite, ringWrite2 := f("ds4c_add_ape"), f("ds4c_ring_write"), f("ds4c_ring_write2")
	l.addAPE = func(dst, ape uintptr, width int64, r int32, pos0 int64, n int32, s uintptr) int32 {
		return cint(call(addAPE, dst, ape, arg(width), arg(r), arg(pos0), arg(n), s))
	}
	l.ringWrite = func(ring uintptr, cap, width int64, src uintptr, srcStride, pos0 int64, n int32, s uintptr) int32 {
		return cint(call(ringWrite, ring, arg(cap), arg(width), src, arg(srcStride), arg(pos0), arg(n), s))
	}
	l.ringWrite2 = func(ringA, ringB uintptr, cap, width int64, srcA, srcB uintptr, srcStride, pos0 int64, n int32, s uintptr) int32 {
		return cint(call(ringWrite2, ringA, ringB, arg(cap), arg(width), srcA, srcB, arg(srcStride), arg(pos0), arg(n), s))
	}
	compPool, indexScores, topk, moeCombine := f("ds4c_comp_pool"), f("ds4c_index_scores"), f("ds4c_topk"), f("ds4c_moe_combine")
	l.compPool = func(kv, sc, kvRing, scRing uintptr, cap, cw, pos0 int64, r, coff int32, w, i0 int64, nrows int32, rows uintptr, s uintptr) int32 {
		return cint(call(compPool, kv, sc, kvRing, scRing, arg(cap), arg(cw), arg(pos0), arg(r), arg(coff), arg(w), arg(i0), arg(nrows), rows, s))
	}
	l.indexScores = func(q, w, rows uintptr, ih, ihd int32, pos0 int64, ratio, n int32, scores uintptr, scStride int64, flags int32, s uintptr) int32 {
		return cint(call(indexScores, q, w, rows, arg(ih), arg(ihd), arg(pos0), arg(ratio), arg(n), scores, arg(scStride), arg(flags), s))
	}
	l.topk = func(scores uintptr, stride, rFixed, pos0 int64, ratio, k, allIfFew int32, sel, nsel uintptr, n int32, s uintptr) int32 {
		return cint(call(topk, scores, arg(stride), arg(rFixed), arg(pos0), arg(ratio), arg(k), arg(allIfFew), sel, nsel, arg(n), s))
	}
	l.moeCombine = func(ye, sel, ysh, y uintptr, n, k int32, d int64, s uintptr) int32 {
		return cint(call(moeCombine, ye, sel, ysh, y, arg(n), arg(k), arg(d), s))
	}
	if len(missing) > 0 {
		return fmt.Errorf("cuda: direct calls to entry points not loaded: %v", missing)
	}
	return nil
}
