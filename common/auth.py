"""Bearer-token authentication for the gRPC server.

The host sets LOCALAI_GRPC_AUTH_TOKEN in the backend's environment (it inherits
it) and sends `authorization: Bearer <token>` on every call. With the variable
unset or empty the server is open, as hosts without the token expect.
"""

import hmac
import ipaddress
import logging
import os
from typing import Callable, Mapping, Optional

import grpc

log = logging.getLogger("mlx-backend.auth")

ENV_TOKEN = "LOCALAI_GRPC_AUTH_TOKEN"
# Probes (kubelet's gRPC probe, grpc_health_probe without -rpc-header) cannot
# always send the token: this lets the standard health service answer them.
ENV_HEALTH_OPEN = "MLX_BACKEND_HEALTH_OPEN"
HEALTH_METHODS = "/grpc.health.v1.Health/"


def token_from_env(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The configured token, or None when authentication is off (unset or empty)."""
    token = (os.environ if env is None else env).get(ENV_TOKEN, "")
    return token or None


def check_authorization(header: Optional[str], token: str) -> Optional[str]:
    """None when `header` carries `token`, else the reason to refuse (never echoes either)."""
    if not header:
        return f"missing 'authorization: Bearer <token>' metadata ({ENV_TOKEN} is set on this backend)"
    scheme, _, presented = header.partition(" ")
    # RFC 7235: the scheme name is case-insensitive; the credentials are not.
    if scheme.lower() != "bearer":
        return "authorization metadata must use the Bearer scheme: 'authorization: Bearer <token>'"
    # Bytes, so a non-ASCII token cannot make compare_digest raise; constant time
    # so the comparison leaks nothing about how much of the token matched.
    if not hmac.compare_digest(presented.encode("utf-8"), token.encode("utf-8")):
        return f"invalid bearer token (it does not match this backend's {ENV_TOKEN})"
    return None


def authorization_header(metadata) -> Optional[str]:
    """The first `authorization` value in invocation metadata, if any."""
    for key, value in metadata or ():
        if key.lower() == "authorization":
            return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return None


def rejecting_handler(handler: Optional[grpc.RpcMethodHandler], reject: Callable) -> grpc.RpcMethodHandler:
    """A handler of the same streaming kind as `handler` whose behaviour is `reject`.

    The kind must match: a unary handler would wait for a request message that a
    streaming client may never send. No deserializer: a refused payload is never
    parsed.
    """
    if handler is None:  # unknown method: refuse too, rather than reveal it is unknown
        return grpc.unary_unary_rpc_method_handler(reject)
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(reject)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(reject)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(reject)
    return grpc.unary_unary_rpc_method_handler(reject)


class _BearerCheck:
    """The decision both interceptor kinds share: refuse, with the reason, or let through."""

    def __init__(self, token: str, open_prefixes=()):
        if not token:
            raise ValueError("an empty token would let every caller in")
        self._token = token
        self._open = tuple(open_prefixes)

    def refusal(self, handler_call_details) -> Optional[str]:
        if self._open and handler_call_details.method.startswith(self._open):
            return None
        header = authorization_header(handler_call_details.invocation_metadata)
        reason = check_authorization(header, self._token)
        if reason is not None:
            log.warning("refused %s: %s", handler_call_details.method, reason)
        return reason


class BearerTokenInterceptor(_BearerCheck, grpc.aio.ServerInterceptor):
    """Refuses every RPC (Health included) that lacks `authorization: Bearer <token>`,
    but those whose method name starts with one of `open_prefixes`."""

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        reason = self.refusal(handler_call_details)
        if reason is None:
            return handler

        async def reject(request_or_iterator, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)

        return rejecting_handler(handler, reject)


class SyncBearerTokenInterceptor(_BearerCheck, grpc.ServerInterceptor):
    """The same check for a synchronous grpc.server."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        reason = self.refusal(handler_call_details)
        if reason is None:
            return handler

        def reject(request_or_iterator, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)

        return rejecting_handler(handler, reject)


def server_interceptors(env: Optional[Mapping[str, str]] = None, aio: bool = True) -> list:
    """The interceptors to install: one when a token is configured, none otherwise
    (for a grpc.aio server, or a synchronous one with aio=False)."""
    env = os.environ if env is None else env
    token = token_from_env(env)
    if not token:
        return []
    health_open = env.get(ENV_HEALTH_OPEN, "").strip().lower() in ("1", "true", "yes", "on")
    kind = BearerTokenInterceptor if aio else SyncBearerTokenInterceptor
    return [kind(token, (HEALTH_METHODS,) if health_open else ())]


def open_bind_warning(addr: str, env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The warning to log when `addr` listens beyond this machine with no token, else None."""
    if token_from_env(env) or addr.startswith("unix:"):
        return None
    host = addr.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass  # a host name other than localhost may resolve to any interface
    return (f"listening on {addr} beyond loopback with no {ENV_TOKEN}: anyone who can reach this port can "
            f"load models and run requests; set {ENV_TOKEN} or bind to 127.0.0.1")
