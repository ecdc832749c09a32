# The first line of a device call's script (tests/gpu/results/*/call*.sh, run by the device tool
# in the repository root with .gpu carried): sourced, it unpacks the binaries that were built
# here (.gpu/pack.tar.xz), points glmc's scripts at them, and sets up the record that comes
# back: everything under $R is tarred into $OUT/r.tgz however the script ends, and `log WHAT
# STATUS` appends each step's exit status and time to $R/times.txt, below the GPU's name and
# clocks, which `on_h200` reads.
set -u
export GLMC_REPO="$PWD" GLMC_BIN="$PWD/.gpu/glmc" GLMC_CACHE_DIR=/tmp/glmc-cache PATH="/usr/local/cuda/bin:$PATH"
R="$OUT/r"
mkdir -p "$R"
trap 'tar czf "$OUT/r.tgz" -C "$OUT" r' EXIT
t0=$SECONDS
log() { echo "$1: exit $2 at $((SECONDS - t0)) s" | tee -a "$R/times.txt"; }
on_h200() { grep -q H200 "$R/times.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader >>"$R/times.txt"
tar xJf .gpu/pack.tar.xz -C .gpu
log unpack $?
