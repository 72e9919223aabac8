"""The sim's tokenizer: deterministic, dependency-free, and cheap.

The prompt is rendered the way ChatML templates (Qwen, the FastChat
``qwen-7b-chat`` template) render it::

    <|im_start|>{role}\\n{content}<|im_end|>\\n      (each message)
    <|im_start|>assistant\\n                         (generation prompt)

and counted as:

* each special token (``<|im_start|>``, ``<|im_end|>``) is one token;
* each stretch of text between special tokens is ``ceil(utf8_bytes / 4)`` tokens
  (``SimConfig.bytes_per_token`` changes the 4: two sims with different values stand
  for two models whose tokenizers differ).

So one message costs ``3 + ceil((len(role) + 1 + content_bytes) / 4)`` tokens (two
specials, the ``role\\ncontent`` text, and the ``\\n`` after ``<|im_end|>``), and the
generation prompt costs 4. Four bytes a token is near real BPE vocabularies on English
and below them on other scripts, so the proxy's conservative ``approx`` estimate stays
above the sim's count.

Content that is a list of parts counts its text parts, joined; every non-text part
(an image, audio) counts ``MEDIA_TOKENS``. An assistant message's ``tool_calls`` count
as their compact JSON appended to the content.

Token ids (``/tokenize``) are the text's 4-byte little-endian chunks folded into
``VOCAB_SIZE``; ``<|im_start|>`` is 1 and ``<|im_end|>`` is 2. The ids of a prompt
are therefore a prefix of the ids of any prompt that extends it message by message.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
IM_START_ID = 1
IM_END_ID = 2
VOCAB_SIZE = 32_000
MEDIA_TOKENS = 64
GENERATION_PROMPT_TOKENS = 4  # <|im_start|> + ceil(len("assistant\n") / 4)

_SPECIALS = re.compile(r"(<\|im_start\|>|<\|im_end\|>)")


def text_tokens(text: str, bytes_per_token: int = 4) -> int:
    """Tokens of a stretch of text with no special tokens in it."""
    # ASCII strings are stored one byte a character: len() is the byte count, and
    # the encode() (a copy) is needed only for other text.
    size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    return (size + bytes_per_token - 1) // bytes_per_token


def _content_text(content: Any) -> tuple[str, int]:
    """The text of a message's content, and the media tokens beside it."""
    if content is None:
        return "", 0
    if isinstance(content, str):
        return content, 0
    if isinstance(content, list):
        texts: list[str] = []
        media = 0
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                media += MEDIA_TOKENS
        return "".join(texts), media
    return orjson.dumps(content).decode(), 0


def message_text(message: dict[str, Any]) -> tuple[str, int]:
    """``role\\ncontent`` as rendered between the special tokens, and media tokens."""
    text, media = _content_text(message.get("content"))
    tool_calls = message.get("tool_calls")
    if tool_calls:
        text += orjson.dumps(tool_calls).decode()
    return f"{message.get('role', '')}\n{text}", media


def message_tokens(message: dict[str, Any], bytes_per_token: int = 4) -> int:
    text, media = message_text(message)
    return 3 + text_tokens(text, bytes_per_token) + media


def prompt_tokens(
    messages: Iterable[dict[str, Any]], *, add_generation_prompt: bool, bytes_per_token: int = 4
) -> int:
    total = sum(message_tokens(m, bytes_per_token) for m in messages)
    if not add_generation_prompt:
        return total
    return total + 1 + text_tokens("assistant\n", bytes_per_token)


def raw_prompt_tokens(prompt: str, bytes_per_token: int = 4) -> int:
    """Tokens of a plain prompt string (special-token markers in it count as one)."""
    if "<|im_" not in prompt:
        return text_tokens(prompt, bytes_per_token)
    total = 0
    for piece in _SPECIALS.split(prompt):
        if piece in (IM_START, IM_END):
            total += 1
        elif piece:
            total += text_tokens(piece, bytes_per_token)
    return total


def _text_ids(text: str, size: int = 4) -> list[int]:
    data = text.encode("utf-8", "surrogatepass")
    if not data:
        return []
    data += b"\0" * (-len(data) % size)
    if size == 4:
        # memoryview.cast does the chunking in C; only the fold runs in Python.
        return [3 + v % (VOCAB_SIZE - 3) for v in memoryview(data).cast("I").tolist()]
    chunks = (int.from_bytes(data[i : i + size], "little") for i in range(0, len(data), size))
    return [3 + v % (VOCAB_SIZE - 3) for v in chunks]


def raw_prompt_ids(prompt: str, bytes_per_token: int = 4) -> list[int]:
    ids: list[int] = []
    for piece in _SPECIALS.split(prompt):
        if piece == IM_START:
            ids.append(IM_START_ID)
        elif piece == IM_END:
            ids.append(IM_END_ID)
        elif piece:
            ids.extend(_text_ids(piece, bytes_per_token))
    return ids


def prompt_ids(
    messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool, bytes_per_token: int = 4
) -> list[int]:
    """Token ids of the rendered prompt; ``len()`` equals ``prompt_tokens``."""
    ids: list[int] = []
    for message in messages:
        text, media = message_text(message)
        ids.append(IM_START_ID)
        ids.extend(_text_ids(text, bytes_per_token))
        ids.extend([0] * media)
        ids.append(IM_END_ID)
        ids.extend(_text_ids("\n", bytes_per_token))
    if add_generation_prompt:
        ids.append(IM_START_ID)
        ids.extend(_text_ids("assistant\n", bytes_per_token))
    return ids


def render(messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool) -> str:
    """The ChatML string the counts above describe (media parts left out)."""
    parts = [f"{IM_START}{message_text(m)[0]}{IM_END}\n" for m in messages]
    if add_generation_prompt:
        parts.append(f"{IM_START}assistant\n")
    return "".join(parts)


def answer_ids(prompt: Sequence[int], answer: str, bytes_per_token: int = 4) -> list[int]:
    """The ids of ``prompt`` (ending in the generation prompt) followed by ``answer``
    as the next turn renders it: ``<|im_start|>assistant\\n{answer}<|im_end|>\\n``."""
    generation_text = len(_text_ids("assistant\n", bytes_per_token))
    ids = list(prompt[:-generation_text])
    ids.extend(_text_ids(f"assistant\n{answer}", bytes_per_token))
    ids.append(IM_END_ID)
    ids.extend(_text_ids("\n", bytes_per_token))
    return ids
