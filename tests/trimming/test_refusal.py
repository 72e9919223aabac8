"""The refusal's figure: the least a request needs, pins left out.

``trim`` owns "too long": it refuses exactly when the system block plus the last
turn are over the budget, and says how many tokens they are. A pinned first turn is
a preference, so it is never part of that figure.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given

from proxy.errors import ContextLengthExceeded
from proxy.trimming import TrimPolicy, least_kept, trim
from proxy.types import Message, PromptCount, PromptLimit
from tests.trimming.strategies import PROPS, cases, must_keep

#: system 10; first turn 55 (user 30, assistant 25); a middle turn 20; last turn 100;
#: overhead 3. The least: 10 + 100 + 3 = 113; with the pin it would be 168.
PINNED_EXAMPLE: list[Message] = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": "first"},
    {"role": "assistant", "content": "a0"},
    {"role": "user", "content": "middle"},
    {"role": "assistant", "content": "a1"},
    {"role": "user", "content": "last"},
]
PINNED_COUNT = PromptCount((10, 30, 25, 10, 10, 100), 3)


def refusal(messages: list[Message], count: PromptCount, policy: TrimPolicy) -> int | None:
    """The figure ``trim`` refuses with, or None when it does not refuse."""
    try:
        trim(messages, count, policy)
    except ContextLengthExceeded as exc:
        assert exc.needed is not None
        return exc.needed
    return None


def test_a_pin_is_not_counted_in_the_refusal() -> None:
    policy = TrimPolicy(budget=90, pin_first_user=True)
    with pytest.raises(ContextLengthExceeded) as info:
        trim(PINNED_EXAMPLE, PINNED_COUNT, policy)
    assert info.value.needed == 113
    assert "resulted in 113 tokens" in info.value.message
    assert "168" not in info.value.message
    # At that figure the request fits, and the pin is what gives way.
    result = trim(PINNED_EXAMPLE, PINNED_COUNT, TrimPolicy(budget=113, pin_first_user=True))
    assert result.kept == (0, 5) and result.tokens == 113


def test_the_refusal_names_the_limit_it_is_given() -> None:
    limit = PromptLimit(90, window=200, reserve=109, reserve_asked=True)
    policy = TrimPolicy(budget=90, pin_first_user=True, limit=limit)
    with pytest.raises(ContextLengthExceeded) as info:
        trim(PINNED_EXAMPLE, PINNED_COUNT, policy)
    message = info.value.message
    assert message.startswith("This model's maximum context length is 200 tokens.")
    assert "resulted in 113 tokens" in message
    assert "109 tokens of max_tokens leave 90 for the prompt" in message


def test_least_kept_is_the_head_and_the_last_turn() -> None:
    assert least_kept(PINNED_EXAMPLE) == (0, 5)
    tools: list[Message] = [
        {"role": "developer", "content": "d"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "tool", "content": "r"},
    ]
    assert least_kept(tools) == (0, 1, 2, 3)
    assert least_kept([{"role": "system", "content": "s"}]) == (0,)


@PROPS
@given(cases())
def test_the_figure_is_the_least_budget_that_fits(
    case: tuple[list[Message], PromptCount, TrimPolicy],
) -> None:
    messages, count, policy = case
    needed = refusal(messages, count, policy)
    if needed is None:
        return
    assert policy.budget is not None and needed > policy.budget
    # The figure is the head and the last turn, whatever the pin and the turn limit...
    assert needed == count.overhead + sum(count.per_message[i] for i in must_keep(messages))
    # ...and exactly the least budget under which the same policy does not refuse.
    assert refusal(messages, count, replace(policy, budget=needed)) is None
    assert refusal(messages, count, replace(policy, budget=needed - 1)) == needed
    fits = trim(messages, count, TrimPolicy(budget=needed, pin_first_user=policy.pin_first_user))
    assert fits.tokens == needed
    assert set(fits.kept) == must_keep(messages) == set(least_kept(messages))
