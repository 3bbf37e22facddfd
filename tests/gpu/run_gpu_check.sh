#!/usr/bin/env bash
# Real-GPU check of npusnap's cuda backend (needs an NVIDIA GPU, driver >= 570, PyTorch with CUDA).
#
# Starts tests/gpu/torch_workload.py (~2 GiB of tensors on the GPU, one digest of all of them per
# step), checkpoints it mid-run with `npusnap checkpoint --device auto` (which must pick cuda from
# the process's /dev/nvidia* mappings), lets the checkpoint kill it, restores it with
# `npusnap restore`, and compares its every step and final SHA-256 with an uninterrupted run.
# Prints timings. Exits 0 on success, 1 on a mismatch or npusnap failure, 2 when this machine
# cannot run the check (no GPU, old driver, no CRIU, no PyTorch), with one line saying why.
#
# Environment (everything can be carried in from elsewhere):
#   PYTHON        interpreter with torch, npusnap and pycriu (default: python3, or .venv/bin/python)
#   NPUSNAP       npusnap command (default: `npusnap` on PATH, else "$PYTHON -m npusnap_cli")
#   NPUSNAP_CRIU  CRIU binary (default: `criu` on PATH; scripts/install-criu.sh builds one)
#   GIB, STEPS, AT, SLEEP_MS   workload size, steps, checkpoint after step AT, pause per step
#   KEEP=1        keep the work directory
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
GIB=${GIB:-2} STEPS=${STEPS:-30} AT=${AT:-8} SLEEP_MS=${SLEEP_MS:-300}

say() { echo "gpu-check: $*" >&2; }
cannot() { say "CANNOT RUN: $*"; exit 2; }
fail() { say "FAIL: $*"; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

# ---------------------------------------------------------------- preconditions
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$root/.venv/bin/python" ]; then PYTHON=$root/.venv/bin/python; else PYTHON=python3; fi
fi
command -v "$PYTHON" >/dev/null || cannot "no Python interpreter ($PYTHON)"
command -v nvidia-smi >/dev/null || cannot "nvidia-smi not found: no NVIDIA driver on this machine"
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1) \
    || cannot "nvidia-smi cannot talk to the driver (no GPU, or the driver is not loaded)"
[ -n "$driver" ] || cannot "nvidia-smi lists no GPU"
gpu=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -n1)
[ "${driver%%.*}" -ge 570 ] 2>/dev/null || cannot "driver $driver is too old: the check needs r570+ (lock timeouts)"
"$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
    || cannot "PyTorch with CUDA is not importable by $PYTHON"
"$PYTHON" -c 'import pycriu' 2>/dev/null || cannot "pycriu is not importable by $PYTHON (scripts/install-criu.sh)"

criu=${NPUSNAP_CRIU:-$(command -v criu || true)}
if [ -z "$criu" ] || [ ! -x "$criu" ]; then
    cannot "no CRIU: set NPUSNAP_CRIU or put criu on PATH (scripts/install-criu.sh builds 4.2.1)"
fi
export NPUSNAP_CRIU=$criu

if [ -n "${NPUSNAP:-}" ]; then
    read -r -a npusnap <<<"$NPUSNAP"
elif command -v npusnap >/dev/null; then
    npusnap=(npusnap)
elif [ -x "$(dirname "$PYTHON")/npusnap" ]; then
    npusnap=("$(dirname "$PYTHON")/npusnap")
else
    npusnap=("$PYTHON" -m npusnap_cli)
fi
"${npusnap[@]}" --help >/dev/null 2>&1 || cannot "npusnap does not run (${npusnap[*]})"
[ "$(id -u)" -eq 0 ] || say "not root: CRIU needs CAP_CHECKPOINT_RESTORE and CAP_SYS_PTRACE"

# CRIU's own CUDA plugin (criu/plugins/cuda) would try to lock the process itself; npusnap has
# already checkpointed the GPU state when CRIU runs, so keep CRIU from loading any plugin.
work=$(mktemp -d "${TMPDIR:-/tmp}/npusnap-gpu-check.XXXXXX")
mkdir -p "$work/no-plugins"
export CRIU_LIBS_DIR=$work/no-plugins
unset NPUSNAP_LIBCUDA  # the real driver, never the test shim

pid=""
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
    if [ "${KEEP:-0}" = 1 ]; then say "work directory kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

say "GPU: $gpu; driver $driver; CRIU $criu; npusnap: ${npusnap[*]}"
"${npusnap[@]}" check --json >"$work/check.json" || true
"$PYTHON" - "$work/check.json" <<'PY' || cannot "npusnap check does not see a checkpoint-capable CUDA driver"
import json, sys
doc = json.load(open(sys.argv[1]))
line = next(c for c in doc["checks"] if c["name"] == "device: cuda")
print(f"gpu-check: npusnap check: cuda {line['status']}: {line['detail']}", file=sys.stderr)
sys.exit(0 if line["status"] == "ok" else 1)
PY

workload=("$PYTHON" "$here/torch_workload.py" --gib "$GIB" --steps "$STEPS")

# ---------------------------------------------------------------- the uninterrupted reference
t0=$(now)
"${workload[@]}" --sleep-ms 0 >"$work/ref.out" 2>"$work/ref.err" \
    || fail "the reference run failed: $(tail -n3 "$work/ref.err")"
t1=$(now)
grep -v '^ready pid' "$work/ref.out" >"$work/ref.lines"
say "reference run: $(elapsed "$t0" "$t1") s, $(grep -c '^step' "$work/ref.lines") steps"

# ---------------------------------------------------------------- the run to checkpoint
setsid "${workload[@]}" --sleep-ms "$SLEEP_MS" >"$work/run.out" 2>"$work/run.err" </dev/null &
pid=$!
for _ in $(seq 1 600); do
    grep -q "^step $AT " "$work/run.out" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || fail "the workload exited early: $(tail -n3 "$work/run.err")"
    sleep 0.1
done
grep -q "^step $AT " "$work/run.out" || fail "the workload did not reach step $AT in 60 s"
grep -q /dev/nvidia "/proc/$pid/maps" || fail "the workload maps no /dev/nvidia* device"

t0=$(now)
"${npusnap[@]}" checkpoint "$pid" -D "$work/ck" --device auto --lock-timeout 30 --json >"$work/ck.json" \
    || fail "npusnap checkpoint failed (see above)"
t1=$(now)
for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && fail "the workload still runs after the checkpoint"
wait "$pid" 2>/dev/null || true
steps_before=$(grep -c '^step' "$work/run.out")
[ "$steps_before" -lt "$STEPS" ] || fail "the workload finished before the checkpoint; raise STEPS or SLEEP_MS"

# ---------------------------------------------------------------- restore
t2=$(now)
"${npusnap[@]}" restore "$work/ck" --json >"$work/rs.json" || fail "npusnap restore failed, or the restored workload exited non-zero"
t3=$(now)

# ---------------------------------------------------------------- compare and report
"$PYTHON" - "$work" "$steps_before" "$(elapsed "$t0" "$t1")" "$(elapsed "$t2" "$t3")" <<'PY'
import json, sys
from pathlib import Path

work, before, ck_wall, rs_wall = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
ck, rs = json.loads((work / "ck.json").read_text()), json.loads((work / "rs.json").read_text())
dev = ck["device"]
problems = []
if dev["backend"] != "cuda":
    problems.append(f"--device auto picked {dev['backend']!r}, not cuda")
if not dev.get("gpus"):
    problems.append("the manifest records no GPU UUIDs")
ref = (work / "ref.lines").read_text().splitlines()
got = [line for line in (work / "run.out").read_text().splitlines() if not line.startswith("ready pid")]
if got != ref:
    first = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))
    problems.append(f"output differs from the uninterrupted run at line {first}: "
                    f"{got[first] if first < len(got) else '<missing>'!r} vs {ref[first] if first < len(ref) else '<missing>'!r}")
if rs.get("exit_code") != 0:
    problems.append(f"the restored workload exited {rs.get('exit_code')}")

def phases(doc):
    return ", ".join(f"{p['name']} {p['seconds']:.2f}s" + (f" ({p['bytes'] / 2**30:.2f} GiB)" if p.get("bytes") else "")
                     for p in doc["phases"])

print(f"gpu-check: GPUs {', '.join(dev.get('gpus', []))}; driver {dev.get('runtime')}", file=sys.stderr)
print(f"gpu-check: checkpoint after step {before - 1}: {ck_wall} s wall; image {ck['bytes'] / 2**30:.2f} GiB; {phases(ck)}", file=sys.stderr)
print(f"gpu-check: restore (until the workload exited): {rs_wall} s wall; {phases(rs)}", file=sys.stderr)
if problems:
    for p in problems:
        print(f"gpu-check: FAIL: {p}", file=sys.stderr)
    sys.exit(1)
print(f"gpu-check: PASS: {len(ref)} lines identical to the uninterrupted run, final SHA-256 included", file=sys.stderr)
PY
