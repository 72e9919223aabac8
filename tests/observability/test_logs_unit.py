"""Request ids, the JSON formatter, the access record, and the metrics registry's
rendering, in-process."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import orjson
import pytest
from starlette.requests import Request

from proxy.logs import (
    REQUEST_ID_HEADER,
    AccessLog,
    JsonFormatter,
    JsonLineHandler,
    RequestFacts,
    ensure_request_id,
    request_facts,
    session_hash,
)
from proxy.metrics import Metrics, clear_multiprocess_dir, route_label
from proxy.pipeline.table import Table, builtin_dialects


def test_valid_client_request_id_is_kept_without_touching_headers() -> None:
    headers = [(b"host", b"x"), (REQUEST_ID_HEADER, b"Abc.def_1-2")]
    assert ensure_request_id(headers) == ("Abc.def_1-2", None)
    assert ensure_request_id([(REQUEST_ID_HEADER, b"a" * 128)])[1] is None


@pytest.mark.parametrize(
    "values",
    [[], [b""], [b"a" * 129], [b"has space"], [b"semi;colon"], [b"\xc3\xa9"], [b"a", b"b"]],
    ids=["missing", "empty", "too-long", "space", "semicolon", "non-ascii", "repeated"],
)
def test_other_request_ids_are_replaced_by_one_generated(values: list[bytes]) -> None:
    headers = [(b"host", b"x"), *((REQUEST_ID_HEADER, v) for v in values)]
    rid, forwarded = ensure_request_id(headers)
    assert len(rid) == 32 and int(rid, 16) >= 0
    assert forwarded is not None
    assert [v for k, v in forwarded if k == REQUEST_ID_HEADER] == [rid.encode()]
    assert (b"host", b"x") in forwarded
    assert ensure_request_id(headers)[0] != rid  # fresh each time


def test_json_formatter_writes_one_object_with_fields_and_exceptions() -> None:
    record = logging.LogRecord("trimproxy.access", logging.INFO, __file__, 1, "request", None, None)
    record.fields = {"request_id": "r1", "status": 200, "quote": 'a "b"\nc'}
    line = JsonFormatter().format(record)
    assert "\n" not in line
    parsed = orjson.loads(line)
    assert parsed["logger"] == "trimproxy.access" and parsed["level"] == "info"
    assert parsed["msg"] == "request" and parsed["status"] == 200
    assert parsed["quote"] == 'a "b"\nc'
    assert parsed["ts"].endswith("Z")
    try:
        raise ValueError("boom")
    except ValueError:
        error = logging.LogRecord("x", logging.ERROR, __file__, 1, "%s!", ("bad",), sys.exc_info())
    parsed = orjson.loads(JsonFormatter().format(error))
    assert parsed["msg"] == "bad!" and "ValueError: boom" in parsed["exc"]


def test_facts_fields_omit_what_is_unknown_and_hash_the_session() -> None:
    facts = RequestFacts("r1")
    base = facts.fields("GET", "/v1/models", 200, 0.0123456)
    assert base == {
        "request_id": "r1",
        "method": "GET",
        "path": "/v1/models",
        "status": 200,
        "duration_ms": 12.346,
    }
    facts.session_id = "alice@example.com"
    facts.model = "m" * 1000
    out = facts.fields("POST", "/x" * 500, 200, 0.0)
    assert out["session"] == session_hash("alice@example.com") != "alice@example.com"
    assert len(out["session"]) == 16
    assert len(out["model"]) == 256 and len(out["path"]) == 256


def test_request_facts_without_middleware_is_detached() -> None:
    request = Request({"type": "http", "headers": [], "method": "GET", "path": "/"})
    facts = request_facts(request)
    facts.model = "m"  # harmless: nobody logs it
    assert request_facts(request) is not facts


def test_render_leaves_out_created_series() -> None:
    metrics = Metrics()
    metrics.requests.labels("/v1/models", "200").inc()
    metrics.for_model("other", "chat", "/v1/chat/completions").prompt_received.observe(100)
    metrics.for_model("other", "chat", "/v1/chat/completions").estimate_error.observe(-3)
    text = metrics.render().decode()
    assert "_created" not in text
    assert 'trimproxy_requests_total{code="200",route="/v1/models"} 1.0' in text
    assert (
        'trimproxy_prompt_tokens_count{endpoint="chat",model="other",stage="received"} 1.0' in text
    )
    # Another registry in the same process keeps its _created series: no global switch.
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    other = CollectorRegistry()
    Counter("other_events", "x", registry=other).inc()
    assert b"other_events_created" in generate_latest(other)


def test_route_label_is_bounded() -> None:
    known = Table(builtin_dialects()).route_labels
    assert route_label("/v1/chat/completions", known) == "/v1/chat/completions"
    assert route_label("/v1/chat/completions/x", known) == "other"
    assert route_label("/etc/passwd", known) == "other"
    assert route_label("/v1/chat/completions") == "other"  # not one of the proxy's own


def test_clear_multiprocess_dir_removes_only_metric_files(tmp_path: Path) -> None:
    (tmp_path / "counter_1.db").write_bytes(b"x")
    (tmp_path / "gauge_livesum_2.db").write_bytes(b"x")
    (tmp_path / "notes.txt").write_text("keep")
    clear_multiprocess_dir(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]
    clear_multiprocess_dir(str(tmp_path / "new"))
    assert (tmp_path / "new").is_dir()


def test_the_access_line_is_the_same_written_straight_or_through_logging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``AccessLog`` skips logging's record and handler chain only where logging is as
    ``setup_logging`` leaves it, and writes the very line logging would have."""
    path = tmp_path / "access.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        root = logging.getLogger()
        monkeypatch.setattr(root, "handlers", [JsonLineHandler(fd)])  # pytest's own go
        monkeypatch.setattr(root, "level", logging.INFO)
        access = AccessLog()
        fields = {"request_id": "r1", "status": 200, "duration_ms": 1.5, "model": "m"}
        assert access._plain_handler(logging.INFO) is not None
        access.write(logging.INFO, fields)  # straight to the descriptor
        seen: list[logging.LogRecord] = []

        def listen(record: logging.LogRecord) -> bool:
            seen.append(record)
            return True

        monkeypatch.setattr(access.logger, "filters", [listen])  # someone listens
        assert access._plain_handler(logging.INFO) is None
        access.write(logging.INFO, fields)  # now through logging
        assert len(seen) == 1 and seen[0].fields == fields  # type: ignore[attr-defined]
    finally:
        os.close(fd)
    straight, logged = (orjson.loads(line) for line in path.read_bytes().splitlines())
    assert straight.pop("ts")[:19] == logged.pop("ts")[:19]  # to the second
    assert straight == logged == {"level": "info", "logger": "trimproxy.access",
                                  "msg": "request", **fields}  # fmt: skip


def test_an_operators_own_handler_gets_the_access_line_through_logging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = logging.getLogger()
    ours, theirs = JsonLineHandler(sys.stderr.fileno()), logging.NullHandler()
    monkeypatch.setattr(root, "handlers", [ours, theirs])
    assert AccessLog()._plain_handler(logging.INFO) is None
    monkeypatch.setattr(root, "handlers", [ours])
    ours.setLevel(logging.WARNING)  # the handler itself would drop an info line
    assert AccessLog()._plain_handler(logging.INFO) is None
