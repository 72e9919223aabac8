"""The names session settings and stores share, defined once.

``proxy.settings`` types its fields with these, and the stores and the gate accept
the same ones, so a new value is added in one place. No imports from the rest of
the proxy: anything may import this module.
"""

from __future__ import annotations

from typing import Literal

#: What a session limit does: drop the history before the current turn, or answer 409.
LimitAction = Literal["reset", "reject"]
#: When the store fails: serve without session limits, or answer 503.
StoreFailure = Literal["open", "closed"]
#: What the rule decided for one request.
Outcome = Literal["pass", "reset", "reject"]
#: Which limit a request hit.
Reason = Literal["turns", "age"]

#: The request header that names the session (``TRIMPROXY_SESSION_HEADER``).
DEFAULT_SESSION_HEADER = "X-Session-ID"
