"""``trimproxy plan``: KV memory arithmetic from a model's config and the cards it runs on.

config (config.json) → kv (bytes per token) → gpu (per-card split) → weights →
capacity (pool, blocks, tokens) → advice (budget, flags, fallbacks); worker models a
transformers worker's prefill peak; engine reads a live vLLM's figures; report and cli
present them. See docs/plan.md for the formulas and what is exact.
"""
