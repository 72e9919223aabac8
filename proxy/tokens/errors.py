"""The one error a token backend raises at start-up."""

from __future__ import annotations


class ConfigError(ValueError):
    """A tokenizer that cannot be used as configured.

    Raised by ``build_counter`` at start-up, never on a request. The message is one
    line that names the setting and says how to fix it; the CLI prints it as it is.
    """
