"""Exit when the host that spawned us is gone.

A host killed with SIGKILL cannot stop its backends, and an orphaned backend
keeps its model in memory. When a parent exits, the kernel hands its children
to init or the nearest sub-reaper, so our parent pid changes: we poll
os.getppid() (portable to macOS, unlike Linux's PR_SET_PDEATHSIG) and shut
down when it differs from the one we started with.

Environment, shared with the host's other backends:
  LOCALAI_BACKEND_PARENT_WATCH           on by default; false/0/no/off (any case) turns it off
  LOCALAI_BACKEND_PARENT_WATCH_INTERVAL  Go-style duration ("500ms", "2s", "1m30s") or
                                         bare seconds ("3", "0.5"); default 2s
"""

import logging
import os
import re
import threading
import time
from typing import Callable, Mapping, Optional

log = logging.getLogger("mlx-backend.parent-watch")

ENV_WATCH = "LOCALAI_BACKEND_PARENT_WATCH"
ENV_INTERVAL = "LOCALAI_BACKEND_PARENT_WATCH_INTERVAL"
# The names LocalAI's shared parent_watch.py gives them.
ENV_PARENT_WATCH, ENV_PARENT_WATCH_INTERVAL = ENV_WATCH, ENV_INTERVAL
DEFAULT_INTERVAL = 2.0

_FALSEY = {"false", "0", "no", "off"}
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "ms": 1e-3,
                 "s": 1.0, "m": 60.0, "h": 3600.0}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_BARE = re.compile(rf"[+-]?{_NUMBER}")
# "ms" before "m" so that "5ms" is not read as 5 minutes followed by junk.
_PART = re.compile(rf"({_NUMBER})(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
# Go's time.Duration is an int64 of nanoseconds; larger values are errors there
# and would overflow time.sleep here.
_MAX_SECONDS = (2 ** 63 - 1) / 1e9


def parse_duration(text: str) -> float:
    """Seconds in a Go duration ("1m30s", "500ms", "-2s") or bare seconds ("3", "0.5").

    Raises ValueError for anything else (empty, unknown unit, exponent, too large).
    """
    s = text.strip()
    if _BARE.fullmatch(s):
        seconds = float(s)
    else:
        sign = -1.0 if s.startswith("-") else 1.0
        body = s[1:] if s[:1] in ("+", "-") else s
        if not body:
            raise ValueError(f"invalid duration {text!r}")
        seconds, pos = 0.0, 0
        while pos < len(body):
            m = _PART.match(body, pos)
            if m is None:
                raise ValueError(f"invalid duration {text!r} (units: ns, us, ms, s, m, h)")
            seconds += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
            pos = m.end()
        seconds *= sign
    if abs(seconds) > _MAX_SECONDS:
        raise ValueError(f"duration {text!r} is out of range")
    return seconds


def watch_enabled(value: Optional[str]) -> bool:
    """The on/off rule for LOCALAI_BACKEND_PARENT_WATCH: on unless explicitly falsey."""
    return value is None or value.strip().lower() not in _FALSEY


def duration_from_env(name: str, default: float, allow_zero: bool = False,
                      env: Optional[Mapping[str, str]] = None) -> float:
    """A duration read from the environment; unset means `default`, invalid warns and means `default`."""
    raw = (os.environ if env is None else env).get(name, "")
    if not raw.strip():
        return default
    try:
        seconds = parse_duration(raw)
    except ValueError as e:
        log.warning("%s: %s; using the default %gs", name, e, default)
        return default
    if seconds < 0 or (seconds == 0 and not allow_zero):
        log.warning("%s=%r must be %s; using the default %gs",
                    name, raw, "zero or more" if allow_zero else "positive", default)
        return default
    return seconds


def settings_from_env(env: Optional[Mapping[str, str]] = None):
    """(enabled, interval in seconds) from LOCALAI_BACKEND_PARENT_WATCH[_INTERVAL]."""
    env = os.environ if env is None else env
    return watch_enabled(env.get(ENV_WATCH)), duration_from_env(ENV_INTERVAL, DEFAULT_INTERVAL, env=env)


def start_parent_watch(on_gone: Callable[[], None], interval: float, force_exit_after: float = 5.0,
                       getppid: Callable[[], int] = os.getppid,
                       exit: Callable[[int], None] = os._exit) -> Optional[threading.Thread]:
    """Poll the parent pid every `interval` s; when it changes, call `on_gone()`.

    `on_gone` runs in the watcher thread, so it must be thread-safe (e.g.
    `lambda: loop.call_soon_threadsafe(stop_event.set)`). If the process is
    still alive `force_exit_after` s later, the graceful path is stuck and the
    process exits at once with status 1. Returns the (daemon) thread, or None
    when there is no parent to watch (started as a child of pid 1: already an
    orphan, or run directly by a container's init).

    A thread rather than an asyncio task: it must fire even if the event loop
    is wedged. `getppid` and `exit` are replaceable for tests.
    """
    parent = getppid()
    if parent <= 1:
        return None
    thread = threading.Thread(
        target=_watch, args=(parent, interval, on_gone, force_exit_after, getppid, exit),
        name="parent-watch", daemon=True)
    thread.start()
    return thread


def _watch(parent: int, interval: float, on_gone: Callable[[], None], force_exit_after: float = 5.0,
           getppid: Callable[[], int] = os.getppid, exit: Callable[[int], None] = os._exit) -> None:
    """The watch loop (blocks): the argument order of LocalAI's `_watch(ppid, interval, on_death)`."""
    while True:
        current = getppid()
        if current != parent:
            break
        time.sleep(interval)
    log.warning("parent process %d is gone (now a child of %d): shutting down", parent, current)
    try:
        on_gone()
    except Exception:
        log.exception("the shutdown callback failed: exiting now")
        exit(1)
        return
    time.sleep(force_exit_after)
    log.error("still running %gs after the parent died: exiting now", force_exit_after)
    exit(1)


# --- LocalAI's entry point and helper names --------------------------------
# LocalAI's backends arm the watch through grpc_auth.get_auth_interceptors(),
# which calls start_parent_death_watcher(); its tests read the settings through
# _enabled() and _interval_seconds(). Same rules as above.

_death_watch: Optional[threading.Thread] = None
_death_watch_lock = threading.Lock()


def _enabled() -> bool:
    # Windows hands an orphan to no well-known parent, so a changed pid means nothing there.
    return os.name != "nt" and watch_enabled(os.environ.get(ENV_WATCH))


def _interval_seconds() -> float:
    return duration_from_env(ENV_INTERVAL, DEFAULT_INTERVAL)


def start_parent_death_watcher() -> Optional[threading.Thread]:
    """Arm the watch once per process for a backend without a graceful shutdown path:
    when the parent is gone it exits at once with status 1. A no-op when turned off,
    on Windows, when already armed, or with no parent to watch."""
    global _death_watch
    if not _enabled():
        return None
    with _death_watch_lock:
        if _death_watch is None:
            _death_watch = start_parent_watch(lambda: os._exit(1), _interval_seconds())
        return _death_watch
