"""The ladder's one pass over the roles (``proxy.ladder.survey``): its turns, request ends
and tool items are the definitions it stands for, read one at a time (docs/architecture.md
§6, the replay over requests)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.dialects.tool_outputs import CHAT
from proxy.errors import ContextLengthExceeded
from proxy.ladder import climb, request_ends, survey
from proxy.trimming import split_turns
from proxy.types import Message
from tests.trimming.strategies import PROPS
from tests.trimming.test_ladder import Case, agent_cases

ROLES = st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", None])


@st.composite
def role_runs(draw: st.DrawFn) -> list[Message]:
    """Items of any roles in any order, some with none."""
    roles = draw(st.lists(ROLES, max_size=30))
    return [{} if role is None else {"role": role} for role in roles]


def _ends(messages: list[Message], head: int) -> list[int]:
    """After every user item (a turn's opening, trim's step), and, from the first tool
    output on, before every assistant item that follows a non-assistant one; after the
    head."""
    names = [m.get("role") for m in messages]
    first_tool = names.index("tool") if "tool" in names else len(names)
    openings = {i + 1 for i in range(head, len(names) - 1) if names[i] == "user"}
    rounds = {
        i
        for i in range(max(head + 1, first_tool + 1), len(names))
        if names[i] == "assistant" and names[i - 1] != "assistant"
    }
    return [*sorted(openings | rounds), len(names)]


@PROPS
@given(role_runs())
def test_the_survey_reads_what_each_definition_reads(messages: list[Message]) -> None:
    surveyed = survey(messages)
    turns = split_turns(messages)
    assert surveyed.turns == turns
    assert surveyed.ends == _ends(messages, turns.head) == request_ends(messages, turns.head)
    assert surveyed.tools == [i for i, m in enumerate(messages) if m.get("role") == "tool"]


@PROPS
@given(agent_cases())
def test_a_climb_given_the_survey_is_the_climb_that_surveys(case: Case) -> None:
    messages, count, cleared, policy, keep = case
    outputs = CHAT.find(messages)
    assert outputs == survey(messages).tools
    try:
        alone = climb(messages, count, outputs, cleared, policy, keep=keep)
    except ContextLengthExceeded:
        return
    given_it = climb(messages, count, outputs, cleared, policy, keep=keep,
                     surveyed=survey(messages))  # fmt: skip
    assert given_it == alone
