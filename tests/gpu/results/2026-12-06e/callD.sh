#!/usr/bin/env bash
# Device call D of the fourteenth session of 2026-12-06, refused (too little device time left to
# start a machine) and kept for a later session: the bench's steps timed per launch held at a
# stream gate until queued (callD-gate.patch applied: runtime/src/cuda/gate.rs): the gate's test,
# then main's bench (.gpu/old/glmc, built without the patch) and the gated one (.gpu/glmc and
# .gpu/gpu_kernels, with it) on the same settings (batch 1 and 8, contexts 1024 and 32768, sparse,
# no prefill), in one call.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"; mkdir -p "$R"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >>"$R/times.txt"
tar xJf .gpu/pack.tar.xz -C .gpu; log unpack $?
timeout 30 .gpu/gpu_kernels --ignored --nocapture --exact a_closed_gate_holds_its_stream_until_it_opens >"$R/gate.txt" 2>&1; log gate $?
for b in old new; do
    bin=.gpu/glmc; [ $b = old ] && bin=.gpu/old/glmc
    timeout 60 $bin bench models/glm5-slice.ron --device cuda --random-weights 1 --batch 1,8 --context 1024,32768 \
        --prefill 0 --attention sparse --json "$R/glmc-$b.json" >"$R/bench-$b.txt" 2>&1; log bench-$b $?
done
