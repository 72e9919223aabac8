"""The ``hf`` backend: the model's own tokenizer and chat template (``counter``), and
the helpers only it uses: ``normalize`` (messages as vLLM hands them to the
template), ``render`` (one rendering that attributes text to messages),
``added_tokens`` (cutting text at special tokens), ``runs`` (cached counts of the
pieces between them) and ``self_check`` (the conversations checked at start-up).
"""

from __future__ import annotations

from proxy.tokens.hf.counter import HFCounter, load_tokenizer

__all__ = ["HFCounter", "load_tokenizer"]
