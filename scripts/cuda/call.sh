#!/usr/bin/env bash
# One device call for a kernel change, everything optional but the build:
# build libds4cuda.so from the tree (and any variant libraries), run chosen
# CUDA tests, an interleaved A/B of full-size decode at 8k, and ncu of
# chosen kernels with their per-instruction stall summary. Binaries come
# from `SET=bench scripts/cuda/build-smoke.sh` (ds4, ds4-bench, ds4-gguf and
# the test binary in dev-out/final, carried; the call stops at once when one
# it needs is missing):
#   run(kind="nvidia-h200", needs_h200=true, carry=["dev-out/final"],
#       command="TESTS='TestMatVecDecFast' AB='DS4_CUDA_LIB=/tmp/lib-probe.so' LIBS='probe:-DDS4_PHASE_PROBE' bash scripts/cuda/call.sh")
# (the phase probe's lines, printed on ds4-bench's stdout, are gathered into
# $OUT/probe.txt)
# Environment:
#   LIBS   ';'-separated NAME:NVFLAGS; each builds the tree's cuda/ with
#          those compiler flags into /tmp/lib-NAME.so (beside the main build)
#   BASE   a directory holding another cuda/ tree (e.g. dev-out/final/base-cuda,
#          from `git archive REF cuda | tar -x -C dev-out/final/base-cuda --strip-components=1`),
#          built into /tmp/lib-base.so
#   TESTS  a -test.run regex for the CUDA test binary (TT: its timeout,
#          default 300s; TENV: environment assignments for it)
#   REUSE=1  skip the builds when build/libds4cuda.so is there (a warm
#          machine keeps it and /tmp/lib-*.so from the call before)
#   SMOKE=1  scripts/cuda/smoke.sh first (the whole correctness check)
#   ABX    library option variants compared inside one ds4-bench process
#          (ds4-bench --ab: ';'-separated sets of DS4_CUDA_NAME=VALUE, e.g.
#          ABX='default;DS4_CUDA_ATTN_PO_VEC=1'; the full-size q2 synth at
#          FRONTIER (8192), GEN (256) tokens a run, ROUNDS (5) rounds, ARGS
#          (--fast; ' ' for exact mode); ABX_PREFILL=n also times the
#          prefill of n tokens from the frontier a run, GEN=0 only that)
#          into abx.csv / abx.log: no process start, model load or 8k
#          prefill a run, so many more rounds a call; ABX2 (with ARGS2,
#          default --fast) a second such A/B after it, into abx2.*
#          (ABX3 / ARGS3 a third, into abx3.*);
#          ABX_LIMIT each one's time limit in seconds (560); speculative
#          decoding: ARGS='--fast --mtp /dev/shm/flash-q2-mtp.gguf --accept 0.8'
#          (the MTP file is synthesised when ARGS, ARGS2 or ARGS3 names it)
#   AB     variants for scripts/cuda/ab-layers.sh on the full-size q2 synth
#          (quoted words, e.g. AB='"DS4_CUDA_LIB=/tmp/lib-base.so" DS4_CUDA_X=0');
#          ROUNDS (default 2), GEN (256), WARMUP (4096), ARGS (--fast);
#          AB_ROUNDS / AB_GEN set them for AB alone (ABX keeps ROUNDS / GEN)
#   PP     token counts (e.g. '256 1024'): TestPrefillProducts' grouped
#          expert products at those chunk sizes (DS4_CUDA_BENCH_GTOK), rows
#          matching PP_TC (default 'stage 3'), for the main library and
#          each /tmp/lib-*.so (LIBS, BASE; for the base with BASE_TEST, a test
#          binary built from the base commit, when the ABI differs), into pp.txt
#   SMALL  variants for scripts/cuda/small-ab.sh on the full-size q2 synth
#          (small chunks after a 24k prefix, SMALL_AT other prefix frontiers; ROUNDS, default 2)
#   NCU    ';'-separated kernel regexes for scripts/cuda/ncu-oplat.sh run
#          on NCU_TEST (default TestMatVecDecFast); sass-stalls.py summarises
#          each SASS CSV into $OUT/stalls.txt; an entry TEST@regex names its test
#   TABLE=s  ds4-bench --fast across 2k-32k (128 tokens a frontier, s seconds
#          at most; TABLE_FRONTIERS: other frontiers) into table.csv/.svg; TABLE2=s the same sampled with
#          ds4-server's defaults (--temp 1) into table-sampled.csv/.svg;
#          TABLE_AB: environment assignments, the TABLE run again with them
#          into table-ab.csv/.svg ('|'-separated sets: table-ab2.csv, … too);
#          TABLEX=s the greedy table in exact mode (no --fast, the CLI's and
#          the server's default) into table-exact.csv/.svg
#   MTP=RATES  speculative decoding on the full-size q2 synth with a
#          separate synthetic MTP file (ds4-gguf synth --mtp-only): ds4-bench
#          --fast --mtp at 8k (--warmup 4096, GEN tokens, default 128) with
#          drafts right at each of the comma-separated RATES, each against
#          a plain run of the same tokens (greedy; sampled with MTP_ARGS
#          '--temp 1'), into mtp.csv/mtp.log;
#          MTP_AB: environment assignments, the same run again with them
#          (MTP_AB_ARGS: and these ds4-bench flags);
#          MTP_MODE: the mode flag (default --fast; MTP_MODE= for exact
#          mode, the CLI's and the server's default);
#          MTP_ARGS: more ds4-bench flags for the first run (e.g.
#          "--cpuprofile $OUT/mtp.pprof")
#   MTP_DRAFTS  with MTP: the same run again for each listed --mtp-draft
#          value (space-separated; a trailing h adds --draft-host: the
#          engine's host path, e.g. '2h 3 4'; f runs it in fast mode, x in
#          exact mode, whatever MTP_MODE, e.g. '3f 4xh'; above 2 with
#          --draft-always, as deep as asked, unless p: as deep as the
#          engine's policy picks by the backend's costs), into mtp-dK.csv/log;
#          MTP_DRAFTS_AB: environment assignments, each run again with them
#          (into mtp-dK-ab.csv/log); MTP_DRAFTS_ARGS: more ds4-bench flags
#          for each of these runs (e.g. '--temp 1': sampled)
#   BITS=1 the bit-identity check: ds4 --dump-logprobs (40 greedy steps of
#          the full-size synth, --fast; BITS_MODE= for exact mode) with the
#          main library and each /tmp/lib-*.so (BITS_LIBS: a regex their
#          names must match), and with the main library under each of
#          BITS_AB's '|'-separated environment sets; prints each run's md5
#   COLD=1 scripts/cuda/coldstart.sh: a fresh process's 8k prompt against
#          warmed-up ones (WARMUPS, COLD_ARGS, COLD_ROUNDS; with
#          DS4_CUDA_SLOW_CALL_US=n the slow calls summed, into cold-W.log)
#   KT=1   scripts/cuda/ktrace.sh: the kernels of full-size fast decode tokens
#          at 8k as they run, into $OUT/ktrace.txt (KT_AB: an environment
#          assignment traced once more, into ktrace-ab.txt; KT_AB_CSV=1: its
#          raw CSV too, as ktrace-ab.csv.gz); KT_LAYERS: the
#          layers listed kernel by kernel (ktrace-layer.py, default "20 21")
#          into ktrace-layers.txt, the raw CSV as ktrace.csv.gz; KT_MTP=RATE:
#          the speculative run of ds4-bench --mtp --accept RATE traced
#          instead (the summary per pass; layer -1 is the MTP block's);
#          KT_EXACT=1: exact mode's decode traced instead of fast mode's;
#          KT_PLAIN=1 with KT_MTP: plain decode traced after it, its layers
#          into ktrace-layers-plain.txt; PREFILL_LINES=n (PREFILL_ARGS,
#          PREFILL_SPANS) the prompt's chunks too, into ktrace-prefill.txt
#          (with KT_AB also ktrace-prefill-ab.txt: e.g. KT_EXACT=1
#          PREFILL_LINES=40 KT_AB=DS4_CUDA_ATTN_ORDER=0, exact prefill's
#          kernels in both attention orders)
#   EDGES=1 exact speculative decoding at 80 % (EDGES_ARGS: other ds4-bench
#          flags) with DS4_CUDA_REC_EDGES=1: each built graph's incoming
#          edges per kernel function, into edges.txt (EDGES_AB: an
#          environment assignment run again, into edges-ab.txt)
# Everything lands in $OUT (at most 8 files come back): log.txt holds the
# summary lines.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-dev-out/call}; mkdir -p "$OUT"
F=dev-out/final
bash scripts/cuda/unpack-bins.sh # (binaries carried packed: PACK=1 build-smoke.sh)
exec > >(tee "$OUT/log.txt") 2>&1
t0=$(date +%s)
# the carried binaries this call needs, checked before anything is built
# (SET=bench scripts/cuda/build-smoke.sh builds them)
need=()
# (the runs on the full-size synth: they need ds4-bench, ds4-gguf and the model)
bench_runs="${AB:-}${ABX:-}${ABX2:-}${ABX3:-}${EDGES:-}${KT:-}${TABLE:-}${TABLE2:-}${TABLEX:-}${MTP:-}${COLD:-}${SMALL:-}${BITS:-}"
[ -n "${TESTS:-}${PP:-}" ] && need+=(cuda.test)
[ -n "$bench_runs" ] &&
    need+=(ds4-bench ds4-gguf)
for b in "${need[@]}"; do
    [ -x "$F/$b" ] || { echo "call.sh: $F/$b missing (build with SET=bench scripts/cuda/build-smoke.sh)"; exit 2; }
done
el() { echo "[$(( $(date +%s) - t0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
# the model, generated while the libraries build
synth=
if [ -n "$bench_runs" ]; then
    BIN=$F M=/dev/shm/flash-q2.gguf LAYERS=43 LOG=/tmp/synth.log bash scripts/cuda/synth-shm.sh >/tmp/synth.txt 2>&1 &
    synth=$!
fi
# variant libraries: copies of the tree's cuda/ (or BASE) built with their flags
build_variant() { # name dir flags
    local d=/tmp/v-$1
    rm -rf "$d"; mkdir -p "$d/scripts/cuda"; cp -r "$2" "$d/cuda"; cp scripts/cuda/build-lib.sh "$d/scripts/cuda/"
    NVFLAGS="$3" bash "$d/scripts/cuda/build-lib.sh" >"/tmp/build-$1.log" 2>&1 && cp "$d/build/libds4cuda.so" "/tmp/lib-$1.so"
    echo "variant $1 ($3): $(tail -1 /tmp/build-$1.log)"
}
pids=()
if [ -n "${REUSE:-}" ] && [ -s build/libds4cuda.so ]; then
    echo "main: reusing build/libds4cuda.so and /tmp/lib-*.so (REUSE=1, a warm machine)"
else
    IFS=';' read -ra LS <<<"${LIBS:-}"
    for l in "${LS[@]}"; do [ -n "$l" ] && { build_variant "${l%%:*}" cuda "${l#*:}" & pids+=($!); }; done
    [ -n "${BASE:-}" ] && { build_variant base "$BASE" "" & pids+=($!); }
    bash scripts/cuda/build-lib.sh >/tmp/build-main.log 2>&1; echo "main: $(tail -1 /tmp/build-main.log)"
fi
for p in "${pids[@]}"; do wait "$p"; done
if [ ! -s build/libds4cuda.so ]; then cat /tmp/build-main.log | head -40; exit 1; fi
bash scripts/cuda/spills.sh
export DS4_CUDA_LIB=$PWD/build/libds4cuda.so DS4_CUDA_REQUIRE=1
el
if [ -n "${SMOKE:-}" ]; then
    OUT=/tmp/smoke LIB_BUILT=1 bash scripts/cuda/smoke.sh >"$OUT/smoke.txt" 2>&1
    cp /tmp/smoke/cuda-tests.log "$OUT/smoke-tests.log"
    tail -14 "$OUT/smoke.txt"; el
fi
if [ -n "${TESTS:-}" ]; then
    env ${TENV:-} $F/cuda.test -test.v -test.timeout "${TT:-300s}" -test.run "$TESTS" >"$OUT/tests.log" 2>&1
    echo "tests: exit $?"; grep -E "^(--- )?FAIL|^ok|^PASS|panic|differs" "$OUT/tests.log" | head -20; el
fi
if [ -n "${PP:-}" ]; then
    for lib in build/libds4cuda.so /tmp/lib-*.so; do
        [ -s "$lib" ] || continue
        [[ $lib == /* ]] || lib=$PWD/$lib
        tb=$F/cuda.test
        [[ $lib == /tmp/lib-base.so && -n ${BASE_TEST:-} ]] && tb=$BASE_TEST
        for g in $PP; do
            echo "== $lib, $g tokens"
            DS4_CUDA_LIB=$lib DS4_CUDA_BENCH=1 DS4_CUDA_BENCH_GTOK=$g DS4_CUDA_BENCH_TC="${PP_TC:-stage 3}" \
                $tb -test.run 'TestPrefillProducts$' -test.timeout 300s 2>&1 | grep -E "prefill product|FAIL|panic"
        done
    done >"$OUT/pp.txt"
    cat "$OUT/pp.txt"; el
fi
if [ -n "${NCU:-}" ]; then
    IFS=';' read -ra NS <<<"$NCU"
    for e in "${NS[@]}"; do # TEST@regex or regex
        t=${NCU_TEST:-TestMatVecDecFast} k=$e
        [[ $e == *@* ]] && { t=${e%%@*}; k=${e#*@}; }
        echo "== ncu $t: $k"
        OUT=/tmp/ncu TEST=$t KERNELS="$k" bash scripts/cuda/ncu-oplat.sh >>/tmp/ncu.log 2>&1
    done
    grep -E "^  [a-z_ ]*void|^  k_|^  ds4|Duration|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy" /tmp/ncu/ncu-oplat.txt | head -40
    for c in /tmp/ncu/sass-*.csv; do echo "== $c"; python3 scripts/cuda/sass-stalls.py "$c" 2>&1 | head -60; done >"$OUT/stalls.txt"
    gzip -c /tmp/ncu/ncu-oplat.txt >"$OUT/ncu-oplat.txt.gz"; el
fi
if [ -n "$bench_runs" ]; then wait "$synth"; cat /tmp/synth.txt; fi
if [ -n "${SMALL:-}" ]; then OUT=$OUT bash scripts/cuda/small-ab.sh; tar -czf "$OUT/small.tgz" -C "$OUT" small && rm -rf "$OUT/small"; el; fi
if [ -n "${COLD:-}" ]; then OUT=$OUT bash scripts/cuda/coldstart.sh; el; fi
if [ -n "${MTP:-}${KT_MTP:-}${EDGES:-}" ] || [[ "${ARGS:-} ${ARGS2:-} ${ARGS3:-}" == *flash-q2-mtp.gguf* ]]; then
    $F/ds4-gguf synth --flash-q2 --mtp-only -o /dev/shm/flash-q2-mtp.gguf >/tmp/synth-mtp.log 2>&1 || tail -3 /tmp/synth-mtp.log
fi
if [ -n "${MTP:-}" ]; then
    timeout 560 $F/ds4-bench -m /dev/shm/flash-q2.gguf --mtp /dev/shm/flash-q2-mtp.gguf --accept "$MTP" --backend cuda ${MTP_MODE---fast} \
        --frontiers ${MTP_FRONTIERS:-8192} --gen ${GEN:-128} --warmup 4096 --csv "$OUT/mtp.csv" ${MTP_ARGS:-} >"$OUT/mtp.log" 2>&1
    echo "mtp: exit $?"; grep -E "speculative|error|ds4-bench: [^f]" "$OUT/mtp.log" | head -20; el
    if [ -n "${MTP_AB:-}${MTP_AB_ARGS:-}" ]; then # the same with environment assignments, into mtp-ab.csv/log
        env ${MTP_AB:-} timeout 560 $F/ds4-bench -m /dev/shm/flash-q2.gguf --mtp /dev/shm/flash-q2-mtp.gguf --accept "$MTP" --backend cuda ${MTP_MODE---fast} \
            --frontiers ${MTP_FRONTIERS:-8192} --gen ${GEN:-128} --warmup 4096 --csv "$OUT/mtp-ab.csv" ${MTP_AB_ARGS:-} >"$OUT/mtp-ab.log" 2>&1
        echo "mtp (${MTP_AB:-} ${MTP_AB_ARGS:-}): exit $?"; grep -E "speculative|error" "$OUT/mtp-ab.log" | head -20; el
    fi
    for k in ${MTP_DRAFTS:-}; do # deeper drafts (and the host path), one run each (and with MTP_DRAFTS_AB)
        kd=${k%%[hfxp]*}; da="--mtp-draft $kd"; [[ $k == *h* ]] && da="$da --draft-host"
        [ "$kd" -gt 2 ] && [[ $k != *p* ]] && da="$da --draft-always" # (as deep as asked, whatever the backend's costs; p: as the policy picks)
        mode=${MTP_MODE---fast}; [[ $k == *f* ]] && mode=--fast; [[ $k == *x* ]] && mode= # (f: fast mode, x: exact)
        for v in "" ${MTP_DRAFTS_AB:+ab}; do
            ev=; [ -n "$v" ] && ev=$MTP_DRAFTS_AB
            env $ev timeout 300 $F/ds4-bench -m /dev/shm/flash-q2.gguf --mtp /dev/shm/flash-q2-mtp.gguf --accept "$MTP" --backend cuda $mode \
                --frontiers ${MTP_FRONTIERS:-8192} --gen ${GEN:-128} --warmup 4096 --csv "$OUT/mtp-d$k${v:+-$v}.csv" $da ${MTP_DRAFTS_ARGS:-} >"$OUT/mtp-d$k${v:+-$v}.log" 2>&1
            echo "mtp ($da${ev:+ $ev}): exit $?"; grep -E "speculative|error" "$OUT/mtp-d$k${v:+-$v}.log" | head -20; el
        done
    done
fi
table() { # name seconds flags… (TABLE_MODE: --fast unless set, empty for exact mode)
    local n=$1 s=$2; shift 2
    env ${TABLE_ENV:-} timeout $((s + 30)) $F/ds4-bench -m /dev/shm/flash-q2.gguf --backend cuda ${TABLE_MODE---fast} --frontiers ${TABLE_FRONTIERS:-2048,4096,8192,16384,32768} \
        --gen 128 --time-limit "${s}s" --csv "$OUT/$n.csv" --plot "$OUT/$n.svg" "$@" >"/tmp/$n.log" 2>&1
    echo "$n: exit $?"; cat "$OUT/$n.csv"; el
}
[ -n "${TABLE:-}" ] && table table "$TABLE"
if [ -n "${TABLE:-}" ] && [ -n "${TABLE_AB:-}" ]; then # '|'-separated variants: table-ab, table-ab2, … (only the first with its plot)
    IFS='|' read -ra TVS <<<"$TABLE_AB"; i=1
    for v in "${TVS[@]}"; do
        n=table-ab; [ $i -gt 1 ] && n=table-ab$i
        echo "$n: $v"; TABLE_ENV="$v" table $n "$TABLE"; [ $i -gt 1 ] && rm -f "$OUT/$n.svg"; i=$((i + 1))
    done
fi
[ -n "${TABLE2:-}" ] && table table-sampled "$TABLE2" --temp 1
[ -n "${TABLEX:-}" ] && TABLE_MODE= table table-exact "$TABLEX"
if [ -n "${KT:-}" ]; then
    ktargs="--fast --warmup 4096"
    [ -n "${KT_EXACT:-}" ] && ktargs="--warmup 4096"
    [ -n "${KT_MTP:-}" ] && ktargs="$ktargs --mtp /dev/shm/flash-q2-mtp.gguf --accept $KT_MTP"
    OUT=/tmp/kt BENCH_ARGS="$ktargs" bash scripts/cuda/ktrace.sh >/tmp/kt.log 2>&1; cp /tmp/kt/ktrace.txt "$OUT/"
    [ -n "${PREFILL_LINES:-}" ] && cp /tmp/kt/ktrace-prefill.txt "$OUT/" # (PREFILL_ARGS, PREFILL_SPANS: ktrace.sh)
    head -30 "$OUT/ktrace.txt"
    for l in ${KT_LAYERS:-20 21}; do echo "== layer $l"; python3 scripts/cuda/ktrace-layer.py /tmp/ktrace.csv "$l"; done >"$OUT/ktrace-layers.txt" 2>&1
    gzip -c /tmp/ktrace.csv >"$OUT/ktrace.csv.gz"
    if [ -n "${KT_PLAIN:-}" ] && [ -n "${KT_MTP:-}" ]; then # plain decode traced too, its layers beside the pass's
        OUT=/tmp/kt3 BENCH_ARGS="--fast --warmup 4096" bash scripts/cuda/ktrace.sh >/tmp/kt3.log 2>&1; cp /tmp/kt3/ktrace.txt "$OUT/ktrace-plain.txt"
        for l in ${KT_LAYERS:-20 21}; do [ "$l" -ge 0 ] && { echo "== layer $l"; python3 scripts/cuda/ktrace-layer.py /tmp/ktrace.csv "$l"; }; done >"$OUT/ktrace-layers-plain.txt" 2>&1
    fi
    if [ -n "${KT_AB:-}" ]; then
        env $KT_AB OUT=/tmp/kt2 BENCH_ARGS="$ktargs" bash scripts/cuda/ktrace.sh >/tmp/kt2.log 2>&1; cp /tmp/kt2/ktrace.txt "$OUT/ktrace-ab.txt"
        [ -n "${KT_AB_CSV:-}" ] && gzip -c /tmp/ktrace.csv >"$OUT/ktrace-ab.csv.gz"
        [ -n "${PREFILL_LINES:-}" ] && cp /tmp/kt2/ktrace-prefill.txt "$OUT/ktrace-prefill-ab.txt"
        head -30 "$OUT/ktrace-ab.txt"
    fi
    el
fi
if [ -n "${EDGES:-}" ]; then # the graphs' edges by kind, per kernel function
    edges() { # file, environment assignments…
        local f=$1; shift
        env DS4_CUDA_REC_EDGES=1 "$@" timeout 200 $F/ds4-bench -m /dev/shm/flash-q2.gguf --backend cuda --frontiers 8192 --gen 32 --warmup 4096 \
            ${EDGES_ARGS:---mtp /dev/shm/flash-q2-mtp.gguf --accept 0.8} >"/tmp/edges.log" 2>&1
        echo "edges ($*): exit $?"
        grep -A80 "replay edges" /tmp/edges.log | grep -vE "^ds4-bench: (ab|round)" | head -30000 >"$OUT/$f"
        grep -c "replay edges: a graph" "$OUT/$f"; grep -E "rope_table|hc_pre" "$OUT/$f" | sort | uniq -c | sort -rn | head -12
    }
    edges edges.txt
    [ -n "${EDGES_AB:-}" ] && edges edges-ab.txt $EDGES_AB
    el
fi
if [ -n "${BITS:-}" ]; then # the same greedy logprobs from every library (and BITS_AB's switches)?
    bits() { # name, environment assignments…
        local n=$1; shift
        env "$@" timeout 120 $F/ds4 -m /dev/shm/flash-q2.gguf --backend cuda ${BITS_MODE---fast} --temp 0 -n 40 --dump-logprobs "/tmp/lp-$n.json" \
            -p "The quick brown fox jumps over the lazy dog because" >"/tmp/lp-$n.log" 2>&1
        echo "bits $n: exit $? md5 $(md5sum <"/tmp/lp-$n.json" | cut -c1-32)"
    }
    for lib in $PWD/build/libds4cuda.so /tmp/lib-*.so; do
        [ -s "$lib" ] || continue
        [[ -n ${BITS_LIBS:-} && ! $(basename "$lib" .so) =~ $BITS_LIBS ]] && continue
        bits "$(basename "$lib" .so)" DS4_CUDA_LIB="$lib"
    done
    IFS='|' read -ra BVS <<<"${BITS_AB:-}"
    for v in "${BVS[@]}"; do [ -n "$v" ] && { read -ra kv <<<"$v"; bits "$(echo "$v" | tr -c 'A-Za-z0-9_\n' _)" "${kv[@]}"; }; done
    el
fi
if [ -n "${AB:-}" ]; then
    eval "set -- $AB"
    LAYERS=43 MODEL=/dev/shm/flash-q2.gguf ROUNDS=${AB_ROUNDS:-${ROUNDS:-2}} GEN=${AB_GEN:-${GEN:-256}} WARMUP=${WARMUP:-4096} ARGS=${ARGS:---fast} \
        AB_OUT=/tmp/ab bash scripts/cuda/ab-layers.sh "$@" | grep -v "^== "
    for f in /tmp/ab/*.csv; do # each run's last line of each kind (probe, site, line)
        grep -qE "phase probe|mv probe" "$f" 2>/dev/null || continue
        echo "== $f"
        grep -E "phase probe|mv probe" "$f" | awk '{k = $1 " " $2 " " $3 " " $4 " " ($5 ~ /^n=/ ? "" : $5); if (!(k in l)) o[n++] = k; l[k] = $0}
            END {for (i = 0; i < n; i++) print l[o[i]]}'
    done >"$OUT/probe.txt"
    [ -s "$OUT/probe.txt" ] && cat "$OUT/probe.txt" || rm -f "$OUT/probe.txt"
    tar -czf "$OUT/ab.tgz" -C /tmp ab; el
fi
# abx NAME SETS ARGS: library options A/B inside one ds4-bench process (ds4-bench --ab)
abx() {
    read -r -a xargs_ <<<"$3"
    timeout "${ABX_LIMIT:-560}" $F/ds4-bench -m /dev/shm/flash-q2.gguf --backend cuda "${xargs_[@]}" --frontiers "${FRONTIER:-8192}" \
        --gen "${GEN:-256}" --ab-prefill "${ABX_PREFILL:-0}" --warmup "${WARMUP:-4096}" --rounds "${ROUNDS:-5}" --ab "$2" --time-limit "$(( ${ABX_LIMIT:-560} - 15 ))s" \
        --csv "$OUT/$1.csv" >"$OUT/$1.log" 2>&1
    echo "$1: exit $?"; grep -E "ds4-bench: (ab |A/B|error|[^f])" "$OUT/$1.log" | grep -v "ab round" | tail -16; el
}
if [ -n "${ABX:-}" ]; then abx abx "$ABX" "${ARGS:---fast}"; fi
if [ -n "${ABX2:-}" ]; then abx abx2 "$ABX2" "${ARGS2:---fast}"; fi
if [ -n "${ABX3:-}" ]; then abx abx3 "$ABX3" "${ARGS3:---fast}"; fi
