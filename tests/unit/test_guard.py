"""Authentication and parent-watch helpers (pure functions, no server)."""

import threading

import pytest

from common.auth import check_authorization, server_interceptors, token_from_env
from common.parent_watch import (DEFAULT_INTERVAL, duration_from_env, parse_duration,
                                 settings_from_env, start_parent_watch, watch_enabled)


@pytest.mark.parametrize("text, seconds", [
    ("500ms", 0.5), ("2s", 2.0), ("1m", 60.0), ("1m30s", 90.0), ("1.5s", 1.5), ("1h", 3600.0),
    ("1h2m3s", 3723.0), ("250us", 250e-6), ("250\u00b5s", 250e-6), ("250\u03bcs", 250e-6),
    ("100ns", 100e-9), (".5s", 0.5), ("1.s", 1.0), ("3", 3.0), ("0.5", 0.5), (".25", 0.25),
    (" 2s ", 2.0), ("0", 0.0), ("0s", 0.0), ("-2s", -2.0), ("+2s", 2.0), ("5ms2s", 2.005),
])
def test_parse_duration_valid(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", [
    "", " ", "s", "ms", "abc", "2 s", "2S", "2sec", "1d", "1e3", "1e3s", "nan", "inf",
    "--2s", "-", "2s-1s", "1..5s", "1,5s", "99999999999h", "0x10s",
])
def test_parse_duration_invalid(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("value", ["false", "FALSE", "False", "0", "no", "No", "off", "OFF", " off "])
def test_watch_disabled_by_falsey_values(value):
    assert not watch_enabled(value)


@pytest.mark.parametrize("value", [None, "", "true", "1", "yes", "on", "anything"])
def test_watch_enabled_otherwise(value):
    assert watch_enabled(value)


def test_settings_from_env():
    assert settings_from_env({}) == (True, DEFAULT_INTERVAL)
    assert settings_from_env({"LOCALAI_BACKEND_PARENT_WATCH": "Off",
                              "LOCALAI_BACKEND_PARENT_WATCH_INTERVAL": "200ms"}) == (False, 0.2)
    assert settings_from_env({"LOCALAI_BACKEND_PARENT_WATCH_INTERVAL": "1m30s"}) == (True, 90.0)


@pytest.mark.parametrize("raw", ["garbage", "0", "0s", "-1s", "5x"])
def test_invalid_interval_warns_and_uses_default(raw, caplog):
    env = {"LOCALAI_BACKEND_PARENT_WATCH_INTERVAL": raw}
    with caplog.at_level("WARNING", logger="mlx-backend.parent-watch"):
        assert settings_from_env(env) == (True, DEFAULT_INTERVAL)
    assert "LOCALAI_BACKEND_PARENT_WATCH_INTERVAL" in caplog.text


def test_grace_allows_zero_but_not_negative():
    assert duration_from_env("G", 10.0, allow_zero=True, env={"G": "0"}) == 0.0
    assert duration_from_env("G", 10.0, allow_zero=True, env={"G": "2.5"}) == 2.5
    assert duration_from_env("G", 10.0, allow_zero=True, env={"G": "-1"}) == 10.0
    assert duration_from_env("G", 10.0, allow_zero=True, env={}) == 10.0


def test_watcher_calls_back_then_forces_exit():
    ppids = iter([100, 100, 100, 1])
    gone, exited = threading.Event(), []
    thread = start_parent_watch(gone.set, interval=0.01, force_exit_after=0.05,
                                getppid=lambda: next(ppids, 1), exit=exited.append)
    assert thread is not None and thread.daemon
    thread.join(timeout=5)
    assert gone.is_set() and exited == [1]


def test_watcher_exits_at_once_when_callback_fails():
    def boom():
        raise RuntimeError("no loop")

    ppids = iter([100, 42])
    exited = []
    thread = start_parent_watch(boom, interval=0.01, force_exit_after=60,
                                getppid=lambda: next(ppids, 42), exit=exited.append)
    thread.join(timeout=5)
    assert not thread.is_alive() and exited == [1]


def test_no_watch_when_started_under_init():
    assert start_parent_watch(lambda: None, 0.01, getppid=lambda: 1, exit=lambda code: None) is None


# ---- authentication ----------------------------------------------------------

TOKEN = "s3cret-token"


def test_right_token_passes():
    assert check_authorization(f"Bearer {TOKEN}", TOKEN) is None


def test_bearer_scheme_is_case_insensitive():
    # RFC 7235: auth-scheme names are case-insensitive; the token itself is not.
    assert check_authorization(f"bearer {TOKEN}", TOKEN) is None
    assert check_authorization(f"BEARER {TOKEN}", TOKEN) is None
    assert check_authorization(f"Bearer {TOKEN.upper()}", TOKEN).startswith("invalid bearer token")


@pytest.mark.parametrize("header", [
    "Bearer wrong", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", "Bearer ", f"Bearer  {TOKEN}",
    f"Bearer {TOKEN} ", "Bearer \u00e9t\u00e9",
])
def test_wrong_token_is_refused(header):
    assert check_authorization(header, TOKEN).startswith("invalid bearer token")


@pytest.mark.parametrize("header", [f"Basic {TOKEN}", TOKEN, f"Token {TOKEN}", f"Bearer{TOKEN}"])
def test_other_schemes_are_refused(header):
    assert "Bearer scheme" in check_authorization(header, TOKEN)


@pytest.mark.parametrize("header", [None, ""])
def test_missing_header_is_refused(header):
    reason = check_authorization(header, TOKEN)
    assert "missing" in reason and "authorization: Bearer <token>" in reason


def test_reasons_never_echo_the_token():
    for header in [None, "Bearer nope", f"Basic {TOKEN}", f"Bearer {TOKEN}!"]:
        assert TOKEN not in check_authorization(header, TOKEN)


def test_token_from_env():
    assert token_from_env({}) is None
    assert token_from_env({"LOCALAI_GRPC_AUTH_TOKEN": ""}) is None
    assert token_from_env({"LOCALAI_GRPC_AUTH_TOKEN": TOKEN}) == TOKEN
    assert server_interceptors({"LOCALAI_GRPC_AUTH_TOKEN": ""}) == []
    assert len(server_interceptors({"LOCALAI_GRPC_AUTH_TOKEN": TOKEN})) == 1


# (address, token set) -> warned? (hand table)
BINDS = [("0.0.0.0:50051", False, True), ("[::]:50051", False, True), ("192.168.1.10:50051", False, True),
         ("myhost:50051", False, True), (":50051", False, True), ("127.0.0.1:50051", False, False),
         ("127.8.9.1:50051", False, False), ("localhost:50051", False, False), ("[::1]:50051", False, False),
         ("unix:backend.sock", False, False), ("0.0.0.0:50051", True, False)]


@pytest.mark.parametrize("addr,token,warned", BINDS)
def test_a_bind_beyond_loopback_without_a_token_is_warned_about(addr, token, warned):
    from common.auth import open_bind_warning

    got = open_bind_warning(addr, {"LOCALAI_GRPC_AUTH_TOKEN": "t"} if token else {})
    assert (got is not None) == warned
    if warned:
        assert addr in got and "LOCALAI_GRPC_AUTH_TOKEN" in got
