"""The start-up check of a tokenizer setting, before the server starts.

``trimproxy serve`` runs it for every tokenizer it will use (the top level's and each
table of the models file), so that one that cannot work is one line and exit 2, like
any other bad setting, rather than a traceback from inside the server's start-up.
It loads nothing it keeps: ``hf:`` is looked for on disk (the lifespan loads it),
``tiktoken:`` is loaded (tiktoken keeps it, so the lifespan's load costs nothing) and
``upstream`` asks the upstream's ``POST /tokenize`` once. An upstream that cannot be
asked now is left to the lifespan, which says so and counts per request.
"""

from __future__ import annotations

import asyncio
import logging

from proxy.settings import Settings
from proxy.tokens.errors import ConfigError

__all__ = ["ConfigError", "check_tokenizer"]


async def check_tokenizer(settings: Settings) -> None:
    """Raise ``ConfigError`` (one line: the setting and the fix) for a tokenizer that
    cannot be used as configured."""
    kind, _, arg = settings.tokenizer.partition(":")
    if kind == "hf":
        from proxy.tokens.hf.load import tokenizer_dir

        tokenizer_dir(arg)
    elif kind == "tiktoken":
        from proxy.tokens.tiktoken_counter import load_encoding

        await asyncio.to_thread(load_encoding, arg)
    elif kind == "upstream":
        await _check_tokenize(settings)


async def _check_tokenize(settings: Settings) -> None:
    from proxy.tokens.discover import served_names
    from proxy.tokens.vllm import VllmCounter, refuse_without_tokenize
    from proxy.upstream import Upstream

    # Quiet: what this probe could say (an upstream down, an engine marked out), the
    # lifespan says again once logging is set up; only a refusal matters here.
    logging.disable(logging.CRITICAL)
    upstream = Upstream(settings)
    try:
        async with asyncio.timeout(settings.connect_timeout):
            await upstream.start_discovery()
            names = await served_names(upstream)
            failed = await VllmCounter(upstream, default_model=names[-1] if names else None).probe()
    except TimeoutError:
        return
    finally:
        await upstream.aclose()
        logging.disable(logging.NOTSET)
    if failed is not None:
        refuse_without_tokenize(failed)
