"""The ``hf`` backend: the model's own tokenizer and chat template (``counter``), and
the helpers only it uses: ``load`` (the tokenizer from local files), ``normalize``
(messages as vLLM hands them to the template), ``placement`` (how a template's
requests are rendered and split: ``render``, the tracked render, and ``locate``,
placing messages in a plain one), ``added_tokens`` (cutting text at special
tokens), ``runs`` (cached counts of the pieces between them) and ``self_check``
(the named checks at start-up).
"""

from __future__ import annotations

from proxy.tokens.hf.counter import HFCounter
from proxy.tokens.hf.load import load_tokenizer

__all__ = ["HFCounter", "load_tokenizer"]
