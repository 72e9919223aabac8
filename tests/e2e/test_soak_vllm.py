"""``trimproxy soak`` against the real vLLM engine (CPU build): 192 KV blocks of 32
tokens (6,144 tokens), ``--max-model-len 2048``, the session's one engine.

Eight conversations of ~300-token turns with 64-token answers. Straight at the engine
they outgrow the KV cache within three turns (queueing, preemption) and the context
window by the sixth (vLLM's 400): the direct arm fails or preempts. Through trimproxy
with a 600-token budget, eight prompts plus their answers need at most
8 x ceil(664 / 32) = 168 of the 192 blocks: no error, no preemption, KV under 0.9.
With ``TRIMPROXY_SESSION_MAX_TURNS=3`` the forwarded prompt falls back to its first
size every third turn (the sawtooth).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.conftest import VLLM_API_KEY, VLLM_MAX_MODEL_LEN, StartVllmProxy
from tests.soak.support import Soak, assert_sawtooth, soak
from tests.support.vllm_stack import VllmStack

pytestmark = pytest.mark.vllm

BUDGET = 600
CONVERSATIONS = 8
TURNS = 8


def vllm_soak(out: Path, stack: VllmStack, *args: str) -> Soak:
    run = soak(out, "--model", stack.model, "--api-key", VLLM_API_KEY, "--max-tokens", "64",
               "--turn-tokens", "200", *args)  # fmt: skip
    print(f"\n{run.output}")  # the soak's table, for the CI log
    return run


def test_direct_arm_fails_or_preempts_the_proxied_arm_does_not(
    vllm_idle: VllmStack, start_vllm_proxy: StartVllmProxy, tmp_path: Path
) -> None:
    proxy = start_vllm_proxy(max_prompt_tokens=BUDGET)
    run = vllm_soak(tmp_path / "arms", vllm_idle, "--target", proxy.url,
                    "--compare", vllm_idle.base_url, "--conversations", str(CONVERSATIONS),
                    "--turns", str(TURNS), "--max-kv-usage", "0.9")  # fmt: skip
    assert run.rc == 0, run.output
    summary = run.summary
    assert summary["engine"] == {
        "block_size": 32,
        "kv_capacity_tokens": 192 * 32,
        "max_model_len": VLLM_MAX_MODEL_LEN,
    }
    target, direct = summary["target"], summary["compare"]
    assert target["requests"] == direct["requests"] == CONVERSATIONS * TURNS
    assert target["errors"] == 0 and target["preemptions"] == 0
    assert target["prompt_tokens_max"] <= BUDGET
    assert target["kv_usage_peak"] <= 0.9
    assert direct["errors"] > 0 or direct["preemptions"] > 0
    assert direct["prompt_tokens_max"] > BUDGET
    assert direct["kv_usage_peak"] > target["kv_usage_peak"]
    # What the proxy says it forwarded is what vLLM counted, on every request.
    for row in run.requests("target"):
        assert row["forwarded_prompt_tokens"] == row["usage_prompt_tokens"], row
    for name in ("report.html", "report.png", "samples.jsonl"):
        assert (run.out / name).is_file()


def test_session_limit_saws_the_forwarded_prompt(
    vllm_idle: VllmStack, start_vllm_proxy: StartVllmProxy, tmp_path: Path
) -> None:
    proxy = start_vllm_proxy(session_max_turns=3)
    # No --compare: the engine's /metrics is found through the proxy's /readyz.
    run = vllm_soak(tmp_path / "saw", vllm_idle, "--target", proxy.url,
                    "--conversations", "4", "--turns", "7")  # fmt: skip
    assert run.rc == 0, run.output
    assert run.summary["target"]["preemptions"] == 0
    assert_sawtooth(run, conversations=4, turns=7, max_turns=3)
