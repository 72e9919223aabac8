"""``bench/dialects.py``: the CPU of each dialect beside chat means something only if
the three bodies are one conversation and each is served whole. Run end to end on a
small scale: every request answered 200 (the bench stops otherwise), and the proxy
counted the same prompt in the three dialects, so the same chat messages were
rendered from each."""

from __future__ import annotations

import pytest

from bench import dialects


def test_the_three_bodies_are_one_conversation_served_whole(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = dialects.main(
        ["--turns", "3", "--tools", "4", "--system-bytes", "800", "--requests", "2",
         "--rounds", "1", "--warmup", "1", "-c", "2"]
    )  # fmt: skip
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == {"chat", "responses", "messages"}
    counts = {row[2] for row in rows.values()}
    assert len(counts) == 1, rows  # one count, the same in every dialect
    assert int(counts.pop()) > 500  # the tools and the history were counted, not dropped


def test_an_agent_body_has_the_shape_of_a_coding_agent() -> None:
    sent = dialects.bodies(dialects.agent())
    for body in sent.values():
        assert 40_000 <= len(body) <= 80_000
    chat = dialects.chat_body(dialects.agent())
    assert len(chat["tools"]) == 24
    assert sum(m["role"] == "user" for m in chat["messages"]) == 31  # 30 turns, then a question
