"""The named values of settings that the layers above them accept too, defined once.

``proxy.settings`` types its fields with these, and the session stores and gate accept
the same ones, so a new value is added in one place. No imports from the rest of the
proxy: anything may import this module (docs/architecture.md §2).
"""

from __future__ import annotations

from typing import Literal

#: What a session limit does: drop the history before the current turn, or answer 409.
LimitAction = Literal["reset", "reject"]
#: When the session store (or a shared ledger) fails: serve without it, or answer 503.
StoreFailure = Literal["open", "closed"]
#: The API a prompt came in by: its dialect's name (``proxy.pipeline.table``), the
#: ``endpoint`` label of the prompt, trim, session and admission series and the access
#: line's ``endpoint`` (docs/monitoring.md). Bounded: one value per row of the table.
Endpoint = str

#: The request header that names the session (``TRIMPROXY_SESSION_HEADER``).
DEFAULT_SESSION_HEADER = "X-Session-ID"
