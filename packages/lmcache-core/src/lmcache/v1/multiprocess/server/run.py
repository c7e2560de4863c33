"""Running the cache server: build it, serve until SIGINT/SIGTERM, start its frontends.

``python -m lmcache.v1.multiprocess.server`` runs :func:`main` without the CLI.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import zmq

from lmcache.v1.multiprocess.runtime_plugins.mp_launcher import MPRuntimePluginLauncher
from lmcache.v1.multiprocess.server.config_report import redact_secrets
from lmcache.v1.multiprocess.server.startup import build_cache_server
from lmcache.v1.multiprocess.server.transport import MPServer
from lmcache.v1.multiprocess.server_config import MPServerConfig

logger = logging.getLogger(__name__)


def run_server(
    config: MPServerConfig,
    ready: Callable[[MPServer], None] | None = None,
) -> int:
    """Build, serve until SIGINT/SIGTERM, shut down cleanly; returns an exit status.

    Start-up failures raise (``ValueError``/``RuntimeError``/``OSError`` with a one-line
    message) after releasing everything already made, shared memory included.
    Server extensions' flags are checked before this, where they are parsed
    (:func:`~lmcache.v1.multiprocess.server.extensions.check_extension_settings`).
    """
    # One id for the whole run (upstream: --instance-id, else a random uuid4 at start-up).
    config = dataclasses.replace(config, instance_id=config.resolved_instance_id())
    with _sigterm_interrupts():  # a SIGTERM while L1 is being made must still clean up
        engine = build_cache_server(config)
        try:
            server = MPServer(config, engine)
        except BaseException as exc:
            engine.close()
            if isinstance(exc, zmq.ZMQError):
                raise RuntimeError(
                    f"cannot listen on tcp://{config.host}:{config.port}: {exc}"
                ) from None
            raise

    def on_signal(signum: int, _frame: Any) -> None:
        logger.info("received %s; stopping", signal.Signals(signum).name)
        server.request_stop()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    logger.info("LMCache MP server instance id %s", config.instance_id)
    frontends: list[Any] = []
    plugins: MPRuntimePluginLauncher | None = None
    try:
        frontends = start_frontends(config, server)
        plugins = start_runtime_plugins(config)
        if ready is not None:
            ready(server)
        server.serve_forever()
    finally:
        if plugins is not None:
            plugins.stop_plugins()
        for frontend in frontends:
            frontend.stop()
        server.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 0


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt (like SIGINT) inside the block, so construction's
    cleanup runs instead of the process dying with its segments (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def start_runtime_plugins(config: MPServerConfig) -> MPRuntimePluginLauncher | None:
    """Start ``--runtime-plugin-locations`` (None when there are none): each plugin gets
    the server's configuration, secrets redacted, as JSON under ``mp`` (upstream's key)."""
    settings = config.runtime_plugin_config
    if not settings.locations:
        return None
    # Plugins are other programs: no admin token, no storage passwords.
    shown = dataclasses.replace(
        config,
        admin_token="***" if config.admin_token else None,
        l2_adapters=redact_secrets(list(config.l2_adapters)),
    )
    launcher = MPRuntimePluginLauncher(runtime_plugin_config=settings, mp=shown)
    launcher.launch_plugins()
    return launcher


def start_frontends(config: MPServerConfig, server: MPServer) -> list[Any]:
    """The HTTP frontend and the Prometheus endpoint, each unless its port is 0.

    A port that cannot be bound is logged as an error and that endpoint stays off: the
    cache keeps serving its clients (a liveness probe on the missing endpoint then fails,
    which is how an orchestrator notices).
    """
    from lmcache.v1.multiprocess.server.http_frontend import HTTPFrontend, PrometheusEndpoint
    from lmcache.v1.multiprocess.server.http_limits import HTTPLimits

    frontends: list[Any] = []
    server.http_url = None
    if config.http_port:
        try:
            http = HTTPFrontend(
                server.engine,
                config.http_host,
                config.http_port,
                is_serving=server.is_serving,
                allow_cache_clear=config.enable_http_cache_clear,
                limits=HTTPLimits(
                    header_timeout_s=config.http_header_timeout_s,
                    body_timeout_s=config.http_body_timeout_s,
                    max_connections=config.http_max_connections,
                ),
            )
        except OSError as exc:
            logger.error(
                "HTTP frontend off: cannot listen on %s:%d (%s); pass --http-port",
                config.http_host,
                config.http_port,
                exc,
            )
        else:
            http.start()
            server.http_url = http.url
            frontends.append(http)
    metrics = server.engine.metrics
    if config.prometheus_port and metrics is not None:
        try:
            security = server.engine.settings.http
            if security.read_token is not None:
                logger.warning(
                    "--prometheus-port %d serves /metrics without the HTTP read token; scrape "
                    "/metrics on the HTTP frontend instead, or pass --prometheus-port 0",
                    config.prometheus_port,
                )
            frontends.append(
                PrometheusEndpoint(
                    metrics.registry,
                    config.http_host,
                    config.prometheus_port,
                    security.tls_certfile,
                    security.tls_keyfile,
                )
            )
        except OSError as exc:
            logger.error(
                "Prometheus endpoint off: cannot listen on %s:%d (%s); pass --prometheus-port",
                config.http_host,
                config.prometheus_port,
                exc,
            )
    return frontends


def main(argv: list[str] | None = None) -> int:
    from lmcache.logging import init_logger
    from lmcache.v1.multiprocess.server.extensions import (
        add_extension_arguments,
        check_extension_settings,
    )
    from lmcache.v1.multiprocess.server_config import (
        add_mp_server_args,
        config_from_args,
        log_level,
    )

    parser = argparse.ArgumentParser(prog="python -m lmcache.v1.multiprocess.server")
    add_mp_server_args(parser)
    add_extension_arguments(parser)
    parser.add_argument("--log-level", type=log_level, default=None)
    args = parser.parse_args(argv)
    init_logger(args.log_level)
    try:
        check_extension_settings(args)
        return run_server(config_from_args(args))
    except (ValueError, RuntimeError, OSError) as exc:
        logger.debug("start-up failed", exc_info=True)
        parser.exit(1, f"{parser.prog}: error: {' '.join(str(exc).split())}\n")
