"""``bench/responses_peer.py``: its ratios mean something only if every arm answers
every request of each workload (the bench stops on anything but 200 and on a stream
without ``response.completed``) and the bodies have the shape the docs give."""

from __future__ import annotations

import json

import pytest

from bench import responses_peer


def test_the_stateless_body_is_ten_turns_of_about_four_kilobytes() -> None:
    body = json.loads(responses_peer.stateless_body())
    assert [item["role"] for item in body["input"]].count("user") == 10
    assert len(body["input"]) == 19
    assert 3_000 <= len(responses_peer.stateless_body()) <= 5_000
    assert body["store"] is False
    assert json.loads(responses_peer.stateless_body(stream=True))["stream"] is True


def test_both_gateways_serve_every_workload(capsys: pytest.CaptureFixture[str]) -> None:
    # This checkout as its own baseline: the base arm is started and measured too.
    root = str(responses_peer.ROOT)
    code = responses_peer.main(["--requests", "40", "--rounds", "1", "-c", "2", "--baseline", root])
    assert code == 0  # every request of every arm answered 200 (the bench stops otherwise)
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert set(rows) == set(responses_peer.WORKLOADS)
    # The floors relay, they store nothing: they have no chains cell, and the others do.
    for floor in (3, 5):
        assert [cells[floor] == "nan" for cells in rows.values()] == [False, False, True]
    assert "floor-uvicorn ms" in lines[1] and "trimproxy-base ms" in lines[1]
    assert all(len(cells) == 9 and cells[7] != "nan" for cells in rows.values()), rows
    # CPU time is read in clock ticks (10 ms), so one short cell may read 0; trimproxy's
    # 120 requests in all take several ticks.
    assert sum(float(cells[1]) for cells in rows.values()) > 0, rows
