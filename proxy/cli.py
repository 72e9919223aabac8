"""The ``trimproxy`` command."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Sequence

from pydantic import ValidationError

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
    return parser


def _load_settings(overrides: dict[str, object]) -> Settings:
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]
    except ValidationError as exc:
        print(f"trimproxy: {describe_error(exc)}", file=sys.stderr)
        raise SystemExit(2) from None


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    overrides: dict[str, object] = {
        "host": args.host,
        "port": args.port,
        "workers": args.workers,
        "upstream_url": args.upstream_url,
    }
    settings = _load_settings(overrides)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    if settings.workers == 1:
        from proxy.app import create_app

        uvicorn.run(
            create_app(settings),
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
            access_log=False,
            lifespan="on",
        )
        return 0
    # Several workers: each builds its app from the environment, so the flags travel
    # there, and the metrics of all workers are aggregated through a shared directory
    # that is wiped at start (stale files would count old processes).
    for key, value in overrides.items():
        if value is not None:
            os.environ[f"{ENV_PREFIX}{key.upper()}"] = str(value)
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or tempfile.mkdtemp(
        prefix="trimproxy-metrics-"
    )
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    uvicorn.run(
        "proxy.app:app_from_env",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level=settings.log_level,
        access_log=False,
        lifespan="on",
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return serve(args)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
