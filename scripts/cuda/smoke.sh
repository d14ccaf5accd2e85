#!/usr/bin/env bash
# Smoke check of the whole tree on the GPU machine, in one call (binaries
# from scripts/cuda/build-smoke.sh, carried in dev-out/final): build
# libds4cuda.so, run the CUDA backend's correctness tests, then the commands
# on --backend cuda against --backend cpu on the demo model: ds4's greedy
# answer must be byte-identical (and a seeded sampled one of a tiny model with
# an MTP block, plain and speculative), ds4-score's CUDA logits must equal the CPU's
# (a --max-p50 bound of 1e-30 fails on any difference), and ds4-server must
# answer a request on the GPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
F=dev-out/final
bash scripts/cuda/unpack-bins.sh # (binaries carried packed: PACK=1 build-smoke.sh)
OUT=${OUT:-$F/out}; mkdir -p "$OUT" build
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.txt"
# (LIB_BUILT=1: a build/libds4cuda.so built earlier in the same call is used)
{ [ -n "${LIB_BUILT:-}" ] && [ -s build/libds4cuda.so ]; } || bash scripts/cuda/build-lib.sh || exit 1
# kernels that spill, by name
bash scripts/cuda/spills.sh
export DS4_CUDA_LIB=$PWD/build/libds4cuda.so DS4_CUDA_REQUIRE=1
t0=$(date +%s)
$F/cuda.test -test.v -test.timeout 420s -test.run 'TestBackendMatchesCPU|TestGraphDecode|TestKernelVariants|TestMatMulExact|TestMatMulTensorCores|TestTopK|TestIndexScores|TestRouter|TestOps|TestMatVecIDs|TestMatMulGroupedPair|TestMatVecFlashShapes|TestMoECombine|TestFloatTensorCores|TestQuantizeActivation|TestAttentionFast|TestAttentionHalfIO|TestMatMulHalf|TestHalfModel|TestGroupedHalf|TestGroupedGLU|TestHCMixes|TestToHalfPerm32|TestSwiGLUHalf|TestSwiGLUQ8K|TestMatMulGroupedSwiGLU|TestMatVecF32|TestHadamardWarp|TestMatVecPair|TestIndexQuery|TestArgmax|TestGreedyPipeline|TestHCPostMix|TestPick|TestFastDecodeSwitches|TestMatVecFastQ8|TestMatVecDecFast|TestAttentionCluster|TestCompEmit|TestFastDecodeOptions|TestMatVecF32Half|TestMatMulQ8Out|TestChainQ8|TestMTPMatchesCPU|TestSpecPassesFlashLayers|TestWarmUp|TestWarmLayers|TestHalfCopies|TestAttentionWideChunk|TestSpecPipelinedMatchesHost|TestSpecPickedMatchesHost|TestAttentionSegmented|TestFlashLayersIndexerExact|TestFitsDevice|TestNewRefusesWhatDoesNotFit|TestAttentionTileStaging' >"$OUT/cuda-tests.log" 2>&1; echo "cuda tests: exit $? in $(( $(date +%s) - t0 )) s"; tail -3 "$OUT/cuda-tests.log"
# CLI: greedy demo answer on both backends must be identical.
for be in cpu cuda; do $F/ds4 --demo --backend $be --temp 0 --nothink -n 40 -p "Hello there" >"$OUT/ds4-$be.txt" 2>"$OUT/ds4-$be.err"; echo "ds4 --backend $be: exit $?; $(tail -1 "$OUT/ds4-$be.err")"; done
cmp "$OUT/ds4-cpu.txt" "$OUT/ds4-cuda.txt" && echo "ds4: cpu and cuda answers identical"
# CLI: a sampled answer (seed 5) of a tiny model with an MTP block, plainly
# and speculatively (--mtp-draft 2), on both backends: all four identical.
if $F/ds4-gguf synth --tiny --mtp --vocab real -o /tmp/tiny-mtp.gguf >/dev/null 2>&1; then
    for be in cpu cuda; do for d in 1 2; do
        $F/ds4 -m /tmp/tiny-mtp.gguf --backend $be --mtp-draft $d --temp 0.8 --seed 5 --nothink -n 60 -p "Hello there" >"$OUT/mtp-$be-$d.txt" 2>"$OUT/mtp-$be-$d.err"
        echo "ds4 sampled --backend $be --mtp-draft $d: exit $?; $(tail -1 "$OUT/mtp-$be-$d.err")"
    done; done
    cmp "$OUT/mtp-cpu-1.txt" "$OUT/mtp-cpu-2.txt" && cmp "$OUT/mtp-cpu-1.txt" "$OUT/mtp-cuda-1.txt" && cmp "$OUT/mtp-cpu-1.txt" "$OUT/mtp-cuda-2.txt" &&
        echo "ds4: sampled answers identical, plain and speculative, cpu and cuda"
else
    echo "ds4-gguf synth --tiny --mtp failed (is ds4-gguf in $F?)"
fi
# ds4-score: demo text on cpu as the reference, cuda against it.
if [ -x $F/ds4-score ]; then
    python3 -c "print(' '.join(['the quick brown fox jumps over the lazy dog']*120))" > "$OUT/text.txt"
    $F/ds4-score --demo --text "$OUT/text.txt" --ctx 256 --chunks 2 --save-logits "$OUT/cpu.safetensors" >"$OUT/score-cpu.txt" 2>&1; echo "score cpu: exit $?"
    $F/ds4-score --demo --backend cuda --text "$OUT/text.txt" --ctx 256 --chunks 2 --ref "$OUT/cpu.safetensors" --max-p50 1e-30 --json >"$OUT/score-cuda.json" 2>"$OUT/score-cuda.err"; echo "score cuda vs cpu: exit $?"; cat "$OUT/score-cuda.json" | head -c 600; echo
    rm -f "$OUT/cpu.safetensors"
else
    echo "ds4-score: not in $F (SET=bench builds without it): its checks skipped"
fi
# ds4-server on cuda: a greedy request (the device's greedy pipeline) and a
# sampled one with the defaults (the picked pipeline).
if [ -x $F/ds4-server ]; then
    $F/ds4-server --backend cuda --port 18099 >"$OUT/server.log" 2>&1 & sp=$!
    for i in $(seq 1 60); do curl -s localhost:18099/v1/models >/dev/null && break; sleep 0.5; done
    curl -s localhost:18099/v1/chat/completions -H 'Content-Type: application/json' -d '{"model":"deepseek-chat","messages":[{"role":"user","content":"hi"}],"max_tokens":8,"temperature":0}' | head -c 500; echo
    curl -s localhost:18099/v1/chat/completions -H 'Content-Type: application/json' -d '{"model":"deepseek-chat","messages":[{"role":"user","content":"hi"}],"max_tokens":40,"seed":3}' | head -c 500; echo
    kill $sp; wait $sp 2>/dev/null; grep -E "model loaded|generation done" "$OUT/server.log" | head -3
else
    echo "ds4-server: not in $F (SET=bench builds without it): its check skipped"
fi
