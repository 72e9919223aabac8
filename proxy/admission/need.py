"""What one request can hold in the engine's KV cache: its prompt and ``n`` answers.

vLLM V1 runs a request with ``n`` answers as ``n`` child requests of one prompt
(``vllm/v1/engine/parallel_sampling.py``). With prefix caching on (its default) the
children share the prompt's *full* blocks; each holds its own copy of the prompt's last,
partly filled block and its own answer. In blocks of ``B`` tokens, for a prompt of ``P``
tokens and answers of ``C``::

    floor(P / B) + n x ceil((P mod B + C) / B)

which for ``B = 1`` is ``P + n x C``. Without prefix caching nothing is shared and each
child holds ``ceil((P + C) / B)``; so does a transformers worker (FastChat runs ``n``
``generate`` calls, each with its own cache). ``bench/admission_sharing.py`` measures
both on the real engine.
"""

from __future__ import annotations

from dataclasses import dataclass


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


@dataclass(frozen=True, slots=True)
class Need:
    prompt: int
    """Forwarded prompt tokens."""
    allowance: int
    """Completion tokens each answer may take."""
    n: int = 1
    """Answers; each one holds its own completion (and, shared or not, the prompt)."""

    def tokens(self, block_size: int = 1, shares_prompt: bool = True) -> int:
        """The most KV this request can hold, in tokens, rounded up to whole blocks.

        ``shares_prompt``: the engine keeps one copy of the prompt's full blocks for
        all ``n`` answers (vLLM with prefix caching); else each answer has its own.
        """
        prompt, answer, n = max(self.prompt, 0), max(self.allowance, 0), max(self.n, 1)
        if not shares_prompt:
            return n * _blocks(prompt + answer, block_size) * block_size
        whole, tail = divmod(prompt, block_size)
        return (whole + n * _blocks(tail + answer, block_size)) * block_size

    @property
    def completion(self) -> int:
        """The completion tokens the reservation covers: ``n x allowance``."""
        return max(self.n, 1) * max(self.allowance, 0)
