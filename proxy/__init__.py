"""trimproxy: an OpenAI-compatible proxy that keeps chat prompts inside a token budget."""

__version__ = "0.1.0"
