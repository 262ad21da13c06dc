"""`deepinfer serve --api-server-count N` (N > 1): the HTTP servers in N processes of their own, the engine in this one.

One Python process serving HTTP and feeding the engine has one GIL for both: at a thousand streams its event loop
falls behind the engine's steps and tokens reach clients in bursts (benchmarks/serve/README.md). Here the engine
process keeps the engine and its dispatcher (detokenization, stop strings) and serves them over Unix sockets
(engine_host.py); each of N server processes runs the same app over an EngineProxy (engine_proxy.py), on one
listening socket that this process bound and they inherit (the kernel hands each connection to one of them).

Signals: the engine process passes each SIGINT / SIGTERM on to the servers as a SIGTERM (the first drains, the second
aborts what is in flight), waits for them, then shuts the engine down. A server that dies stops the others (exit
status 1); an engine that fails is seen by every server, which then stops.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

logger = logging.getLogger("deepinfer.server")

_CONNECT_TIMEOUT_S = 120.0  # for every server process to start and say hello


def serve_with_api_servers(engine: Any, server: dict[str, Any], sock: socket.socket, app_options: dict[str, Any],
                           count: int) -> int:
    """Runs ``count`` API server processes on ``sock`` over ``engine`` until they end; the exit status."""
    from deepinfer.server.engine_host import EngineHost

    host = EngineHost(engine, app_options, server)
    procs: list[subprocess.Popen] = []
    stopping = threading.Event()
    previous: dict[int, Any] = {}

    def forward(sig: int, frame: Any) -> None:
        if not stopping.is_set():
            logger.info("%s: stopping the %d API server processes", signal.Signals(sig).name, len(procs))
        stopping.set()
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    on_main = threading.current_thread() is threading.main_thread()
    try:
        if on_main:
            previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
        for index in range(count):
            command = [sys.executable, "-m", "deepinfer.server.api_servers", "--engine-socket", host.path,
                       "--listen-fd", str(sock.fileno()), "--index", str(index)]
            # A session of their own: a terminal's Ctrl-C reaches this process only, which passes it on once.
            procs.append(subprocess.Popen(command, pass_fds=(sock.fileno(),), start_new_session=True))
        deadline = time.monotonic() + _CONNECT_TIMEOUT_S
        while host.num_connections < count and not stopping.is_set():
            if any(p.poll() is not None for p in procs):
                break
            if time.monotonic() > deadline:
                logger.error("only %d of %d API server processes connected within %.0f s", host.num_connections,
                             count, _CONNECT_TIMEOUT_S)
                forward(signal.SIGTERM, None)
                break
            time.sleep(0.05)
        else:
            scheme = "https" if server.get("ssl_certfile") else "http"
            logger.info("serving %s (max_model_len %d) at %s://%s:%d%s/v1 from %d API server processes",
                        engine.served_model_name, engine.max_model_len, scheme, server["host"], server["port"],
                        server["root_path"], count)
        status = 0
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            ended = [i for i, c in enumerate(codes) if c is not None]
            if ended and not stopping.is_set():
                logger.error("API server process %d ended (exit status %s): stopping the others", ended[0],
                             codes[ended[0]])
                forward(signal.SIGTERM, None)
            time.sleep(0.1)
        for i, p in enumerate(procs):
            if p.returncode != 0:
                logger.error("API server process %d ended with exit status %s", i, p.returncode)
                status = 1
        return status
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        host.close()


def main(argv: list[str] | None = None) -> int:
    """One API server process (started by serve_with_api_servers)."""
    parser = argparse.ArgumentParser(prog="deepinfer serve (API server process)")
    parser.add_argument("--engine-socket", required=True)
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--index", type=int, default=0)
    args = parser.parse_args(argv)

    def stop_before_serving(sig: int, frame: Any) -> None:
        raise SystemExit(0)  # nothing is in flight here yet; once serving, the server's own handlers drain

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop_before_serving)

    from deepinfer.server.app import create_app
    from deepinfer.server.cli import serve_app
    from deepinfer.server.engine_proxy import EngineProxy

    proxy = EngineProxy(args.engine_socket)
    try:
        facts = proxy.connect()
    except RuntimeError as e:
        print(f"deepinfer serve: API server process {args.index}: {e}", file=sys.stderr)
        return 1
    server = facts.server
    level = "DEBUG" if server["log_level"] == "trace" else server["log_level"].upper()
    logging.basicConfig(level=level, format=f"%(levelname)s %(asctime)s %(name)s[api {args.index}]: %(message)s")
    logging.getLogger("deepinfer").setLevel(level)
    app = create_app(proxy, **facts.app_options)
    proxy.request_metrics = app.state.server.metrics.request_families
    sock = socket.socket(fileno=args.listen_fd)
    return serve_app(app, proxy, server, sock, startup=proxy.start)


if __name__ == "__main__":
    sys.exit(main())
