"""The ``hf:<dir or model id>`` backend: the model's own tokenizer and chat template.

Exact: ``count(...).total`` equals
``len(apply_chat_template(vllm_normalised(messages), tools=..., add_generation_prompt=True))``
token for token. A request is rendered once by its template's ``Placement``
(``placement``: placed, tracked or estimated), the rendered text is cut at the
added tokens and its runs' counts come from a cache (``runs``), and each message
gets the tokens of its own stretch of the text. Both shortcuts are checked against
``apply_chat_template`` at start-up by named checks (``self_check``), which choose
the placement per template and whether the runs' counts are fitted to a whole
encode: a shortcut that fails is turned off, slower, still exact.

Files are read from the local disk only (``load``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from proxy.tokens.approx import IMAGE_TOKENS, ApproxCounter
from proxy.tokens.cache import ByteLRU
from proxy.tokens.errors import ConfigError
from proxy.tokens.hf import self_check
from proxy.tokens.hf.added_tokens import AddedToken, AddedTokenSplitter
from proxy.tokens.hf.load import load_tokenizer
from proxy.tokens.hf.normalize import (
    as_system,
    detect_content_format,
    has_developer,
    merged_systems,
    to_conversation,
)
from proxy.tokens.hf.placement import Estimated, Placement, Template
from proxy.tokens.hf.render import Rendered, TrackedTemplate
from proxy.tokens.hf.runs import RunCounter
from proxy.tokens.hf.self_check import CHECK_CONVERSATIONS, CHECK_TOOLS, Sample
from proxy.tokens.shares import fit_counts
from proxy.types import JSONObject, Message, PromptCount

log = logging.getLogger("trimproxy.tokens")

DEFAULT_CACHE_BYTES = 64 * 1024 * 1024


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


class _Refused(Exception):
    """apply_chat_template refused a check conversation."""


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
        #: cheap floor on a prompt's count (``proxy.pipeline.prepare``) divides by it.
        self.max_token_chars: int | None = max(map(len, tokenizer.get_vocab()), default=0) or None
        self._utils = chat_template_utils
        self._context = dict(chat_template_utils._plain_template_data(tokenizer.special_tokens_map))
        self._templates: dict[str, Template] = {}
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="trimproxy-tok")
        backend = tokenizer.backend_tokenizer
        # A count never reads the offsets, which encode_batch_fast (tokenizers 0.20)
        # does not compute: the same ids in less time (docs/performance.md §6).
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
        self._fallback = ApproxCounter()
        #: Raw prompts' counts (``count_prompt``), by digest.
        self._prompts: ByteLRU[bytes, int] = ByteLRU(cache_bytes // 64)
        self._estimated = Estimated(tokenizer)
        #: The named start-up checks that failed (``self_check.run``).
        self.failures: tuple[self_check.Failure, ...] = ()
        #: How a rendered text's tokens are counted: by runs until a check fails.
        self._tally = self._by_runs

    # --- start-up ---------------------------------------------------------------

    @classmethod
    async def load(cls, spec: str, *, cache_bytes: int = DEFAULT_CACHE_BYTES) -> HFCounter:
        def build() -> HFCounter:
            counter = cls(load_tokenizer(spec), spec, cache_bytes=cache_bytes)
            counter.self_check()
            return counter

        return await asyncio.to_thread(build)

    def _template(self, tools: Sequence[JSONObject] | None) -> Template:
        source = self._tok.get_chat_template(None, list(tools) if tools else None)
        template = self._templates.get(source)
        if template is None:
            compiled = self._utils._compile_jinja_template(source)
            tracked = TrackedTemplate(compiled, self._context)
            fmt = detect_content_format(source, compiled.environment)
            template = Template(source, tracked, fmt)
            conversation, _ = to_conversation([{"role": "user", "content": "hi"}], fmt)
            try:
                tracked.learn_generation_suffix(self._prepare(conversation))
            except Exception:
                tracked.generation_suffix = ""
            self._templates[source] = template
        return template

    def self_check(self) -> None:
        """Run the named checks (``self_check.CHECKS``) on the check conversations;
        log each failed one by name and turn off the shortcut it checks: exact either
        way. Raises ``ConfigError`` when the template renders none of them."""
        samples, refusal = self._samples()
        if not samples:
            check = self_check.TEMPLATE_RENDERS
            raise ConfigError(
                f"TRIMPROXY_TOKENIZER=hf:{self.source}: self check {check.name!r} failed: "
                f"the chat template fails on every check conversation (first: {refusal}); "
                f"{check.instead}"
            )
        self.failures = tuple(self_check.run(samples))
        off = {(f.check.shortcut, id(f.sample.template)) for f in self.failures}
        for template in self._templates.values():
            template.choose(("tracking", id(template)) not in off, self._estimated)
        if any(f.check.shortcut == "runs" for f in self.failures):
            self._tally = self._by_whole_encode
        for level, line in self_check.report(self.failures):
            log.log(level, "%s: %s", self.source, line)
        self.runs.clear()  # the check conversations are no one's traffic

    def _samples(self) -> tuple[list[Sample], str]:
        """Each check conversation, without tools and with, that transformers
        renders; and the first it refused, with why (a template may refuse a shape,
        such as tool calls)."""
        samples: list[Sample] = []
        refusal = ""
        for n, messages in enumerate(CHECK_CONVERSATIONS, 1):
            for tools in (None, CHECK_TOOLS):
                label = f"check conversation {n}" + (" with tools" if tools else "")
                try:
                    samples.append(self._sample(label, messages, tools))
                except _Refused as refused:
                    refusal = refusal or f"{label}: {refused}"
        return samples, refusal

    def _sample(
        self, label: str, messages: list[Message], tools: list[JSONObject] | None
    ) -> Sample:
        template = self._template(tools)
        conversation, _ = to_conversation(messages, template.format)
        try:
            text = self._tok.apply_chat_template(
                conversation, tools=tools, add_generation_prompt=True, tokenize=False
            )
            ids = self._tok.apply_chat_template(
                conversation,
                tools=tools,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
        except Exception as exc:
            raise _Refused(f"{type(exc).__name__}: {exc}") from None
        prepared = self._prepare(conversation)
        tracked: Rendered | None
        try:
            tracked = template.tracked.render(prepared, tools)
        except Exception:
            tracked = None
        runs = sum(n for _, n in self.runs.spans_sync(text))
        return Sample(label, template, tools, conversation, prepared, text, len(ids), tracked, runs)

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

    async def _total(self, text: str) -> int:
        loop = asyncio.get_running_loop()
        counts = await loop.run_in_executor(self._executor, self._encode, [text])
        return counts[0]

    async def _by_runs(
        self, rendered: Rendered, placement: Placement, messages: Sequence[Message]
    ) -> tuple[list[int], int]:
        return placement.split(await self.runs.spans(rendered.text), rendered, messages)

    async def _by_whole_encode(
        self, rendered: Rendered, placement: Placement, messages: Sequence[Message]
    ) -> tuple[list[int], int]:
        """Where the runs' counts failed the check: the split from them, fitted to
        the whole text's count."""
        per, _ = await self._by_runs(rendered, placement, messages)
        parts, overhead = fit_counts(per, await self._total(rendered.text))
        return list(parts), overhead

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
            placement = template.placement(tools)
            converted = not template.developer and has_developer(messages)
            if converted:
                messages = as_system(messages)
            conversation, media = to_conversation(messages, template.format)
            rendered = placement.render(self._prepare(conversation), tools)
            merged = merged_systems(conversation) if converted else None
            whole = None if merged is None else placement.render(self._prepare(merged), tools)
        except Exception as exc:
            # vLLM will refuse this conversation too; let it say why. Count a bound.
            log.warning(
                "chat template failed (%s); counting this request by estimate", type(exc).__name__
            )
            return await self._fallback.count(messages, tools=tools)
        per, overhead = await self._tally(rendered, placement, messages)
        if whole is not None:
            # What vLLM renders merges system messages: each message's share from the
            # render before the merge, fitted to the merged render's count.
            parts, overhead = fit_counts(per, await self._total(whole.text))
            per = list(parts)
        extra = [m * IMAGE_TOKENS for m in media]
        return PromptCount(tuple(p + e for p, e in zip(per, extra, strict=True)), overhead)

    async def count_prompt(
        self, text: str, *, model: str | None = None, special_tokens: bool = True
    ) -> int:
        """``tokenizer.encode(text, add_special_tokens=...)``, as vLLM encodes a
        completions prompt (BOS and the like added by the tokenizer's own rule);
        cached by the text's digest, the way a client resends a long few-shot prefix."""
        key = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16)
        key.update(b"\x01" if special_tokens else b"\x00")
        digest = key.digest()
        known = self._prompts.get(digest)
        if known is not None:
            return known

        def encode() -> int:
            return len(self._tok.encode(text, add_special_tokens=special_tokens))

        loop = asyncio.get_running_loop()
        count = await loop.run_in_executor(self._executor, encode)
        self._prompts.put(digest, count)
        return count

    async def aclose(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
