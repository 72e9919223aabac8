"""What a trimmer's output is judged by: invariant checks, prefix reuse, timing stats.

Everything here works on OpenAI-style message dicts, so the peers' outputs (LangChain
returns its own message objects; the bench converts them back) are checked the same
way as trimproxy's. Messages are compared by their *meaning* (``message_key``), not
by object identity or JSON bytes: LangChain's round trip re-serialises tool-call
arguments and turns ``content: null`` into ``""``, which is no change to the prompt
a model sees, while a middle-cut content is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

Message = dict[str, Any]
HEAD_ROLES = frozenset(("system", "developer"))


def _content_key(content: Any) -> Any:
    if content is None or content == "" or content == []:
        return ""
    if isinstance(content, list):
        texts = [
            p if isinstance(p, str) else p.get("text") if isinstance(p, dict) else None
            for p in content
        ]
        if all(isinstance(t, str) for t in texts):
            return "".join(texts)  # type: ignore[arg-type]
        return json.dumps(content, sort_keys=True, ensure_ascii=False)
    return content


def _args_key(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return arguments
        return json.dumps(parsed, sort_keys=True, ensure_ascii=False)
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False)


def message_key(m: Message) -> tuple[Any, ...]:
    """What a message contributes to the prompt, independent of serialisation."""
    calls = tuple(
        (
            c.get("id"),
            (c.get("function") or {}).get("name"),
            _args_key((c.get("function") or {}).get("arguments")),
        )
        for c in m.get("tool_calls") or ()
    )
    return (
        m.get("role"),
        _content_key(m.get("content")),
        calls,
        m.get("tool_call_id"),
        m.get("name"),
    )


def altered_messages(inp: Sequence[Message], out: Sequence[Message]) -> int:
    """Output messages that are not an unchanged input message, in input order.

    Greedy subsequence match: each output message must equal (by ``message_key``) an
    input message after the previous match. Rewritten, cut, merged or reordered
    messages fail the match and count once each."""
    keys = [message_key(m) for m in inp]
    pos = 0
    altered = 0
    for m in out:
        k = message_key(m)
        j = pos
        while j < len(keys) and keys[j] != k:
            j += 1
        if j == len(keys):
            altered += 1
        else:
            pos = j + 1
    return altered


def orphaned_tool_calls(out: Sequence[Message]) -> int:
    """Tool-call ids whose pair is broken in ``out``: an assistant call without its
    ``tool`` result after it, or a ``tool`` result without its call before it.
    Upstreams reject both (OpenAI returns 400; chat templates misrender them)."""
    open_calls: set[str] = set()
    orphans = 0
    for m in out:
        for c in m.get("tool_calls") or ():
            open_calls.add(str(c.get("id")))
        if m.get("role") == "tool":
            cid = str(m.get("tool_call_id"))
            if cid in open_calls:
                open_calls.discard(cid)
            else:
                orphans += 1
    return orphans + len(open_calls)


def head_size(messages: Sequence[Message]) -> int:
    n = 0
    while n < len(messages) and messages[n].get("role") in HEAD_ROLES:
        n += 1
    return n


def non_user_start(out: Sequence[Message]) -> bool:
    """After the leading system block, the history starts with something other than
    a user message (templates that enforce alternation raise on this)."""
    h = head_size(out)
    return h < len(out) and out[h].get("role") != "user"


def system_lost(inp: Sequence[Message], out: Sequence[Message]) -> bool:
    """A leading system message of the input whose text is not found whole in the
    output's system messages (dropped or cut; merging several into one is not a
    loss, it shows up as altered instead)."""
    out_texts = [str(_content_key(m.get("content"))) for m in out if m.get("role") in HEAD_ROLES]
    for m in inp[: head_size(inp)]:
        text = str(_content_key(m.get("content")))
        if not any(text in t for t in out_texts):
            return True
    return False


def last_user_lost(inp: Sequence[Message], out: Sequence[Message]) -> bool:
    """The message being answered is missing or changed."""
    last = next((m for m in reversed(inp) if m.get("role") == "user"), None)
    if last is None:
        return False
    key = message_key(last)
    return not any(message_key(m) == key for m in out)


@dataclass(frozen=True, slots=True)
class Check:
    """One trimmer output at one budget. ``refused`` means the trimmer declined
    (trimproxy's ``context_length_exceeded``): no output to check."""

    tokens: int
    over_budget: bool
    altered: int
    orphaned: int
    non_user_start: bool
    system_lost: bool
    last_user_lost: bool
    refused: bool = False
    passthrough: bool = False
    """The input came back unchanged although it is over the budget."""

    @property
    def violations(self) -> int:
        return sum(
            (
                self.over_budget,
                self.altered > 0,
                self.orphaned > 0,
                self.non_user_start,
                self.system_lost,
                self.last_user_lost,
            )
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


REFUSED = Check(0, False, 0, 0, False, False, False, refused=True)


def check(
    inp: Sequence[Message],
    out: Sequence[Message] | None,
    budget: int,
    prompt_tokens: Callable[[Sequence[Message]], int],
) -> Check:
    if out is None:
        return REFUSED
    tokens = prompt_tokens(out)
    return Check(
        tokens=tokens,
        over_budget=tokens > budget,
        altered=altered_messages(inp, out),
        orphaned=orphaned_tool_calls(out),
        non_user_start=non_user_start(out),
        system_lost=system_lost(inp, out),
        last_user_lost=last_user_lost(inp, out),
        passthrough=tokens > budget
        and [message_key(m) for m in out] == [message_key(m) for m in inp],
    )


@dataclass(frozen=True, slots=True)
class Reuse:
    """Prefix reuse over the forwarded prompts of one growing conversation."""

    reuse: float
    """Token-weighted: reused prefix tokens / forwarded tokens, over requests 2..n.
    The share of prefill an upstream prefix cache can skip."""
    mean_share: float
    """Unweighted mean of the per-request shares."""
    stable: float
    """Share of requests whose prompt begins with the whole previous prompt."""
    fill: float
    """Mean forwarded tokens / budget over the requests that needed trimming."""
    ceiling: float
    """The most this trimmer's prompts could reuse: everything but the messages new
    in each request, which no cache has seen. Even a trimmer that never cuts stays
    below 1."""
    shares: tuple[float, ...]


def common_prefix(a: Sequence[Message], b: Sequence[Message]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x is not y and message_key(x) != message_key(y):
            break
        n += 1
    return n


class _NotRun:
    """Marks a request the bench did not send through a slow trimmer (sampled pairs)."""

    def __repr__(self) -> str:
        return "NOT_RUN"


NOT_RUN = _NotRun()
Forwarded = Sequence[Message] | None | _NotRun


def prefix_reuse(
    requests: Sequence[Sequence[Message]],
    forwarded: Sequence[Forwarded],
    budget: int,
    message_tokens: Callable[[Message], int],
    prompt_tokens: Callable[[Sequence[Message]], int],
) -> Reuse:
    """``forwarded[k]`` is the trimmer's output for ``requests[k]``: None when it
    refused (nothing is forwarded and the upstream's cache keeps the previous
    prompt), ``NOT_RUN`` when the bench skipped it (a pair is measured only when
    both of its requests ran).

    Reuse counts message tokens only, not the reply priming: what a prefix cache
    holds is the rendered messages."""
    shares: list[float] = []
    reused_sum = total_sum = ceiling_sum = 0
    fills: list[float] = []
    stable = 0
    prev: Sequence[Message] | None = None
    prev_req: Sequence[Message] | None = None
    for req, out in zip(requests, forwarded, strict=True):
        if isinstance(out, _NotRun):
            prev = prev_req = None
            continue
        if out is None:
            continue
        if prompt_tokens(req) > budget:
            fills.append(prompt_tokens(out) / budget)
        sizes = [message_tokens(m) for m in out]
        total = sum(sizes)
        if prev is not None and prev_req is not None and total:
            n = common_prefix(prev, out)
            reused = sum(sizes[:n])
            shares.append(reused / total)
            reused_sum += reused
            total_sum += total
            stable += n == len(prev)
            # What is new in this request must be prefilled by any trimmer.
            req_sizes = [message_tokens(m) for m in req]
            new = sum(req_sizes[common_prefix(prev_req, req) :])
            ceiling_sum += max(0, total - new)
        prev, prev_req = out, req
    count = len(shares)
    return Reuse(
        reuse=reused_sum / total_sum if total_sum else 0.0,
        mean_share=sum(shares) / count if count else 0.0,
        stable=stable / count if count else 0.0,
        fill=sum(fills) / len(fills) if fills else 0.0,
        ceiling=ceiling_sum / total_sum if total_sum else 0.0,
        shares=tuple(shares),
    )


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile: with few samples it reports a value that was measured,
    not an interpolation between two."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def timing(wall: Sequence[float], cpu: Sequence[float]) -> dict[str, float]:
    """Wall and CPU medians and p90s in milliseconds. CPU time is the one to compare
    on a shared machine: other processes stretch wall time, not CPU time."""
    return {
        "median_ms": quantile(wall, 0.5) * 1000,
        "p90_ms": quantile(wall, 0.9) * 1000,
        "cpu_median_ms": quantile(cpu, 0.5) * 1000,
        "cpu_p90_ms": quantile(cpu, 0.9) * 1000,
        "n": len(wall),
    }
