"""``deepinfer serve``: the OpenAI-compatible server from the command line.

The model is the positional MODEL (as ``vllm serve MODEL``) or ``--model``. Every EngineConfig field is a flag
(deepinfer.engine_args derives them from the dataclass, so new fields appear by themselves) and can also be set in a
YAML file given with ``--config``; flags override the file. Server options (host, port, API key, ...) work the same
way. The port is bound before the model loads, so a port in use fails at once. SIGTERM or SIGINT stops admitting
requests, lets those in flight finish for up to ``--shutdown-timeout`` seconds, aborts the rest, shuts the engine
down and exits 0; a second signal aborts at once. vLLM's serve flags are accepted too: deepinfer.server.vllm_flags
maps those without a DeepInfer option of their own.

    deepinfer serve /models/DeepSeek-V2-Lite --port 8000 --api-key sk-... --max-model-len 8192
    deepinfer serve --config serve.yaml --port 9000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import errno
import signal
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from deepinfer.config import EngineConfig, is_finite_number
from deepinfer.engine_args import ENGINE_VALUE_NAMES, add_engine_arguments, finite_float
from deepinfer.sampling_params import MAX_LOGPROBS
from deepinfer.server.vllm_flags import add_vllm_arguments, apply_aliases, take_vllm_file_keys, warn_inapplicable

__all__ = ["add_serve_arguments", "run_serve", "resolve_serve_options", "main"]

logger = logging.getLogger("deepinfer.server")

SERVER_DEFAULTS: dict[str, Any] = {
    "host": "127.0.0.1",
    "port": 8000,
    "api_key": None,
    "reasoning_parser": None,
    "tool_call_parser": "deepseek_v3",
    "max_queue_size": 1024,
    "shutdown_timeout": 30.0,
    "log_level": "info",
    "access_log": True,
    "allowed_origins": [],
    "allow_credentials": False,
    "chat_template": None,
    "response_role": "assistant",
    "max_logprobs": MAX_LOGPROBS,
    "enable_log_requests": False,
    "uvicorn_log_level": None,
    "root_path": "",
    "ssl_keyfile": None,
    "ssl_certfile": None,
    "ssl_ca_certs": None,
    "ssl_cert_reqs": 0,
    "api_server_count": 1,
}
API_KEY_ENV = "DEEPINFER_API_KEY"
_REASONING_PARSERS = ("deepseek-r1",)
_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
_KEY_ALIASES = {"model": "model_name_or_path"}


# ----------------------------------------------------------------------------------------------- flags


def add_serve_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the serve flags to ``parser``. Defaults are left unset (SUPPRESS) so that only the flags a user gives
    override a ``--config`` file; run_serve fills in the defaults."""
    S = argparse.SUPPRESS
    # `deepinfer serve MODEL`, as `vllm serve MODEL`; --model works too (resolve_serve_options refuses both at once
    # when they differ).
    parser.add_argument("model_positional", nargs="?", metavar="MODEL", default=S,
                        help="the model directory or hub id (same as --model)")
    parser.add_argument("--config", metavar="FILE.yaml", default=S,
                        help="YAML file of engine and server options (keys as the flags, with _ or -); "
                             "flags given here override it")
    server = parser.add_argument_group("server")
    server.add_argument("--host", default=S, help=f"address to listen on (default {SERVER_DEFAULTS['host']}; "
                                                  "0.0.0.0 for every interface)")
    server.add_argument("--port", type=int, default=S, help=f"port (default {SERVER_DEFAULTS['port']})")
    server.add_argument("--api-key", default=S,
                        help=f"require 'Authorization: Bearer KEY' on /v1 endpoints (default: ${API_KEY_ENV} if "
                             "set, else no key)")
    server.add_argument("--reasoning-parser", choices=_REASONING_PARSERS, default=S,
                        help="return <think>...</think> text as reasoning_content (DeepSeek-R1 style models)")
    server.add_argument("--tool-call-parser", choices=("deepseek_v3", "deepseek_v31", "none"), default=S,
                        help="parse DeepSeek's tool-call text into OpenAI tool_calls for requests with tools; one parser "
                             "reads both the V3/R1 and the V3.1 form (default deepseek_v3); tool_choice 'required' "
                             "or a named function forces a call in the form named here; none: tools are refused")
    server.add_argument("--max-queue-size", type=int, default=S,
                        help="sequences that may wait for their first token before new requests get 503 "
                             f"(default {SERVER_DEFAULTS['max_queue_size']})")
    server.add_argument("--api-server-count", "-asc", type=int, metavar="N", default=S,
                        help="HTTP server processes in front of the engine's process (default "
                             f"{SERVER_DEFAULTS['api_server_count']}: one process serves both); more keep the event "
                             "loop from falling behind the engine at hundreds of streams")
    server.add_argument("--shutdown-timeout", type=finite_float, default=S,
                        help="on SIGTERM/SIGINT, seconds to let in-flight requests finish before aborting them "
                             f"(default {SERVER_DEFAULTS['shutdown_timeout']:g})")
    server.add_argument("--log-level", choices=_LOG_LEVELS, default=S,
                        help=f"(default {SERVER_DEFAULTS['log_level']})")
    server.add_argument("--uvicorn-log-level", choices=_LOG_LEVELS, default=S,
                        help="the HTTP server's (uvicorn's) log level (default: --log-level)")
    server.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=S,
                        help="log one line per HTTP request (default on)")
    server.add_argument("--disable-uvicorn-access-log", dest="access_log", action="store_const", const=False,
                        default=S, help="same as --no-access-log")
    server.add_argument("--enable-log-requests", action=argparse.BooleanOptionalAction, default=S,
                        help="log each generation request's id, prompt length and sampling parameters, never its "
                             "text (default off)")
    server.add_argument("--disable-log-requests", dest="enable_log_requests", action="store_const", const=False,
                        default=S, help="same as --no-enable-log-requests (the default)")
    server.add_argument("--chat-template", metavar="FILE_OR_JINJA", default=S,
                        help="Jinja chat template (a file, or the template itself) for /v1/chat/completions "
                             "(default: the checkpoint's)")
    server.add_argument("--response-role", metavar="ROLE", default=S,
                        help=f"role of the message in chat answers (default {SERVER_DEFAULTS['response_role']})")
    server.add_argument("--max-logprobs", type=int, metavar="N", default=S,
                        help="largest logprobs/top_logprobs a request may ask for, at most "
                             f"{MAX_LOGPROBS} (default {SERVER_DEFAULTS['max_logprobs']})")
    server.add_argument("--root-path", metavar="PATH", default=S,
                        help="path prefix of a proxy in front of the server, e.g. /api; routes answer with or "
                             "without it (default: none)")
    server.add_argument("--ssl-keyfile", metavar="FILE", default=S, help="serve HTTPS with this private key "
                                                                        "(default: plain HTTP)")
    server.add_argument("--ssl-certfile", metavar="FILE", default=S,
                        help="the certificate (chain) for HTTPS; required for HTTPS (default: none)")
    server.add_argument("--ssl-ca-certs", metavar="FILE", default=S,
                        help="CA certificates to verify client certificates against (default: none)")
    server.add_argument("--ssl-cert-reqs", type=int, choices=(0, 1, 2), default=S,
                        help="client certificates: 0 not asked, 1 optional, 2 required, as Python's ssl.CERT_* "
                             "(default 0)")
    server.add_argument("--allowed-origins", nargs="+", metavar="ORIGIN", default=S,
                        help="origins whose browser pages may call the API (CORS), e.g. https://app.example or '*' "
                             "(default: none)")
    server.add_argument("--allow-credentials", action=argparse.BooleanOptionalAction, default=S,
                        help="let those origins send cookies and Authorization headers (default off)")

    add_engine_arguments(parser)
    add_vllm_arguments(parser)
    return parser


# ----------------------------------------------------------------------------------------------- options


def load_config_file(path: str | os.PathLike) -> dict[str, Any]:
    import yaml

    text = Path(path).read_text()
    data = yaml.safe_load(text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of options at the top level, got {type(data).__name__}")
    out = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise ValueError(f"{path}: option names must be strings, got {key!r}")
        name = key.replace("-", "_")
        name = _KEY_ALIASES.get(name, name)
        if name in out:
            raise ValueError(f"{path}: option {key!r} is given twice")
        out[name] = value
    return out


def resolve_serve_options(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """(EngineConfig values, server options) from the file and the flags, flags winning. Raises ValueError."""
    given = {k: v for k, v in vars(args).items() if k not in ("config", "func", "command")}
    if "model_positional" in given:
        positional = given.pop("model_positional")
        flag = given.get("model_name_or_path", positional)
        if flag != positional:
            raise ValueError(f"the model is given twice, differently: {positional!r} (positional MODEL) and "
                             f"{flag!r} (--model); give one of them")
        given["model_name_or_path"] = positional
    given = apply_aliases(given, "flags")
    engine_names = ENGINE_VALUE_NAMES
    file_values: dict[str, Any] = {}
    config_path = getattr(args, "config", None)
    if config_path:
        file_values = take_vllm_file_keys(apply_aliases(load_config_file(config_path), str(config_path)),
                                          str(config_path), args)
        unknown = sorted(set(file_values) - engine_names - set(SERVER_DEFAULTS))
        if unknown:
            raise ValueError(f"{config_path}: unknown options {unknown}; known: "
                             f"{sorted((engine_names | set(SERVER_DEFAULTS)) - {'model_name_or_path'}) + ['model']}")
        # A flag for one spelling of the quantization replaces the file's other spelling.
        if "quantization" in given:
            file_values.pop("quantization_config", None)
        if "quantization_config" in given:
            file_values.pop("quantization", None)
    merged = {**file_values, **{k: v for k, v in given.items() if k in engine_names or k in SERVER_DEFAULTS}}
    engine_values = {k: v for k, v in merged.items() if k in engine_names}
    server = dict(SERVER_DEFAULTS)
    server.update({k: v for k, v in merged.items() if k in SERVER_DEFAULTS})
    if server["api_key"] is None and os.environ.get(API_KEY_ENV):
        server["api_key"] = os.environ[API_KEY_ENV]
    if server["reasoning_parser"] is not None and server["reasoning_parser"] not in _REASONING_PARSERS:
        raise ValueError(f"reasoning_parser must be one of {list(_REASONING_PARSERS)}, "
                         f"got {server['reasoning_parser']!r}")
    if not isinstance(server["port"], int) or not 0 <= server["port"] <= 65535:
        raise ValueError(f"port must be an integer in [0, 65535], got {server['port']!r}")
    if not isinstance(server["max_queue_size"], int) or server["max_queue_size"] < 1:
        raise ValueError(f"max_queue_size must be an integer >= 1, got {server['max_queue_size']!r}")
    count = server["api_server_count"]
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"api_server_count must be an integer >= 1, got {count!r}")
    if not is_finite_number(server["shutdown_timeout"]) or server["shutdown_timeout"] < 0:
        raise ValueError(f"shutdown_timeout must be a finite number >= 0, got {server['shutdown_timeout']!r}")
    origins = server["allowed_origins"]
    if isinstance(origins, str):
        origins = [origins]
    if not isinstance(origins, list) or not all(isinstance(o, str) and o for o in origins):
        raise ValueError(f"allowed_origins must be a list of origins, got {server['allowed_origins']!r}")
    server["allowed_origins"] = origins
    if not isinstance(server["allow_credentials"], bool):
        raise ValueError(f"allow_credentials must be true or false, got {server['allow_credentials']!r}")
    if server["log_level"] not in _LOG_LEVELS:
        raise ValueError(f"log_level must be one of {list(_LOG_LEVELS)}, got {server['log_level']!r}")
    if server["uvicorn_log_level"] not in (None, *_LOG_LEVELS):
        raise ValueError(f"uvicorn_log_level must be one of {list(_LOG_LEVELS)}, got {server['uvicorn_log_level']!r}")
    if not isinstance(server["enable_log_requests"], bool):
        raise ValueError(f"enable_log_requests must be true or false, got {server['enable_log_requests']!r}")
    max_logprobs = server["max_logprobs"]
    if not isinstance(max_logprobs, int) or isinstance(max_logprobs, bool) or not 0 <= max_logprobs <= MAX_LOGPROBS:
        raise ValueError(f"max_logprobs must be an integer in [0, {MAX_LOGPROBS}] (the engine returns at most "
                         f"{MAX_LOGPROBS} alternatives a token), got {max_logprobs!r}")
    if not isinstance(server["response_role"], str) or not server["response_role"]:
        raise ValueError(f"response_role must be a non-empty string, got {server['response_role']!r}")
    root = server["root_path"]
    if not isinstance(root, str) or (root and (not root.startswith("/") or root.endswith("/"))):
        raise ValueError(f"root_path must be empty or a path like /api (a leading /, no trailing /), got {root!r}")
    if server["chat_template"] is not None:
        server["chat_template"] = load_chat_template(server["chat_template"])
    check_ssl(server)
    return engine_values, server


def load_chat_template(value: Any) -> str:
    """The Jinja source that ``--chat-template`` names: a file's text, or the value itself when it is a template
    (it has Jinja's braces, or several lines). Compiled here, so that a broken one fails before the weights load."""
    from deepinfer.chat import compile_chat_template

    if not isinstance(value, (str, os.PathLike)) or str(value) == "":
        raise ValueError(f"chat_template must be a file or a Jinja template, got {value!r}")
    text = str(value)
    path = Path(text).expanduser()
    looks_inline = any(c in text for c in "{}\n")
    if not looks_inline:
        try:
            text = path.read_text()
        except OSError as e:
            raise ValueError(f"chat_template {str(value)!r} is not a readable file ({e.strerror or e}) and "
                             "has no Jinja in it") from None
    try:
        compile_chat_template(text)
    except ValueError as e:
        where = "the chat template given inline" if looks_inline else f"chat_template {str(value)!r}"
        raise ValueError(f"{where}: {e}") from None
    return text


def check_ssl(server: dict[str, Any]) -> None:
    """Loads the certificate and key as the server will, so that a wrong file fails before the weights load."""
    import ssl

    keyfile, certfile, ca_certs = server["ssl_keyfile"], server["ssl_certfile"], server["ssl_ca_certs"]
    if server["ssl_cert_reqs"] not in (0, 1, 2):
        raise ValueError(f"ssl_cert_reqs must be 0, 1 or 2, got {server['ssl_cert_reqs']!r}")
    if certfile is None:
        if keyfile is not None or ca_certs is not None:
            raise ValueError("HTTPS needs --ssl-certfile (the certificate) besides --ssl-keyfile/--ssl-ca-certs")
        return
    try:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certfile, keyfile)
        if ca_certs is not None:
            context.load_verify_locations(ca_certs)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"cannot use --ssl-certfile {certfile!r} / --ssl-keyfile {keyfile!r}"
                         f"{f' / --ssl-ca-certs {ca_certs!r}' if ca_certs else ''}: {e}") from None


# ----------------------------------------------------------------------------------------------- serving


def _make_server_class():
    import uvicorn

    class GracefulServer(uvicorn.Server):
        """uvicorn, with our own signal handling: drain, then abort, then exit 0 (uvicorn would re-raise the
        signal after shutting down, which ends the process with the signal's status instead)."""

        def __init__(self, config: Any, state: Any, engine: Any, grace_s: float,
                     startup: Callable[[], Awaitable[None]] | None = None) -> None:
            super().__init__(config)
            self._startup = startup
            self._state = state
            self._engine = engine
            self._grace_s = grace_s
            self._signals = 0
            self._loop: asyncio.AbstractEventLoop | None = None
            self._abort_started = False
            self.failed = False

        async def serve(self, sockets: Any = None) -> None:
            self._loop = asyncio.get_running_loop()
            if self._startup is not None:
                await self._startup()
            watch = asyncio.ensure_future(self._watch_engine())
            try:
                await super().serve(sockets)
            finally:
                watch.cancel()

        async def _watch_engine(self) -> None:
            """A parallel engine whose rank failed cannot step again: the server ends (exit status 1) with the
            engine's reason, which names the rank, instead of answering every request with an error."""
            while not self.should_exit:
                await asyncio.sleep(0.5)
                stats = self._engine.stats()
                if stats is not None and not getattr(stats, "alive", True):
                    logger.critical("%s; the server stops", getattr(stats, "failure", "") or "the engine stopped")
                    self.failed = True
                    self.should_exit = True
                    await self._abort_all()
                    return

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            originals = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in originals.items():
                    signal.signal(sig, handler)

        def _on_signal(self, sig: int, frame: Any) -> None:
            self._signals += 1
            name = signal.Signals(sig).name
            if self._signals == 1:
                logger.info("%s: no new requests; waiting up to %gs for %d in flight, then aborting", name,
                            self._grace_s, self._state.inflight)
                self._state.begin_drain()
                self.should_exit = True
                if self._loop is not None:
                    self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain()))
            else:
                logger.warning("%s again: aborting in-flight requests now", name)
                if self._loop is not None:
                    self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._abort_all()))
                if self._signals >= 3:
                    self.force_exit = True

        async def _drain(self) -> None:
            deadline = time.monotonic() + self._grace_s
            while self._state.inflight > 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if self._state.inflight > 0:
                logger.info("aborting %d request(s) still in flight", self._state.inflight)
            await self._abort_all()

        async def _abort_all(self) -> None:
            if self._abort_started:
                return
            self._abort_started = True
            # Every response ends (streams with finish_reason "abort"), so connections close; then the engine stops.
            await self._state.abort_all()
            await asyncio.to_thread(self._engine.shutdown)

    return GracefulServer


def bind_listen_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound to (host, port) but not yet listening (connections are refused until uvicorn
    starts serving on it). Bound before the model loads, so a port already taken fails in a second, not after
    minutes of loading. Raises OSError with a message naming the address and --port."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise OSError(f"cannot resolve --host {host!r}: {e.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    # As uvicorn does: a previous server's connections in TIME_WAIT must not keep the port from being reused.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        where = f"{host}:{port}" if ":" not in (host or "") else f"[{host}]:{port}"
        if e.errno == errno.EADDRINUSE:
            raise OSError(f"cannot listen on {where}: the address is already in use (another server is running "
                          "there?); stop it or choose another --port") from None
        raise OSError(f"cannot listen on {where}: {e.strerror or e}; check --host and --port") from None
    return sock


def serve_app(app: Any, engine: Any, server: dict[str, Any], sock: socket.socket,
              startup: Callable[[], Awaitable[None]] | None = None) -> int:
    """Serves ``app`` (over ``engine``) on ``sock`` until a signal or the engine's failure; the exit status.
    ``startup`` is awaited on the server's event loop before it serves."""
    import uvicorn

    server = {**SERVER_DEFAULTS, **server}  # options left out take their defaults
    config = uvicorn.Config(app, host=server["host"], port=server["port"],
                            log_level=server["uvicorn_log_level"] or server["log_level"],
                            access_log=bool(server["access_log"]), lifespan="off",
                            ssl_keyfile=server["ssl_keyfile"], ssl_certfile=server["ssl_certfile"],
                            ssl_ca_certs=server["ssl_ca_certs"], ssl_cert_reqs=server["ssl_cert_reqs"],
                            timeout_graceful_shutdown=float(server["shutdown_timeout"]) + 10.0)
    Server = _make_server_class()
    srv = Server(config, app.state.server, engine, float(server["shutdown_timeout"]), startup)
    try:
        asyncio.run(srv.serve(sockets=[sock]))
    except SystemExit as e:  # uvicorn exits on startup failures (address in use, ...)
        return int(e.code) if isinstance(e.code, int) else 1
    return 0 if srv.started and not srv.failed else 1


class _Interrupted(Exception):
    pass


def run_serve(args: argparse.Namespace) -> int:
    """Runs the server until SIGTERM/SIGINT; returns the process exit status."""
    prog = "deepinfer serve"
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
        import yaml  # noqa: F401
    except ImportError as e:
        print(f"{prog}: error: a server dependency is missing ({e}); install deepinfer[server]", file=sys.stderr)
        return 2
    try:
        engine_values, server = resolve_serve_options(args)
    except Exception as e:  # bad file, bad YAML, bad values
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    level = "DEBUG" if server["log_level"] == "trace" else server["log_level"].upper()
    logging.basicConfig(level=level, format="%(levelname)s %(asctime)s %(name)s: %(message)s")
    logging.getLogger("deepinfer").setLevel(level)
    warn_inapplicable(args, logger)

    from deepinfer.engine import DeepInferenceEngine
    from deepinfer.launch import rank_placement

    try:
        config = EngineConfig.from_dict(engine_values)
    except (ValueError, TypeError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2

    try:
        placement = rank_placement(config)
    except ValueError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    if placement is not None and not placement.is_leader:
        # Only rank 0 serves HTTP: this process runs its steps (the engine ends the process when rank 0 stops).
        try:
            DeepInferenceEngine(config)
        except (ValueError, RuntimeError, OSError) as e:
            print(f"{prog}: error: rank {placement.rank} of {placement.world_size}: {e}", file=sys.stderr)
            return 1
        return 0

    try:
        sock = bind_listen_socket(server["host"], server["port"])
    except OSError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    if server["port"] == 0:  # the kernel chose one: say which
        server["port"] = sock.getsockname()[1]

    def interrupted(sig: int, frame: Any) -> None:
        raise _Interrupted(signal.Signals(sig).name)

    on_main = threading.current_thread() is threading.main_thread()
    previous = {}
    if on_main:
        previous = {sig: signal.signal(sig, interrupted) for sig in (signal.SIGINT, signal.SIGTERM)}
    engine = None
    try:
        try:
            engine = DeepInferenceEngine(config)
        except (ValueError, RuntimeError, OSError) as e:
            print(f"{prog}: error: could not start the engine: {e}", file=sys.stderr)
            return 1
        from deepinfer.server.app import create_app

        # The grammar engine's token trie is built beside the startup, not on the event loop at the first request
        # with a response_format.
        threading.Thread(target=_prepare_structured_outputs, args=(engine,), daemon=True,
                         name="deepinfer-grammar").start()
        app_options = dict(api_key=server["api_key"], max_queue=server["max_queue_size"],
                           reasoning_parser=server["reasoning_parser"], tool_call_parser=server["tool_call_parser"],
                           allowed_origins=server["allowed_origins"], allow_credentials=server["allow_credentials"],
                           chat_template=server["chat_template"], response_role=server["response_role"],
                           max_logprobs=server["max_logprobs"], root_path=server["root_path"],
                           log_requests=server["enable_log_requests"])
        app = create_app(engine, **app_options)  # also checks the options before any server process starts
        if on_main:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            previous = {}
        if server["api_server_count"] > 1:
            from deepinfer.server.api_servers import serve_with_api_servers

            return serve_with_api_servers(engine, server, sock, app_options, server["api_server_count"])
        scheme = "https" if server["ssl_certfile"] else "http"
        logger.info("serving %s (max_model_len %d) at %s://%s:%d%s/v1", engine.served_model_name,
                    app.state.server.max_model_len, scheme, server["host"], server["port"], server["root_path"])
        return serve_app(app, engine, server, sock)
    except _Interrupted as e:
        logger.info("%s while starting: stopping", e)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()  # uvicorn closes it on shutdown; this covers a failure before serving (closing twice is fine)
        if engine is not None:
            engine.shutdown()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    parser = argparse.ArgumentParser(prog="deepinfer serve", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_serve_arguments(parser)
    return run_serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())


def _prepare_structured_outputs(engine) -> None:
    try:
        engine.prepare_structured_outputs()
    except Exception as e:  # a broken grammar library fails constrained requests later, with the reason
        logging.getLogger("deepinfer.server").warning("structured outputs are unavailable: %s", e)
