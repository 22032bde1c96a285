#!/usr/bin/env bash
# Entry point for hosts: run.sh --addr HOST:PORT
set -euo pipefail
dir="$(cd "$(dirname "$0")/.." && pwd)"
[ -x "$dir/.venv/bin/python" ] || "$dir/install.sh" >&2
exec "$dir/.venv/bin/python" "$dir/backend/backend.py" "$@"
