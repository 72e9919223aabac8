"""The names session settings and stores share, defined once.

The stores and the gate accept the setting values ``proxy.choices`` defines (re-exported
here), and name the rule's outcomes below. Nothing above ``proxy.choices`` is imported.
"""

from __future__ import annotations

from typing import Literal

from proxy.choices import DEFAULT_SESSION_HEADER, LimitAction, StoreFailure

__all__ = ["DEFAULT_SESSION_HEADER", "LimitAction", "Outcome", "Reason", "StoreFailure"]

#: What the rule decided for one request.
Outcome = Literal["pass", "reset", "reject"]
#: Which limit a request hit.
Reason = Literal["turns", "age"]
