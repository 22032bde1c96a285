#!/bin/sh
# LocalAI starts this as `run.sh --addr HOST:PORT` from the backend's own folder. It runs the
# interpreter shipped beside it, never the host's: nothing is installed or downloaded here.
case "$0" in
  */*) here=${0%/*} ;;
  *) here=. ;;
esac
here=$(cd -- "$here" && pwd -P) || exit 1
# The host's Python settings would point ours at a foreign standard library or packages.
unset PYTHONHOME PYTHONPATH PYTHONSTARTUP PYTHONEXECUTABLE
export PYTHONNOUSERSITE=1
# exec: LocalAI signals this very process (SIGTERM, then SIGKILL), and our parent watch sees LocalAI.
exec "$here/python/bin/python3" "$here/backend/backend.py" "$@"
