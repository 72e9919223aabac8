"""The ``trimproxy`` command."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from proxy.logs import setup_logging
from proxy.metrics import clear_multiprocess_dir
from proxy.plan import cli as plan_cli
from proxy.settings import ENV_PREFIX, Settings, describe_error, unknown_variables
from proxy.soak import cli as soak_cli
from proxy.top import cli as top_cli

if TYPE_CHECKING:
    from proxy.models import ModelSettings


def _settings_help() -> str:
    lines = [
        "settings (environment variables; also read from ./.env in the working directory, "
        "or from --env-file PATH; the environment wins):"
    ]
    for name, field in Settings.model_fields.items():
        default = field.default
        shown = "none" if default is None else str(default)
        lines.append(f"  {ENV_PREFIX}{name.upper()} [{shown}]")
        lines.extend(
            textwrap.wrap(
                field.description or "",
                width=76,
                initial_indent="      ",
                subsequent_indent="      ",
            )
        )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trimproxy",
        description="OpenAI-compatible proxy that keeps chat prompts inside a token budget.",
    )
    parser.add_argument("--version", action="version", version=f"trimproxy {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the proxy",
        description="Run the proxy in front of TRIMPROXY_UPSTREAM_URL.",
        epilog=_settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("--host", help="listen address (TRIMPROXY_HOST)")
    serve.add_argument("--port", type=int, help="listen port (TRIMPROXY_PORT)")
    serve.add_argument("--workers", type=int, help="worker processes (TRIMPROXY_WORKERS)")
    serve.add_argument("--upstream-url", help="upstream root URL (TRIMPROXY_UPSTREAM_URL)")
    serve.add_argument(
        "--env-file",
        metavar="PATH",
        help="read settings from this file (KEY=value lines) besides the environment, which "
        "wins; without it, ./.env of the working directory is read when present",
    )
    serve.add_argument(
        "--demo",
        action="store_true",
        help="start an embedded simulated vLLM server and proxy to it (try it without a GPU)",
    )
    serve.add_argument(
        "--engines",
        type=int,
        default=1,
        help="with --demo: how many simulated engines to start, all behind the proxy [1]",
    )
    # Listed here for --help only: ``main`` hands ``trimproxy sim ...`` to the sim's own
    # parser before this one runs, so building this parser never imports the sim.
    commands.add_parser(
        "sim",
        help="run a simulated vLLM/FastChat server (demos, tests, benchmarks)",
        add_help=False,
    )
    soak_cli.add_parser(commands)
    plan_cli.add_parser(commands)
    top_cli.add_parser(commands)
    return parser


def _demo_refusal(args: argparse.Namespace) -> str | None:
    """What is wrong with ``serve``'s demo flags, in one line; None when nothing."""
    if args.engines < 1:
        return f"--engines {args.engines}: give at least 1 simulated engine"
    if args.engines > 1 and not args.demo:
        return f"--engines {args.engines} goes with --demo: how many simulated engines to start"
    if args.demo and args.upstream_url:
        return (
            "--demo runs its own simulated upstream: drop --upstream-url, or drop --demo "
            "to proxy to that URL"
        )
    return None


def start_demo_engines(engines: int = 1) -> tuple[subprocess.Popen[str], list[str]]:
    """The demo's sim engines in one child process on free ports; returns it and
    their URLs, in order (``demo_engine_urls``)."""
    from proxy.sim.cli import READY_PREFIX

    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "proxy.sim",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--engines",
            str(engines),
            "--timing",
            "gpu-7b",
            "--completion-tokens",
            "48",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    urls: list[str] = []
    for line in child.stdout:
        if line.startswith(READY_PREFIX):
            url = line[len(READY_PREFIX) :].strip()
            urls.append(url)
            which = f" engine {len(urls)} of {engines}" if engines > 1 else ""
            print(f"trimproxy: demo upstream (simulated vLLM{which}) at {url}", file=sys.stderr)
            if len(urls) == engines:
                return child, urls
    child.wait()
    print("trimproxy: the demo upstream did not start", file=sys.stderr)
    raise SystemExit(1)


def _load_settings(overrides: dict[str, object], sources: dict[str, str]) -> Settings:
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]
    except ValidationError as exc:
        print(f"trimproxy: {describe_error(exc, sources)}", file=sys.stderr)
        raise SystemExit(2) from None


def _file_sources(before: set[str], env_file: str | None) -> dict[str, str]:
    """The ``TRIMPROXY_*`` names read from a file rather than the environment, and
    from which: ``before`` is the environment's names before ``--env-file`` was read
    into it; ./.env is read by the settings themselves, under the environment."""
    from dotenv import dotenv_values

    sources: dict[str, str] = {}
    if os.path.isfile(".env"):
        for key in dotenv_values(".env"):
            if key.upper().startswith(ENV_PREFIX) and key.upper() not in before:
                sources[key.upper()] = "./.env"
    if env_file:
        for key in dotenv_values(env_file):
            if key.upper().startswith(ENV_PREFIX) and key.upper() not in before:
                sources[key.upper()] = env_file
    return sources


def _check_tokenizers(settings: Settings, models: Sequence[ModelSettings]) -> None:
    """Every tokenizer chosen at start, checked before the server starts: a bad one is
    one line and exit 2, like any other bad setting, instead of a traceback from inside
    the server's start-up. A models file's tokenizer is named by its file and table."""
    from proxy.tokens.check import check_tokenizer
    from proxy.tokens.errors import ConfigError

    where = f"{ENV_PREFIX}MODELS_FILE={settings.models_file}"
    checked: set[tuple[str, str]] = set()
    for label, s in [("", settings), *((f'[models."{m.name}"]', m.settings) for m in models)]:
        if (s.tokenizer, s.upstream_url) in checked:
            continue
        checked.add((s.tokenizer, s.upstream_url))
        try:
            asyncio.run(check_tokenizer(s))
        except ConfigError as exc:
            message = str(exc)
            if label:  # named by its file and table, not by the variable it is not
                message = message.removeprefix(f"{ENV_PREFIX}TOKENIZER={s.tokenizer}: ")
                message = f'{where}: {label}: tokenizer = "{s.tokenizer}": {message}'
            print(f"trimproxy: {message}", file=sys.stderr)
            raise SystemExit(2) from None


def _version() -> str:
    import proxy

    return proxy.__version__


def _read_env_file(path: str) -> None:
    """``--env-file``: its values become environment variables (those already set win,
    as they do over ./.env), so that every worker process sees them too."""
    from dotenv import dotenv_values

    if not os.path.isfile(path):
        print(f"trimproxy: --env-file {path}: no such file", file=sys.stderr)
        raise SystemExit(2)
    for key, value in dotenv_values(path).items():
        if value is not None:
            os.environ.setdefault(key, value)


def _check_models_file(settings: Settings) -> tuple[ModelSettings, ...]:
    """A models file that cannot be used stops start-up with one line and exit 2."""
    from proxy.models import ModelsFileError, load_models

    try:
        return load_models(settings)
    except ModelsFileError as exc:
        print(f"trimproxy: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _check_workers(settings: Settings) -> None:
    """Several workers keep one in-memory session store each: a conversation's turns
    land on any of them, so its turn count and age would be per worker. Refused (exit
    2) rather than served with limits that do not hold."""
    limited = settings.session_max_turns is not None or settings.session_max_age is not None
    if settings.workers > 1 and limited and settings.redis_url is None:
        print(
            f"trimproxy: {settings.workers} workers with session limits "
            f"({ENV_PREFIX}SESSION_MAX_TURNS/{ENV_PREFIX}SESSION_MAX_AGE) need a shared "
            f"session store: set {ENV_PREFIX}REDIS_URL, or run one worker",
            file=sys.stderr,
        )
        raise SystemExit(2)


def _warn_unknown_variables() -> None:
    """Warn (as JSON log lines) about each ``TRIMPROXY_*`` name that is no setting."""
    from dotenv import dotenv_values

    names = set(os.environ)
    if os.path.isfile(".env"):
        names.update(dotenv_values(".env"))
    for warning in unknown_variables(names):
        logging.getLogger("trimproxy.settings").warning(warning)


def _stop_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)


def serve(args: argparse.Namespace) -> int:
    overrides: dict[str, object] = {
        "host": args.host,
        "port": args.port,
        "workers": args.workers,
        "upstream_url": args.upstream_url,
    }
    before = {name.upper() for name in os.environ}
    if args.env_file:
        _read_env_file(args.env_file)
    settings = _load_settings(overrides, _file_sources(before, args.env_file))
    models = _check_models_file(settings)
    _check_workers(settings)
    _check_tokenizers(settings, models)
    # JSON lines for every logger; log_config=None below keeps uvicorn from
    # replacing this with its own plain-text handlers.
    setup_logging(settings.log_level)
    _warn_unknown_variables()
    # Multiprocess metrics go through a shared directory; files left by an earlier
    # run would be summed with this one's, so it is cleared first. That applies to an
    # operator's PROMETHEUS_MULTIPROC_DIR with a single worker too.
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
    created = None
    if settings.workers > 1 and directory is None:
        directory = created = tempfile.mkdtemp(prefix="trimproxy-metrics-")
    if directory is not None:
        clear_multiprocess_dir(directory)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    try:
        if settings.workers == 1:
            from proxy.app import create_app

            app = create_app(settings, serving=True)
            try:
                _run_uvicorn(settings, app)
            except SystemExit:
                refused = getattr(app.state, "refused", None)
                if refused is None:
                    raise
                # A setting only the lifespan could find unusable: one line, exit 2.
                print(f"trimproxy: {refused}", file=sys.stderr)
                return 2
            return 0
        # Several workers: each builds its app from the environment, so the flags
        # travel there.
        for key, value in overrides.items():
            if value is not None:
                os.environ[f"{ENV_PREFIX}{key.upper()}"] = str(value)
        if not settings.compaction_key and not settings.redis_url:
            # One compaction key for every worker: an item opens on any of them (§24).
            os.environ[f"{ENV_PREFIX}COMPACTION_KEY"] = os.urandom(32).hex()
        _run_uvicorn(settings, "proxy.app:app_from_env", factory=True, workers=settings.workers)
        return 0
    finally:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)


def _run_uvicorn(settings: Settings, app: Any, **extra: Any) -> None:
    import uvicorn

    from proxy.serving import (
        HEADER_TIMEOUT_ENV,
        MAX_HEADER_BYTES_ENV,
        HttpToolsWithHeaderTimeout,
    )

    os.environ[HEADER_TIMEOUT_ENV] = str(settings.header_timeout)
    os.environ[MAX_HEADER_BYTES_ENV] = str(settings.max_header_bytes)

    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,  # keep the JSON logging set up above
        access_log=False,  # trimproxy.access writes the access line
        lifespan="on",
        # On SIGTERM uvicorn stops accepting, lets open responses (SSE streams) run to
        # their end, then runs the lifespan shutdown; past this many seconds it cancels
        # them, so the pod still closes cleanly before its grace period's SIGKILL.
        timeout_graceful_shutdown=settings.graceful_shutdown_timeout,
        # A stalled client holds nothing for long: idle keep-alive connections close
        # after idle_timeout, and a request's headers must be complete within
        # header_timeout (proxy/serving.py; it reads the value from the environment,
        # as every worker process does).
        timeout_keep_alive=settings.idle_timeout,
        http=HttpToolsWithHeaderTimeout,
        # The proxy never reads the client's address (the access line leaves it out),
        # so X-Forwarded-* need no parsing on every request; nor does an answer need
        # to name the server that sent it.
        proxy_headers=False,
        server_header=False,
        # A Responses WebSocket message is a request body: the same bound (§24).
        ws_max_size=settings.max_body_bytes,
        **extra,
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sim"]:
        from proxy.sim.cli import main as sim_main

        return sim_main(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "serve":
        refused = _demo_refusal(args)
        if refused:
            print(f"trimproxy: {refused}", file=sys.stderr)
            return 2
    if args.command == "serve" and args.demo:
        child, args.demo_engine_urls = start_demo_engines(args.engines)
        # Every demo engine behind the proxy, routed by session (docs/engines.md).
        args.upstream_url = ",".join(args.demo_engine_urls)
        # uvicorn re-raises the SIGTERM it handled once it has shut down; with the
        # default disposition that would kill this process before the finally below
        # stops the sim, leaving it running with no parent.
        signal.signal(signal.SIGTERM, _stop_on_sigterm)
        try:
            return serve(args)
        finally:
            child.terminate()
            child.wait(timeout=10)
    if args.command == "serve":
        return serve(args)
    if args.command == "soak":
        return soak_cli.run(args)
    if args.command == "plan":
        return plan_cli.run(args)
    if args.command == "top":
        return top_cli.run(args)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
