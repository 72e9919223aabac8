"""``bench/responses_peer.py``: its ratios mean something only if both gateways answer
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
    code = responses_peer.main(["--requests", "10", "--rounds", "1", "-c", "2"])
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert set(rows) == set(responses_peer.WORKLOADS)
    for cells in rows.values():
        assert all(float(cell) > 0 for cell in cells), rows  # both arms spent CPU on it
