#!/usr/bin/env bash
# ds4-server with speculative decoding on the full-size q2 synth, on the GPU
# machine: a greedy, a seeded sampled and a streamed sampled request to
# `ds4-server --fast --mtp-draft 2`, then the same to a server without the
# MTP block; prints each generation's log line (drafts verified, committed
# and only checked) and whether the replies agree. A functional check of
# the server's speculative paths at the real shapes: random weights' drafts
# are never right, so the runs pause speculation (speed: ds4-bench --accept).
#   OUT=$OUT bash scripts/cuda/server-mtp.sh
# Needs dev-out/final/{ds4-server,ds4-gguf}; builds build/libds4cuda.so
# unless there; makes /dev/shm/flash-q2.gguf and flash-q2-mtp.gguf unless
# there.
set -uo pipefail
cd "$(dirname "$0")/../.."
F=dev-out/final
OUT=${OUT:-dev-out/server-mtp}
mkdir -p "$OUT"
[ -s build/libds4cuda.so ] || bash scripts/cuda/build-lib.sh >/tmp/build-main.log 2>&1 || { tail -20 /tmp/build-main.log; exit 1; }
export DS4_CUDA_LIB=$PWD/build/libds4cuda.so DS4_CUDA_REQUIRE=1
[ -s /dev/shm/flash-q2.gguf ] || $F/ds4-gguf synth --flash-q2 -o /dev/shm/flash-q2.gguf >/tmp/synth.log 2>&1 &
[ -s /dev/shm/flash-q2-mtp.gguf ] || $F/ds4-gguf synth --flash-q2 --mtp-only -o /dev/shm/flash-q2-mtp.gguf >/tmp/synth-mtp.log 2>&1
wait
msg='"messages":[{"role":"user","content":"Write a long story about a lighthouse keeper."}]'
serve() { # name, server flags…
    local n=$1; shift
    $F/ds4-server --backend cuda --fast -m /dev/shm/flash-q2.gguf --ctx 16384 --port 18099 "$@" >"$OUT/server-$n.log" 2>&1 &
    local sp=$!
    for _ in $(seq 1 240); do curl -s localhost:18099/v1/models >/dev/null && break; sleep 0.5; done
    curl -s localhost:18099/v1/chat/completions -H 'Content-Type: application/json' \
        -d "{\"model\":\"deepseek-chat\",$msg,\"max_tokens\":200,\"temperature\":0}" >"$OUT/$n-greedy.json"
    curl -s localhost:18099/v1/chat/completions -H 'Content-Type: application/json' \
        -d "{\"model\":\"deepseek-chat\",$msg,\"max_tokens\":200,\"temperature\":1,\"seed\":3}" >"$OUT/$n-sampled.json"
    curl -s -N localhost:18099/v1/chat/completions -H 'Content-Type: application/json' \
        -d "{\"model\":\"deepseek-chat\",$msg,\"max_tokens\":120,\"temperature\":0.8,\"seed\":5,\"stream\":true}" >"$OUT/$n-stream.txt"
    kill "$sp"; wait "$sp" 2>/dev/null
    echo "== $n"; grep -E "generation done|level=ERROR|panic" "$OUT/server-$n.log" | sed 's/^time=[^ ]* //' | cut -c1-400
    echo "stream: $(grep -c '^data: ' "$OUT/$n-stream.txt") events, ends with $(grep '^data: ' "$OUT/$n-stream.txt" | tail -1 | cut -c1-40)"
}
serve spec --mtp /dev/shm/flash-q2-mtp.gguf --mtp-draft 2
serve plain
for k in greedy sampled; do
    a=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['choices'][0]['message']['content'])" "$OUT/spec-$k.json" 2>&1)
    b=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['choices'][0]['message']['content'])" "$OUT/plain-$k.json" 2>&1)
    if [ "$a" = "$b" ]; then echo "$k: the same reply with and without speculation (${#a} characters)"; else echo "$k: the replies differ (fast mode's two-token passes may flip near ties): ${#a} / ${#b} characters"; fi
done
