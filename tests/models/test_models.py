"""Several models behind one proxy (``TRIMPROXY_MODELS_FILE``, ``proxy.models``).

Two real upstreams (sims on 127.0.0.1) whose tokenizers differ: ``alpha`` counts 4
bytes a token, ``beta`` 2, so a prompt counted with the wrong model's counter, or
sent to the wrong upstream, shows in the numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.models import ModelsFileError, load_models
from proxy.sim import tokenizer as tok
from tests.observability.promtext import parse
from tests.support.inprocess import StartApp, make_settings
from tests.support.sim import SimUpstream

CHAT = "/v1/chat/completions"
StartSim = Callable[..., SimUpstream]


def messages(turns: int, size: int = 40) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for k in range(turns):
        out.append({"role": "user", "content": f"question {k} " + "x" * size})
        out.append({"role": "assistant", "content": f"answer {k} " + "y" * size})
    out.append({"role": "user", "content": "and now?"})
    return out


def count(msgs: list[dict[str, Any]], bytes_per_token: int) -> int:
    return tok.prompt_tokens(msgs, add_generation_prompt=True, bytes_per_token=bytes_per_token)


@pytest.fixture
def two_sims(sim_upstream_factory: StartSim) -> tuple[SimUpstream, SimUpstream]:
    alpha = sim_upstream_factory(model="alpha", strict_model=True, max_model_len=8192)
    beta = sim_upstream_factory(
        model="beta", strict_model=True, bytes_per_token=2, max_model_len=8192
    )
    return alpha, beta


def models_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "models.toml"
    path.write_text(text)
    return str(path)


async def test_each_model_is_counted_trimmed_and_served_by_its_own_upstream(
    app_proxy: StartApp, two_sims: tuple[SimUpstream, SimUpstream], tmp_path: Path
) -> None:
    alpha, beta = two_sims
    path = models_file(
        tmp_path,
        f"""
[models."beta"]
upstream_url = "{beta.url}/v1"
tokenizer = "upstream"
max_prompt_tokens = 200
""",
    )
    proxy = await app_proxy(upstream=alpha, tokenizer="upstream", models_file=path)
    msgs = messages(4)
    assert count(msgs, 4) != count(msgs, 2)

    a = await proxy.client.post(CHAT, json={"model": "alpha", "messages": msgs})
    assert a.status_code == 200, a.text
    assert int(a.headers["x-trimproxy-prompt-tokens"]) == count(msgs, 4)
    assert a.json()["usage"]["prompt_tokens"] == count(msgs, 4)
    assert a.headers["x-trimproxy-trimmed-messages"] == "0"

    b = await proxy.client.post(CHAT, json={"model": "beta", "messages": msgs})
    assert b.status_code == 200, b.text
    forwarded = int(b.headers["x-trimproxy-prompt-tokens"])
    # beta's own budget (200) trims, and its own counter agrees with its upstream.
    assert count(msgs, 2) > 200 >= forwarded > 0
    assert int(b.headers["x-trimproxy-trimmed-messages"]) > 0
    assert b.json()["usage"]["prompt_tokens"] == forwarded
    sent = beta.chat_requests()[-1]["json"]["messages"]
    assert count(sent, 2) == forwarded

    assert [r["json"]["model"] for r in alpha.chat_requests()] == ["alpha"]
    assert [r["json"]["model"] for r in beta.chat_requests()] == ["beta"]
    assert beta.requests("/tokenize") and all(
        r["json"]["model"] == "beta" for r in beta.requests("/tokenize")
    )

    # A model the file does not name goes to the top level (the sim refuses it: 404).
    other = await proxy.client.post(CHAT, json={"model": "gamma", "messages": msgs})
    assert other.status_code == 404
    assert alpha.chat_requests()[-1]["json"]["model"] == "gamma"

    scrape = parse(await proxy.client.get("/metrics"))
    received = "trimproxy_prompt_tokens_count"
    assert scrape.value(received, stage="received", model="alpha") == 1
    assert scrape.value(received, stage="received", model="beta") == 1
    assert scrape.value(received, stage="received", model="other") == 1
    assert scrape.value("trimproxy_trim_events_total", reason="budget", model="beta") == 1
    assert scrape.value("trimproxy_trimmed_messages_total", model="alpha") == 0
    assert scrape.value("trimproxy_token_estimate_error_tokens_count", model="beta") == 1
    error = "trimproxy_token_estimate_error_tokens_bucket"
    assert scrape.value(error, model="beta", le="-0.5") == 0  # exact: in (-0.5, 0]
    assert scrape.value(error, model="beta", le="0.0") == 1


async def test_models_is_the_union_of_the_upstreams_lists(
    app_proxy: StartApp, two_sims: tuple[SimUpstream, SimUpstream], tmp_path: Path
) -> None:
    alpha, beta = two_sims
    path = models_file(
        tmp_path,
        f'[models."beta"]\nupstream_url = "{beta.url}"\n[models."alpha"]\ncontext_window = 1000\n',
    )
    proxy = await app_proxy(upstream=alpha, tokenizer="approx", models_file=path)
    listed = await proxy.client.get("/v1/models")
    assert listed.status_code == 200
    body = listed.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["alpha", "beta"]
    assert {m["max_model_len"] for m in body["data"]} == {8192}

    # Other passthrough routes go to the model's upstream too.
    done = await proxy.client.post("/v1/completions", json={"model": "beta", "prompt": "hi"})
    assert done.status_code == 200, done.text
    assert beta.requests("/v1/completions")[-1]["json"]["model"] == "beta"

    # One upstream down: the other's list still comes.
    beta.stop()
    listed = await proxy.client.get("/v1/models")
    assert listed.status_code == 200
    assert [m["id"] for m in listed.json()["data"]] == ["alpha"]
    # ... and the one that failed is counted, as every failure of a forwarded request.
    scrape = parse(await proxy.client.get("/metrics"))
    assert scrape.value("trimproxy_upstream_errors_total", kind="connect") == 1


async def test_without_a_file_models_passes_through(app_proxy: StartApp) -> None:
    proxy = await app_proxy(tokenizer="approx")
    listed = await proxy.client.get("/v1/models")
    assert listed.status_code == 200
    assert [m["id"] for m in listed.json()["data"]] == ["sim-model"]


async def test_an_upstream_shared_by_two_models_is_one_client(
    app_proxy: StartApp, sim_upstream: SimUpstream, tmp_path: Path
) -> None:
    path = models_file(
        tmp_path,
        f'[models."a"]\nupstream_url = "{sim_upstream.url}"\nmax_prompt_tokens = 50\n'
        '[models."b"]\ntokenizer = "approx"\n',
    )
    proxy = await app_proxy(upstream=sim_upstream, tokenizer="approx", models_file=path)
    svc = proxy.app.state.services
    assert svc.for_model("a").upstream is svc.upstream is svc.for_model("b").upstream
    assert svc.for_model("a").counter is svc.counter is svc.for_model("b").counter
    assert svc.for_model("a").settings.max_prompt_tokens == 50
    assert svc.for_model("b").settings.max_prompt_tokens is None
    assert svc.for_model("zzz") is svc
    assert svc.upstreams == ()  # one upstream: /v1/models passes through


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[models."m"\ntokenizer = "approx"\n', "not valid TOML"),
        ('[models."m"]\ntokenizr = "approx"\n', "[models.\"m\"]: unknown key 'tokenizr'"),
        ('[models."m"]\nmax_prompt_tokens = 0\n', '[models."m"]: max_prompt_tokens: Input should'),
        ('[models."m"]\nupstream_url = "ftp://x"\n', '[models."m"]: upstream_url: Value error'),
        ('[models."m"]\ntokenizer = "hf"\n', '[models."m"]: tokenizer: Value error'),
        ('[models."m"]\ncontext_window = "big"\n', '[models."m"]: context_window: Input should'),
        ('[model."m"]\ntokenizer = "approx"\n', "unknown top-level key 'model'"),
        ("", 'no [models."NAME"] table'),
        ("[models]\nm = 3\n", '[models."m"] must be a table'),
    ],
)
def test_a_bad_file_is_one_line_naming_file_table_and_key(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = models_file(tmp_path, text)
    with pytest.raises(ModelsFileError) as caught:
        load_models(make_settings("http://127.0.0.1:9", models_file=path))
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"TRIMPROXY_MODELS_FILE={path}: ")
    assert expected in message


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    path = str(tmp_path / "nope.toml")
    with pytest.raises(ModelsFileError, match="cannot read it"):
        load_models(make_settings("http://127.0.0.1:9", models_file=path))


def test_a_table_falls_back_to_the_top_level_settings(tmp_path: Path) -> None:
    path = models_file(tmp_path, '[models."m"]\nupstream_url = "http://10.0.0.5:8000/v1/"\n')
    settings = make_settings(
        "http://127.0.0.1:9", models_file=path, max_prompt_tokens=77, tokenizer="approx"
    )
    (model,) = load_models(settings)
    assert model.name == "m"
    assert model.settings.upstream_url == "http://10.0.0.5:8000"  # the same validator
    assert model.settings.max_prompt_tokens == 77
    assert model.settings.tokenizer == "approx"
