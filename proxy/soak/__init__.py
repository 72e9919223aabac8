"""``trimproxy soak``: the operator's KV-memory check (docs/architecture.md §19).

Seeded multi-turn conversations run for a fixed time (or a fixed number of turns)
against the proxy and, with ``--compare``, against the engine itself, arm after arm,
while the engine's ``/metrics`` (and ``nvidia-smi`` where present) are sampled every
half second. The run leaves ``requests.jsonl``, ``samples.jsonl``, ``summary.json``,
``report.html`` and ``report.png`` behind.

Modules: ``options`` (the run's settings), ``text`` (the seeded user text),
``client`` (one streamed chat request), ``driver`` (the conversations of one arm),
``sampler`` (engine metrics and GPU memory), ``discovery`` (where the engine's
``/metrics`` is, what the engine reports about itself), ``summary`` (the numbers),
``report`` (the HTML page and PNG), ``progress`` (the terminal display), ``runner``
(arms, files) and ``cli`` (the command's flags).

rich and matplotlib are the optional extra ``trimproxy[soak]``; only ``progress`` and
``report`` import them, and only when the command runs.
"""
