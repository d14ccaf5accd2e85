#!/usr/bin/env bash
# Runs the golden generator on the GPU machine (through the device `run` tool) and packs each
# case directory into one tar under $OUT (the tool returns at most 8 files).
#   run: bash scripts/reference/run_device.sh [smoke|full|both]   (carry: .ref)
# Locally with torch (GPU or CPU): python3 scripts/reference/gen_golden.py --out testdata/golden
set -u
MODE=${1:-both}
OUT=${OUT:-/tmp/golden-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
REF=.ref/dsv4-flash-inference/inference
python3 -c 'import torch, safetensors; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'
if [ "$MODE" = smoke ] || [ "$MODE" = both ]; then
  rm -rf /tmp/smoke
  python3 scripts/reference/gen_golden.py --ref $REF --out /tmp/smoke --smoke --time-budget 5 2>&1 | tee "$OUT/smoke_log.txt"
  rc=${PIPESTATUS[0]}
  tar -C /tmp -cf "$OUT/smoke.tar" smoke
  if [ $rc -ne 0 ]; then echo "smoke failed rc=$rc"; exit $rc; fi
fi
if [ "$MODE" = full ] || [ "$MODE" = both ]; then
  rm -rf /tmp/full
  for c in ${CASES:-flash6_w16_k8 flash4_w128_k512}; do
    python3 scripts/reference/gen_golden.py --ref $REF --out /tmp/full --cases $c --time-budget ${BUDGET:-200} 2>&1 | tee -a "$OUT/full_log.txt"
    tar -C /tmp/full -cf "$OUT/$c.tar" $c
  done
  cp /tmp/full/summary.json "$OUT/summary_last.json" 2>/dev/null
fi
ls -la "$OUT"
