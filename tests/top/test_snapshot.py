"""The parts of ``trimproxy top`` that need no server: reading /metrics text, windows."""

from __future__ import annotations

import io
import re

from proxy.top.cli import watch
from proxy.top.render import lines
from proxy.top.snapshot import NO_ENDPOINT, UPSTREAM, read, window

TWO_ENGINES = """\
# TYPE trimproxy_engine_up gauge
trimproxy_engine_up{engine="127.0.0.2:8000"} 1.0
trimproxy_engine_up{engine="127.0.0.3:8000"} 0.0
# TYPE trimproxy_engine_kv_cache_usage_ratio gauge
trimproxy_engine_kv_cache_usage_ratio{engine="127.0.0.2:8000"} 0.25
# TYPE trimproxy_engine_kv_reserved_tokens gauge
trimproxy_engine_kv_reserved_tokens{engine="127.0.0.2:8000"} 1200.0
# TYPE trimproxy_engine_kv_capacity_tokens gauge
trimproxy_engine_kv_capacity_tokens{engine="127.0.0.2:8000"} 6144.0
# TYPE trimproxy_engine_prefix_cache_hit_ratio gauge
trimproxy_engine_prefix_cache_hit_ratio{engine="127.0.0.2:8000"} 0.618
# TYPE trimproxy_engine_preemptions gauge
trimproxy_engine_preemptions{engine="127.0.0.2:8000"} 3.0
# TYPE trimproxy_engine_requests counter
trimproxy_engine_requests_total{engine="127.0.0.2:8000"} 40.0
trimproxy_engine_requests_total{engine="127.0.0.3:8000"} 2.0
# TYPE trimproxy_requests counter
trimproxy_requests_total{code="200",route="/v1/chat/completions"} 40.0
trimproxy_requests_total{code="502",route="/v1/chat/completions"} 2.0
trimproxy_requests_total{code="200",route="/healthz"} 5.0
# TYPE trimproxy_trim_events counter
trimproxy_trim_events_total{endpoint="chat",model="m",reason="budget"} 7.0
# TYPE trimproxy_session_limit counter
trimproxy_session_limit_total{action="reset",endpoint="chat",reason="turns"} 3.0
trimproxy_session_limit_total{action="reject",endpoint="chat",reason="age"} 4.0
# TYPE trimproxy_admission_rejected counter
trimproxy_admission_rejected_total{endpoint="chat",reason="timeout"} 0.0
trimproxy_admission_rejected_total{endpoint="completions",reason="timeout"} 0.0
trimproxy_admission_rejected_total{endpoint="messages",reason="timeout"} 5.0
# TYPE trimproxy_prompt_tokens histogram
trimproxy_prompt_tokens_bucket{endpoint="chat",le="100.0",model="m",stage="received"} 2.0
trimproxy_prompt_tokens_bucket{endpoint="chat",le="1000.0",model="m",stage="received"} 10.0
trimproxy_prompt_tokens_bucket{endpoint="chat",le="+Inf",model="m",stage="received"} 10.0
trimproxy_prompt_tokens_count{endpoint="chat",model="m",stage="received"} 10.0
trimproxy_prompt_tokens_sum{endpoint="chat",model="m",stage="received"} 5000.0
trimproxy_prompt_tokens_bucket{endpoint="responses",le="100.0",model="m",stage="received"} 0.0
trimproxy_prompt_tokens_bucket{endpoint="responses",le="1000.0",model="m",stage="received"} 3.0
trimproxy_prompt_tokens_bucket{endpoint="responses",le="+Inf",model="m",stage="received"} 3.0
trimproxy_prompt_tokens_count{endpoint="responses",model="m",stage="received"} 3.0
trimproxy_prompt_tokens_sum{endpoint="responses",model="m",stage="received"} 1500.0
"""


def test_engine_labelled_series_give_one_row_each() -> None:
    snap = read(TWO_ENGINES, 10.0)
    assert sorted(snap.engines) == ["127.0.0.2:8000", "127.0.0.3:8000"]
    first = snap.engines["127.0.0.2:8000"]
    assert (first.up, first.kv_usage, first.reserved, first.capacity) == (1.0, 0.25, 1200, 6144)
    assert (first.hit_ratio, first.requests, first.preemptions) == (0.618, 40.0, 3.0)
    assert snap.engines["127.0.0.3:8000"].up == 0.0
    assert snap.requests_by_code == {"200": 40.0, "502": 2.0}  # /healthz's probes left out
    assert (snap.trims, snap.session_resets) == (7.0, 3.0)
    assert snap.prompt["received"].count == 13.0  # all endpoints
    assert sorted(snap.endpoints) == ["chat", "completions", "messages", "responses"]
    chat, responses = snap.endpoints["chat"], snap.endpoints["responses"]
    assert (chat.prompt["received"].count, responses.prompt["received"].count) == (10.0, 3.0)
    assert (chat.trims, chat.session_resets, chat.admission_rejected) == (7.0, 3.0, 0.0)
    assert snap.endpoints["messages"].admission_rejected == 5.0


def test_each_endpoint_with_traffic_gets_a_row() -> None:
    screen = lines(window(None, read(TWO_ENGINES, 10.0)), "http://proxy")
    head = next(i for i, line in enumerate(screen) if line.startswith("endpoint "))
    rows = {line.split()[0]: line.split() for line in screen[head + 1 :]}
    # In the label's order; completions had only a zero series: no row.
    assert list(rows) == ["chat", "responses", "messages"], screen
    assert rows["chat"] == ["chat", "10", "<=1000", "<=1000", "-", "-", "7", "3", "0"]
    assert rows["responses"][:4] == ["responses", "3", "<=1000", "<=1000"]
    assert rows["messages"][-1] == "5"


def test_series_without_an_endpoint_label_still_read() -> None:
    text = (
        "# TYPE trimproxy_trim_events counter\n"
        'trimproxy_trim_events_total{model="m",reason="budget"} 2.0\n'
    )
    snap = read(text, 0.0)
    assert snap.trims == 2.0 and snap.endpoints[NO_ENDPOINT].trims == 2.0


def test_a_single_upstream_is_one_row_from_the_unlabelled_series() -> None:
    text = (
        "# TYPE trimproxy_upstream_kv_cache_usage_ratio gauge\n"
        "trimproxy_upstream_kv_cache_usage_ratio 0.5\n"
        "# TYPE trimproxy_upstream_requests_running gauge\n"
        "trimproxy_upstream_requests_running 3.0\n"
    )
    snap = read(text, 0.0)
    assert list(snap.engines) == [UPSTREAM]
    assert (snap.engines[UPSTREAM].kv_usage, snap.engines[UPSTREAM].running) == (0.5, 3.0)


def test_a_window_takes_rates_and_the_recent_prompt_lengths() -> None:
    before = read(TWO_ENGINES, 10.0)
    later = (
        TWO_ENGINES.replace(
            'trimproxy_requests_total{code="200",route="/v1/chat/completions"} 40.0',
            'trimproxy_requests_total{code="200",route="/v1/chat/completions"} 60.0',
        )
        .replace(
            'le="+Inf",model="m",stage="received"} 10.0',
            'le="+Inf",model="m",stage="received"} 14.0',
        )
        .replace(
            '"chat",model="m",stage="received"} 10.0', '"chat",model="m",stage="received"} 14.0'
        )
    )
    view = window(before, read(later, 12.0))
    assert view.seconds == 2.0
    assert view.requests["200"] == 10.0  # 20 more in 2 s
    recent = view.prompt["received"]
    assert recent.count == 4.0  # the four counted in the window, all above 1,000
    assert recent.quantile(0.5) == float("inf") and recent.top() == float("inf")
    screen = "\n".join(lines(view, "http://proxy"))
    assert re.search(r"^127\.0\.0\.2:8000 +yes +25\.0%", screen, re.MULTILINE)
    assert re.search(r"^127\.0\.0\.3:8000 +NO", screen, re.MULTILINE)
    assert "1200/6144" in screen and "0.618" in screen
    assert "requests 10/s" in screen
    assert re.search(r"^chat +2 +<=inf +<=inf", screen, re.MULTILINE)  # 4 prompts in 2 s


def test_watch_says_when_the_proxy_does_not_answer() -> None:
    out = io.StringIO()

    def refused(url: str) -> str:
        raise ConnectionRefusedError(111, "Connection refused")

    assert watch("http://127.0.0.1:9", 1.0, 1, out, get=refused, sleep=lambda s: None) == 1
    assert "no answer" in out.getvalue()
