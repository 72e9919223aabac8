"""The forms ``TRIMPROXY_UPSTREAM_URL`` (and a models file's ``upstream_url``) take.

One engine (``http://10.0.0.5:8000``), several engines that serve the same models
(comma-separated, or a TOML array in the models file), or ``dns+http://name:port``:
a DNS name whose every A/AAAA record is an engine (a Kubernetes headless Service).
Each URL is normalised (a trailing ``/`` or ``/v1`` dropped) and checked here, so a
value that cannot work stops start-up with one line instead of failing every request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from yarl import URL

#: The schemes of an engine URL; ``dns+`` in front names a DNS name of engines.
SCHEMES = ("http", "https")
DNS_PREFIX = "dns+"


@dataclass(frozen=True, slots=True)
class EngineUrl:
    """One entry of the setting: an engine's root URL, or a DNS name of engines."""

    url: str
    """Normalised: ``http://host:port`` (and a path prefix, if any), no trailing ``/``."""
    dns: bool = False
    """``dns+http://name:port``: ``url`` is ``http://name:port``, resolved to engines."""


def _normalise(raw: str) -> EngineUrl:
    text = raw.strip().rstrip("/")
    dns = text.startswith(DNS_PREFIX)
    if dns:
        text = text[len(DNS_PREFIX) :]
    if text.endswith("/v1"):
        text = text[: -len("/v1")]
    scheme = text.partition("://")[0]
    if scheme not in SCHEMES or "://" not in text:
        raise ValueError(
            f"{raw.strip()!r} must start with http://, https://, dns+http:// or dns+https://"
        )
    try:
        url = URL(text)
        host = url.host
        port = url.port
    except ValueError:
        raise ValueError(f"{raw.strip()!r} is not a valid URL") from None
    if not host:
        raise ValueError(f"{raw.strip()!r} names no host")
    if url.query_string or url.fragment:
        raise ValueError(f"{raw.strip()!r}: an engine URL takes no query or fragment")
    if dns and (url.explicit_port is None or port is None):
        raise ValueError(f"{raw.strip()!r}: a dns+ URL names the engines' port")
    return EngineUrl(text, dns)


def parse_upstream(value: str | Sequence[str]) -> tuple[EngineUrl, ...]:
    """Every entry of the setting, normalised; ``ValueError`` with one line on a bad one."""
    parts = value.split(",") if isinstance(value, str) else list(value)
    if not all(isinstance(p, str) for p in parts):
        raise ValueError("expected a URL, a comma-separated list of URLs, or a list of them")
    entries = [p for p in parts if p.strip()]
    if not entries:
        raise ValueError("names no engine")
    out: list[EngineUrl] = []
    for raw in entries:
        entry = _normalise(raw)
        if entry in out:
            raise ValueError(f"{entry.url} is listed twice")
        out.append(entry)
    return tuple(out)


def joined(entries: Sequence[EngineUrl]) -> str:
    """The setting's normal form: the entries, comma-separated."""
    return ",".join((DNS_PREFIX if e.dns else "") + e.url for e in entries)


def engine_label(url: str) -> str:
    """An engine's name in logs and metric labels: its URL without the scheme."""
    return url.partition("://")[2] or url
