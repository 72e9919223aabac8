"""Seeded conversation generators for the trimmer comparison.

Every conversation is built from a ``random.Random`` seeded with a string (Python's
string seeding is stable across runs and versions), so the same shape and seed give
byte-identical messages on every machine, and a result can be reproduced from the
command line alone. The text is synthetic but shaped like real traffic where it
matters for trimming: message sizes, the script mix (BPE vocabularies tokenize Latin
and CJK text very differently), tool-call structure (parallel calls, several rounds
per user turn, ``content: null`` on the calling message) and the odd huge message.

Shapes:

* ``chat``  - plain user/assistant turns in English, one system message.
* ``agent`` - agent loops: each user turn may run several tool rounds, a round may
  call 1-3 tools in parallel; about a third of the text is Chinese; two leading
  system messages (a system prompt and a tool guide, as agent frameworks send).
  The default size is near the earlier measurement's: 222 messages, ~56k tokens.
* ``long``  - short chat with a few very long messages (pasted documents, long code
  answers); the last user message is long too, so small budgets cannot fit it.
* ``cjk``   - chat in Chinese with some Japanese, few Latin words.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from typing import Any

Message = dict[str, Any]

SHAPES = ("chat", "agent", "long", "cjk")

_WORD_TEXT = (
    "the of and to in is that for it as with was on be by this are or from at which an "
    "not have has but all can they more one will would there their what so if about "
    "when up out into time only new some could these two may first then do any like "
    "other how our over such after most also made many before must through back years "
    "where much your way well down should because each just those people how too "
    "little state good very make world still own see men work long get here between "
    "both life being under never day same another know while last might us great old "
    "year off come since against go came right used take three request proxy token "
    "budget model cache server client latency memory prompt context window message "
    "history function result error retry stream upstream deploy config metric queue "
    "worker thread buffer socket handler schema index query table column commit build "
    "test release version branch merge review patch kernel driver device network"
)
_WORDS = _WORD_TEXT.split()

_HANZI = (
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动"
    "同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自"
    "二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日"
    "那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变"
    "条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总"
    "次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指"
    "几九区强放决西被干做必战先回则任取据处队南给色光门即保治北造百规热领七海口东导器"
    "压志世金增争济阶油思术极交受联什认六共权收证改清己美再采转更单风切打白教速花带安"
    "场身车例真务具万每目至达走积示议声报斗完类八离华名确才科张信马节话米整空元况今集"
    "温传土许步群广石记需段研界拉林律叫且究观越织装影算低持音众书布复容儿须际商非验连"
    "断深难近矿千周委素技备半办青省列习响约支般史感劳便团往酸历市克何除消构府称太准精"
)
_KANA = (
    "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをん"
)
# Full-width punctuation, as Chinese text uses it (tokenizers see other bytes).
_CJK_PUNCT = "\uff0c\uff0c\u3002\u3002\uff1b\uff1f\uff01"
_TOOLS = ("search_docs", "read_file", "run_sql", "http_get", "list_dir", "run_tests")


def english(rng: random.Random, words: int) -> str:
    """Sentences of plausible length with punctuation and the odd number, because
    digits and punctuation tokenize differently from words."""
    out: list[str] = []
    while len(out) < words:
        n = rng.randint(6, 18)
        sentence = [rng.choice(_WORDS) for _ in range(n)]
        if rng.random() < 0.2:
            sentence.insert(rng.randrange(n), str(rng.randint(2, 99999)))
        sentence[0] = sentence[0].capitalize()
        out.extend(sentence)
        out[-1] += rng.choice(".....?!")
    return " ".join(out[:words])


def chinese(rng: random.Random, chars: int, *, kana: float = 0.0) -> str:
    out: list[str] = []
    while len(out) < chars:
        n = rng.randint(8, 28)
        for _ in range(n):
            pool = _KANA if rng.random() < kana else _HANZI
            out.append(rng.choice(pool))
        if rng.random() < 0.15:
            out.append(rng.choice(_WORDS))  # the Latin word that CJK text always has
        out.append(rng.choice(_CJK_PUNCT))
    return "".join(out[:chars])


def code(rng: random.Random, lines: int) -> str:
    body = [f"def {rng.choice(_WORDS)}_{rng.choice(_WORDS)}(items, limit={rng.randint(1, 64)}):"]
    for i in range(lines - 1):
        a, b = rng.choice(_WORDS), rng.choice(_WORDS)
        body.append(f"    {a}_{i} = [x.{b} for x in items if x.{a} > {rng.randint(0, 999)}]")
    return "```python\n" + "\n".join(body) + "\n```"


def _mixed(rng: random.Random, tokens: int, zh_share: float) -> str:
    """About ``tokens`` tokens of text, Chinese with probability ``zh_share``.

    English runs about 1.3 words a token and Chinese about 1.2 characters a token
    in cl100k, which is close enough for sizing synthetic messages."""
    if rng.random() < zh_share:
        return chinese(rng, max(1, int(tokens / 1.2)))
    return english(rng, max(1, int(tokens * 0.75)))


def _user(rng: random.Random, tokens: int, zh: float = 0.0) -> Message:
    return {"role": "user", "content": _mixed(rng, tokens, zh)}


def _assistant(rng: random.Random, tokens: int, zh: float = 0.0) -> Message:
    text = _mixed(rng, tokens, zh)
    if rng.random() < 0.25:
        text += "\n\n" + code(rng, rng.randint(4, 14))
    return {"role": "assistant", "content": text}


def chat(seed: int = 0, turns: int = 100) -> list[Message]:
    rng = random.Random(f"chat:{seed}")
    messages: list[Message] = [
        {"role": "system", "content": "You are a careful assistant. " + english(rng, 60)}
    ]
    for t in range(turns):
        messages.append(_user(rng, rng.randint(15, 120)))
        if t < turns - 1:  # the conversation ends on the user message being answered
            messages.append(_assistant(rng, rng.randint(80, 450)))
    return messages


def _tool_args(rng: random.Random, name: str) -> str:
    if name == "run_sql":
        args: dict[str, Any] = {
            "sql": f"SELECT * FROM {rng.choice(_WORDS)} LIMIT {rng.randint(1, 50)}"
        }
    elif name in ("read_file", "list_dir"):
        args = {"path": "/".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 5))) + ".py"}
    elif name == "http_get":
        args = {"url": f"http://internal/{rng.choice(_WORDS)}?id={rng.randint(1, 9999)}"}
    else:
        args = {"query": english(rng, rng.randint(3, 12)), "top_k": rng.randint(1, 10)}
    if rng.random() < 0.3:
        args["note"] = chinese(rng, rng.randint(5, 20))
    return json.dumps(args, ensure_ascii=False)


def _tool_result(rng: random.Random, name: str, tokens: int, zh: float) -> str:
    if name == "read_file":
        return code(rng, max(2, tokens // 14))
    if name == "run_sql":
        rows = [
            {"id": rng.randint(1, 10**6), "name": rng.choice(_WORDS), "value": rng.random()}
            for _ in range(max(1, tokens // 22))
        ]
        return json.dumps(rows)
    return _mixed(rng, tokens, zh)


def agent(seed: int = 0, turns: int = 26, zh: float = 0.33) -> list[Message]:
    rng = random.Random(f"agent:{seed}")
    messages: list[Message] = [
        {"role": "system", "content": "You are a coding agent. " + english(rng, 120)},
        {"role": "system", "content": "Tool guide: " + english(rng, 90)},
    ]
    call = 0
    for t in range(turns):
        messages.append(_user(rng, rng.randint(20, 200), zh))
        if t == turns - 1:
            break
        for _ in range(rng.choice((0, 1, 2, 2, 3, 4, 5))):
            calls: list[dict[str, Any]] = []
            for _ in range(rng.choice((1, 1, 2, 3))):  # parallel calls now and then
                name = rng.choice(_TOOLS)
                call += 1
                calls.append(
                    {
                        "id": f"call_{call:05d}",
                        "type": "function",
                        "function": {"name": name, "arguments": _tool_args(rng, name)},
                    }
                )
            # content is null on most calling messages, as the OpenAI API returns them.
            preface = None if rng.random() < 0.7 else _mixed(rng, rng.randint(10, 40), zh)
            messages.append({"role": "assistant", "content": preface, "tool_calls": calls})
            for c in calls:
                name = c["function"]["name"]
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": c["id"],
                        "content": _tool_result(rng, name, rng.randint(60, 720), zh),
                    }
                )
        messages.append(_assistant(rng, rng.randint(60, 500), zh))
    return messages


def long(seed: int = 0, turns: int = 60) -> list[Message]:
    rng = random.Random(f"long:{seed}")
    messages: list[Message] = [
        {
            "role": "system",
            "content": "You answer questions about pasted documents. " + english(rng, 40),
        }
    ]
    for t in range(turns):
        last = t == turns - 1
        if last or rng.random() < 0.12:
            # A pasted document: the message that sliding windows cut in the middle.
            doc = english(rng, rng.randint(1500, 5000)) if not last else english(rng, 1300)
            messages.append({"role": "user", "content": "Summarise this:\n\n" + doc})
        else:
            messages.append(_user(rng, rng.randint(10, 80)))
        if last:
            break
        if rng.random() < 0.1:
            messages.append({"role": "assistant", "content": code(rng, rng.randint(60, 160))})
        else:
            messages.append(_assistant(rng, rng.randint(50, 300)))
    return messages


def cjk(seed: int = 0, turns: int = 100) -> list[Message]:
    rng = random.Random(f"cjk:{seed}")
    messages: list[Message] = [
        {"role": "system", "content": "你是一个认真的助手。" + chinese(rng, 80)}
    ]
    for t in range(turns):
        messages.append({"role": "user", "content": chinese(rng, rng.randint(10, 120), kana=0.1)})
        if t < turns - 1:
            messages.append(
                {"role": "assistant", "content": chinese(rng, rng.randint(60, 420), kana=0.1)}
            )
    return messages


GENERATORS: dict[str, Callable[..., list[Message]]] = {
    "chat": chat,
    "agent": agent,
    "long": long,
    "cjk": cjk,
}


def generate(shape: str, seed: int = 0, **size: int) -> list[Message]:
    try:
        return GENERATORS[shape](seed, **size)
    except KeyError:
        raise ValueError(f"unknown shape {shape!r}; choose from {', '.join(SHAPES)}") from None


def growing_requests(messages: Sequence[Message]) -> list[list[Message]]:
    """The requests a client sends while this conversation grows: one per user
    message, each carrying the whole history up to and including it (the same dict
    objects, as a client resending its history would produce equal ones)."""
    return [list(messages[: i + 1]) for i, m in enumerate(messages) if m.get("role") == "user"]
