#!/usr/bin/env python3
"""The MLX backend process: a gRPC server speaking the host's Backend contract.

The entry point (`python backend/backend.py --addr HOST:PORT`): it starts the
engine, serves the Backend service (servicer.py) with grpc health and reflection
beside it, and stops within the host's grace on SIGTERM or when its parent dies.
"""

import argparse
import asyncio
import logging
import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

from common.openblas import maybe_reexec_with_openblas  # noqa: E402


def standard_fds_open() -> None:
    """A host may start us with stdin (or stdout, stderr) closed, as LocalAI's tests of a
    backend folder do: the next descriptor opened would take that number (gRPC's poller's
    among them), and whatever then treats it as stdin, or replaces it, takes it from under
    its owner (once, here: gRPC aborted, "epoll_wait error: Bad file descriptor"). /dev/null
    takes every one of the three that is closed, before anything else is opened."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: `fd` itself
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


if __name__ == "__main__":
    standard_fds_open()
    maybe_reexec_with_openblas()

import grpc  # noqa: E402
from grpc_health.v1 import health as grpc_health, health_pb2, health_pb2_grpc  # noqa: E402
from grpc_reflection.v1alpha import reflection  # noqa: E402

import backend_pb2  # noqa: E402
import backend_pb2_grpc  # noqa: E402
from common import auth, parent_watch  # noqa: E402
from engine import Engine, lockstep  # noqa: E402
from servicer import BackendServicer  # noqa: E402
from status_map import answered, answered_stream, status_of  # noqa: E402

# The servicer and its status map are read from here too (the module hosts import).
__all__ = ["BackendServicer", "answered", "answered_stream", "status_of", "serve", "main"]

log = logging.getLogger("mlx-backend")

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
EXIT_CANNOT_LISTEN = 98  # the --addr could not be bound (98 is Linux's EADDRINUSE)
SHUTDOWN_GRACE_S = 8.0  # running streams get this long to finish at shutdown
ENGINE_STOP_S = 3.0  # then the engine this long to end its step (a prefill chunk is ~1.5 s on a CPU)


BACKEND_SERVICE = backend_pb2.DESCRIPTOR.services_by_name["Backend"].full_name
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name


async def standard_services(server, engine: Engine, loop) -> "grpc_health.aio.HealthServicer":
    """grpc.health.v1 (SERVING while the engine lives, for "" and backend.Backend) and reflection."""
    health = grpc_health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection((BACKEND_SERVICE, HEALTH_SERVICE, reflection.SERVICE_NAME), server)

    async def set_all(status) -> None:
        for name in ("", BACKEND_SERVICE):
            await health.set(name, status)

    def engine_closed(cause: str) -> None:  # engine thread: hand over to the loop
        try:
            loop.call_soon_threadsafe(
                lambda: loop.create_task(set_all(health_pb2.HealthCheckResponse.NOT_SERVING)))
        except RuntimeError:  # the loop is gone: the process is exiting anyway
            pass

    engine.on_close = engine_closed
    await set_all(health_pb2.HealthCheckResponse.SERVING if engine.alive
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
    health.engine_watch = loop.create_task(watch_engine(engine, set_all))  # held: else it may vanish
    return health


async def watch_engine(engine: Engine, set_all) -> None:
    """Keep grpc health in step with the engine: NOT_SERVING while it fails every pass or is stuck
    in one (Engine.trouble), SERVING again when it recovers; the host restarts a process that stays out."""
    serving = True
    while engine.alive:
        trouble = engine.trouble()
        if (trouble is None) != serving:
            serving = trouble is None
            if not serving:
                log.error("health: not serving: %s", trouble)
            else:
                log.info("health: serving again")
            await set_all(health_pb2.HealthCheckResponse.SERVING if serving
                          else health_pb2.HealthCheckResponse.NOT_SERVING)
        # A quarter of the bound: a stuck engine is seen within 1.25x health_timeout.
        await asyncio.sleep(min(max(engine.config.health_timeout / 4, 0.01), 1.0))


async def serve(addr: str, group=None) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    # Watch the parent first, so a host that dies while we start up is noticed.
    # The host sends SIGTERM, then SIGKILL 15 s later: the grace plus the engine's
    # stop (ENGINE_STOP_S) end well before that.
    grace = parent_watch.duration_from_env("MLX_BACKEND_SHUTDOWN_GRACE", SHUTDOWN_GRACE_S, allow_zero=True)
    watch_on, interval = parent_watch.settings_from_env()
    watcher = None
    if watch_on:
        # The graceful path gets its grace, the engine its stop time, and 2 s to spare.
        watcher = parent_watch.start_parent_watch(
            lambda: loop.call_soon_threadsafe(stop.set), interval, force_exit_after=grace + ENGINE_STOP_S + 2.0)

    engine = Engine() if group is None else lockstep.LockstepEngine(group)
    interceptors = auth.server_interceptors()
    server = grpc.aio.server(interceptors=interceptors, options=[
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        # gRPC's default lets a second server bind a port already served and share its
        # connections: a stale or stray backend would silently answer half of the host's calls.
        ("grpc.so_reuseport", 0),
    ])
    backend_pb2_grpc.add_BackendServicer_to_server(BackendServicer(engine), server)
    health = await standard_services(server, engine, loop)
    try:
        bound = server.add_insecure_port(addr)
    except RuntimeError:  # newer grpcio raises where older ones returned 0
        bound = 0
    if bound == 0:
        log.error("cannot listen on %s (address in use or not available)", addr)
        raise SystemExit(EXIT_CANNOT_LISTEN)
    exposed = auth.open_bind_warning(addr)
    if exposed:
        log.warning("%s", exposed)

    def on_signal(sig: signal.Signals) -> None:
        log.info("received %s", sig.name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    await server.start()
    log.info("serving on %s (pid %d); auth %s; parent watch %s; shutdown grace %gs", addr, os.getpid(),
             f"on ({auth.ENV_TOKEN})" if interceptors else "off",
             f"on (parent pid {os.getppid()}, every {interval:g}s)" if watcher else
             ("off (no parent to watch)" if watch_on else f"off ({parent_watch.ENV_WATCH})"),
             grace)

    await stop.wait()
    # server.stop refuses new RPCs at once, lets in-flight ones run up to `grace`,
    # then cancels them; their engine requests leave the batch as they unwind.
    log.info("shutting down: in-flight requests get up to %gs", grace)
    await health.enter_graceful_shutdown()
    await server.stop(grace)
    # Fails whatever is left with CANCELLED and joins the engine thread; off the
    # loop so the engine's last events can still be delivered meanwhile.
    await asyncio.to_thread(engine.stop, ENGINE_STOP_S)
    log.info("stopped")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="MLX backend for LocalAI-style hosts")
    parser.add_argument("--addr", default="localhost:50051", help="HOST:PORT to listen on")
    parser.add_argument("--log-level", default=os.environ.get("MLX_BACKEND_LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The engine thread's Python work between MLX calls holds the GIL for up to
    # one switch interval (5 ms by default): a shorter one keeps Health snappy.
    sys.setswitchinterval(0.001)
    group = lockstep.join() if lockstep.wanted() else None  # under mlx.launch: one rank of a group
    if group is not None and group.rank > 0:
        lockstep.follow(group)  # no port: replays rank 0's steps until rank 0 stops
    asyncio.run(serve(args.addr, group))
    # Everything has stopped. Skip the interpreter's teardown: MLX's native one can
    # abort ("terminate called without an active exception") while threads that
    # used it are being torn down, turning a clean stop into SIGABRT.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
