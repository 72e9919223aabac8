"""The wire formats that carry a prompt, each as a pure module (no I/O, no HTTP).

A dialect parses its body into a ``Conversation`` (the trimmable items and the roles
trimming reads), converts kept items to the chat messages vLLM renders for them (for
counting), renders the kept items back into its own body, and reads usage from its
answers. ``responses`` (OpenAI Responses), ``messages`` (Anthropic Messages) and
``completions`` (raw prompts) are here; chat stays in ``proxy.chat``. What each
dialect's trim keeps: docs/dialects.md.
"""
