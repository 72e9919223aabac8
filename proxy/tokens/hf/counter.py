"""The ``hf:<dir or model id>`` backend: the model's own tokenizer and chat template.

Exact: ``count(...).total`` equals
``len(apply_chat_template(vllm_normalised(messages), tools=..., add_generation_prompt=True))``
token for token. The template is rendered once per request (``render``), the
rendered text is cut at the added tokens and its runs' counts come from a cache
(``runs``), and each message gets the tokens of its own stretch of the text. Both
shortcuts are checked against ``apply_chat_template`` at start-up on check
conversations; a tokenizer where either disagrees falls back to the plain path
(render with transformers, encode the whole text in a thread): slower, still exact.

Files are read from the local disk only: a directory, or a model id resolved in the
local Hugging Face cache (as vLLM resolves it with ``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from proxy.tokens.approx import IMAGE_TOKENS, ApproxCounter, estimate_message
from proxy.tokens.discover import hub_cache_dir, local_tokenizer
from proxy.tokens.errors import ConfigError
from proxy.tokens.hf.added_tokens import AddedToken, AddedTokenSplitter
from proxy.tokens.hf.locate import Locator
from proxy.tokens.hf.normalize import ContentFormat, detect_content_format, to_conversation
from proxy.tokens.hf.render import Rendered, TrackedTemplate, attribute
from proxy.tokens.hf.runs import RunCounter
from proxy.tokens.hf.self_check import CHECK_CONVERSATIONS, CHECK_TOOLS
from proxy.tokens.shares import fit_counts, scale_to
from proxy.types import JSONObject, Message, PromptCount

log = logging.getLogger("trimproxy.tokens")

DEFAULT_CACHE_BYTES = 64 * 1024 * 1024


#: A directory with none of these holds no tokenizer AutoTokenizer could load.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def tokenizer_dir(spec: str) -> Path:
    """The local directory ``hf:<spec>`` names, checked without loading anything, so
    that ``trimproxy serve`` can refuse a bad setting with one line before it starts;
    raises ``ConfigError``."""
    path = Path(spec).expanduser()
    looks_like_path = spec.startswith(("/", ".", "~")) or path.exists()
    if looks_like_path and not path.is_dir():
        raise ConfigError(
            f"TRIMPROXY_TOKENIZER=hf:{spec}: no such directory; point it at the folder "
            "that holds the served model's tokenizer.json and tokenizer_config.json"
        )
    if not looks_like_path:
        # A model id: its snapshot in the local Hugging Face cache, as vLLM finds it
        # with HF_HUB_OFFLINE=1. Resolved here so that the cache location is read from
        # the environment now, and no code path can reach for the network.
        found = local_tokenizer(spec)
        if found is None:
            raise ConfigError(
                f"TRIMPROXY_TOKENIZER=hf:{spec}: not in the local Hugging Face cache "
                f"({hub_cache_dir()}); trimproxy never downloads: fetch the model's tokenizer "
                "files on a machine with access, then set hf:<directory> or HF_HOME"
            )
        path = found
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise ConfigError(
            f"TRIMPROXY_TOKENIZER=hf:{spec}: {path} holds no tokenizer files; point it at "
            "the folder with the served model's tokenizer.json and tokenizer_config.json"
        )
    return path


def load_tokenizer(spec: str) -> Any:
    """The tokenizer named by ``hf:<spec>``, from local files only."""
    from transformers import AutoTokenizer  # slow import: only when this backend is used

    path = tokenizer_dir(spec)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=False
        )
    except Exception as exc:
        raise ConfigError(
            f"TRIMPROXY_TOKENIZER=hf:{spec}: cannot load a tokenizer from {path} "
            f"({type(exc).__name__}); it needs the model's tokenizer.json and "
            "tokenizer_config.json (custom tokenizer code is not run)"
        ) from None
    try:
        tokenizer.get_chat_template()
    except Exception:
        raise ConfigError(
            f"TRIMPROXY_TOKENIZER=hf:{spec}: the tokenizer has no chat template; use the "
            "chat model's tokenizer files (tokenizer_config.json with chat_template, or "
            "chat_template.jinja)"
        ) from None
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        raise ConfigError(
            f"TRIMPROXY_TOKENIZER=hf:{spec}: no tokenizer.json (fast tokenizer) in {path}; "
            "save the tokenizer with transformers once to create it"
        )
    return tokenizer


def _added_tokens(backend: Any) -> list[AddedToken]:
    return [
        AddedToken(t.content, bool(t.lstrip), bool(t.rstrip), bool(t.single_word))
        for t in backend.get_added_tokens_decoder().values()
    ]


def _anchor(backend: Any) -> str | None:
    for token in backend.get_added_tokens_decoder().values():
        if not (token.lstrip or token.rstrip or token.single_word or token.normalized):
            return str(token.content)
    return None


def _contents_inside(conversation: list[dict[str, Any]], rendered: Rendered) -> bool:
    """Does each message's text (where it appears once, verbatim) lie in its own
    stretch? System messages are left out: templates move them."""
    text, bounds = rendered.text, rendered.bounds
    for i, message in enumerate(conversation):
        content = message.get("content")
        if message.get("role") == "system" or not isinstance(content, str):
            continue
        content = content.strip()
        if len(content) >= 8 and text.count(content) == 1:
            at = text.index(content)
            if not bounds[i] <= at < bounds[i + 1]:
                return False
    return True


class _Template:
    """One chat template of the tokenizer, with what the start-up check found."""

    def __init__(self, source: str, tracked: TrackedTemplate, fmt: ContentFormat) -> None:
        self.source = source
        self.tracked = tracked
        self.format: ContentFormat = fmt
        self.tracking_ok = True
        #: Placing messages in a plain render (``locate``), without tools and with.
        self.locators = (Locator(), Locator())


class HFCounter:
    name = "hf"
    exact = True
    # Templates render by position (hoisted system prompts, reasoning kept only after
    # the last user turn), so a subset's count is not always the sum of its parts.
    additive = False

    def __init__(
        self, tokenizer: Any, source: str, *, cache_bytes: int = DEFAULT_CACHE_BYTES
    ) -> None:
        from transformers.utils import chat_template_utils

        self.source = source
        self._tok = tokenizer
        #: The longest vocabulary entry in characters (byte-level BPE spells one byte
        #: per character, so it is at least the most text one token covers): the
        #: cheap floor on a prompt's count (``proxy.prepare``) divides by it.
        self.max_token_chars: int | None = max(map(len, tokenizer.get_vocab()), default=0) or None
        self._utils = chat_template_utils
        self._context = dict(chat_template_utils._plain_template_data(tokenizer.special_tokens_map))
        self._templates: dict[str, _Template] = {}
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="trimproxy-tok")
        backend = tokenizer.backend_tokenizer
        # A count never reads the offsets, which encode_batch_fast (tokenizers 0.20)
        # does not compute: the same ids, ~30% less time on a fresh 1,000-token prompt.
        encode_batch = getattr(backend, "encode_batch_fast", backend.encode_batch)

        def encode(texts: list[str]) -> list[int]:
            return [len(e.ids) for e in encode_batch(texts, add_special_tokens=False)]

        self._encode = encode
        self.runs = RunCounter(
            AddedTokenSplitter(_added_tokens(backend)),
            encode,
            anchor=_anchor(backend),
            cache_bytes=cache_bytes,
            executor=self._executor,
        )
        self.runs_ok = True
        self._fallback = ApproxCounter()

    # --- start-up ---------------------------------------------------------------

    @classmethod
    async def load(cls, spec: str, *, cache_bytes: int = DEFAULT_CACHE_BYTES) -> HFCounter:
        def build() -> HFCounter:
            counter = cls(load_tokenizer(spec), spec, cache_bytes=cache_bytes)
            counter.self_check()
            return counter

        return await asyncio.to_thread(build)

    def _template(self, tools: Sequence[JSONObject] | None) -> _Template:
        source = self._tok.get_chat_template(None, list(tools) if tools else None)
        template = self._templates.get(source)
        if template is None:
            compiled = self._utils._compile_jinja_template(source)
            tracked = TrackedTemplate(compiled, self._context)
            fmt = detect_content_format(source, compiled.environment)
            template = _Template(source, tracked, fmt)
            conversation, _ = to_conversation([{"role": "user", "content": "hi"}], fmt)
            try:
                tracked.learn_generation_suffix(self._prepare(conversation))
            except Exception:
                tracked.generation_suffix = ""
            self._templates[source] = template
        return template

    def self_check(self) -> None:
        """Compare the fast path with ``apply_chat_template`` on the check conversations;
        turn off a shortcut that disagrees (and say so), keep exactness."""
        rendered_any = False
        tracked: list[tuple[Locator, list[dict[str, Any]], Rendered]] = []
        for sample in CHECK_CONVERSATIONS:
            for tools in (None, CHECK_TOOLS):
                template = self._template(tools)
                conversation, _ = to_conversation(sample, template.format)
                try:
                    want_text = self._tok.apply_chat_template(
                        conversation, tools=tools, add_generation_prompt=True, tokenize=False
                    )
                    want_ids = self._tok.apply_chat_template(
                        conversation,
                        tools=tools,
                        add_generation_prompt=True,
                        tokenize=True,
                        return_dict=False,
                    )
                except Exception:
                    continue  # the template refuses this shape (e.g. no tool calls): skip it
                rendered_any = True
                prepared = self._prepare(conversation)
                try:
                    got = template.tracked.render(prepared, tools)
                except Exception:
                    got = None
                fits = (
                    got is not None
                    and got.text == want_text
                    and _contents_inside(conversation, got)
                )
                if fits and got is not None:
                    locator = template.locators[tools is not None]
                    locator.learn(prepared, got)
                    tracked.append((locator, prepared, got))
                if template.tracking_ok and not fits:
                    template.tracking_ok = False
                    log.warning(
                        "%s: tracked rendering differs from transformers' or misplaces "
                        "messages; splitting totals by estimate",
                        self.source,
                    )
                if self.runs_ok and sum(n for _, n in self.runs.spans_sync(want_text)) != len(
                    want_ids
                ):
                    self.runs_ok = False
                    log.warning(
                        "%s: counting by added-token runs differs from the tokenizer; "
                        "encoding whole prompts instead (slower, still exact)",
                        self.source,
                    )
        # Every header learned first: a locator is checked against them all.
        for locator, prepared, got in tracked:
            locator.verify(prepared, got)
        if not rendered_any:
            raise ConfigError(
                f"TRIMPROXY_TOKENIZER=hf:{self.source}: the chat template fails on every "
                "check conversation; check that these are the chat model's tokenizer files"
            )
        self.runs.clear()  # the check conversations are no one's traffic

    # --- per request --------------------------------------------------------------

    def _prepare(self, conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # What transformers does to messages before rendering: drop None-valued keys,
        # and (transformers 5) copy reasoning under the names templates read.
        # One loop, not two any() generators: it runs on every request.
        nones = reasoning = False
        for m in conversation:
            if None in m.values():  # JSON values: == None only for None itself
                nones = True
            if "reasoning" in m:
                reasoning = True
        out = conversation
        if nones:
            out = [{k: v for k, v in m.items() if v is not None} for m in conversation]
        alias = getattr(self._utils, "_alias_reasoning_fields", None)
        if alias is not None and reasoning:
            return list(alias(out))
        return out

    @staticmethod
    def _render(
        template: _Template, prepared: list[dict[str, Any]], tools: Sequence[JSONObject] | None
    ) -> tuple[str, Sequence[int]]:
        """The rendered text and each message's bounds in it: placed in a plain render
        where the template's locator can, else from a tracked render."""
        locator = template.locators[tools is not None]
        headers = locator.headers_of(prepared) if locator.usable else None
        if headers is not None:
            text, end = template.tracked.render_plain(prepared, tools)
            bounds = locator.locate(text, prepared, headers, end)
            locator.note(bounds is not None)
            if bounds is not None:
                return text, bounds
        rendered = template.tracked.render(prepared, tools)
        return rendered.text, rendered.bounds

    async def _total(self, text: str) -> int:
        loop = asyncio.get_running_loop()
        counts = await loop.run_in_executor(self._executor, self._encode, [text])
        return counts[0]

    async def count(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[JSONObject] | None = None,
        model: str | None = None,
    ) -> PromptCount:
        if not messages:
            return await self._fallback.count(messages, tools=tools)
        try:
            template = self._template(tools)
            conversation, media = to_conversation(messages, template.format)
            prepared = self._prepare(conversation)
            if template.tracking_ok:
                text, bounds = self._render(template, prepared, tools)
            else:
                text = self._tok.apply_chat_template(
                    prepared, tools=tools, add_generation_prompt=True, tokenize=False
                )
                bounds = ()
        except Exception as exc:
            # vLLM will refuse this conversation too; let it say why. Count a bound.
            log.warning(
                "chat template failed (%s); counting this request by estimate", type(exc).__name__
            )
            return await self._fallback.count(messages, tools=tools)
        pieces = await self.runs.spans(text)
        if bounds:
            per, overhead = attribute(pieces, bounds)
        else:
            total = sum(n for _, n in pieces)
            per, overhead = scale_to([estimate_message(m) for m in messages], total), 0
        if not self.runs_ok:
            parts, overhead = fit_counts(per, await self._total(text))
            per = list(parts)
        extra = [m * IMAGE_TOKENS for m in media]
        return PromptCount(tuple(p + e for p, e in zip(per, extra, strict=True)), overhead)

    async def aclose(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
