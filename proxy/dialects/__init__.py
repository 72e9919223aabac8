"""The wire formats that carry a prompt, each as a pure module (no I/O, no HTTP).

A dialect parses its body into a ``Conversation`` (the trimmable items and the roles
trimming reads), converts kept items to the chat messages vLLM renders for them (for
counting), and renders the kept items back into its own body. ``chat`` (chat
completions), ``responses`` (OpenAI Responses), ``messages`` (Anthropic Messages) and
``completions`` (raw prompts) are here; each is one row of the dialect table
(``proxy.pipeline.table``), which also names its usage reader and error envelope. What
each dialect's trim keeps: docs/dialects.md.
"""
