"""The ``trimproxy`` command."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from proxy.logs import setup_logging
from proxy.metrics import clear_multiprocess_dir
from proxy.settings import ENV_PREFIX, Settings, describe_error


def _settings_help() -> str:
    lines = ["settings (environment variables; a .env file works too):"]
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
        "--demo",
        action="store_true",
        help="start an embedded simulated vLLM server and proxy to it (try it without a GPU)",
    )
    sim = commands.add_parser(
        "sim",
        help="run a simulated vLLM/FastChat server (demos, tests, benchmarks)",
        description="Simulated vLLM/FastChat OpenAI server with vLLM-style KV-cache accounting.",
    )
    from proxy.sim.cli import add_arguments

    add_arguments(sim)
    return parser


def _start_demo_upstream() -> tuple[subprocess.Popen[str], str]:
    """The sim in a child process on a free port; returns it and its URL."""
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
            "--tokens-per-second",
            "50",
            "--completion-tokens",
            "48",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    for line in child.stdout:
        if line.startswith(READY_PREFIX):
            url = line[len(READY_PREFIX) :].strip()
            print(f"trimproxy: demo upstream (simulated vLLM) at {url}", file=sys.stderr)
            return child, url
    child.wait()
    print("trimproxy: the demo upstream did not start", file=sys.stderr)
    raise SystemExit(1)


def _load_settings(overrides: dict[str, object]) -> Settings:
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]
    except ValidationError as exc:
        print(f"trimproxy: {describe_error(exc)}", file=sys.stderr)
        raise SystemExit(2) from None


def serve(args: argparse.Namespace) -> int:
    overrides: dict[str, object] = {
        "host": args.host,
        "port": args.port,
        "workers": args.workers,
        "upstream_url": args.upstream_url,
    }
    settings = _load_settings(overrides)
    # JSON lines for every logger; log_config=None below keeps uvicorn from
    # replacing this with its own plain-text handlers.
    setup_logging(settings.log_level)
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

            _run_uvicorn(settings, create_app(settings))
            return 0
        # Several workers: each builds its app from the environment, so the flags
        # travel there.
        for key, value in overrides.items():
            if value is not None:
                os.environ[f"{ENV_PREFIX}{key.upper()}"] = str(value)
        _run_uvicorn(settings, "proxy.app:app_from_env", factory=True, workers=settings.workers)
        return 0
    finally:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)


def _run_uvicorn(settings: Settings, app: Any, **extra: Any) -> None:
    import uvicorn

    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,  # keep the JSON logging set up above
        access_log=False,  # trimproxy.access writes the access line
        lifespan="on",
        **extra,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "sim":
        from proxy.sim.cli import run_from_args

        return run_from_args(args)
    if args.command == "serve" and args.demo:
        child, args.upstream_url = _start_demo_upstream()
        try:
            return serve(args)
        finally:
            child.terminate()
            child.wait(timeout=10)
    if args.command == "serve":
        return serve(args)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
