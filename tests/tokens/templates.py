# ruff: noqa: E501  (templates are data: one jinja statement a line reads best)
"""Chat templates written for these tests, each with a behaviour that breaks naive
per-message counting. They use the tiny tokenizer's ChatML tokens."""

from __future__ import annotations

# Default system prompt when none is given; tools listed in the system block;
# tool calls rendered with their arguments as JSON; consecutive tool results grouped
# in one turn (looks at neighbours by index and loop.last).
TOOLS_DEFAULT_SYSTEM = r"""
{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}
{{- '\n\n# Tools\n<tools>' }}
{%- for tool in tools %}{{- '\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\n</tools><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\n' + message.content }}{%- endif %}
{%- for call in message.tool_calls | default([]) %}
{{- '\n<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' + (call.function.arguments | tojson) + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

# Reasoning is kept only for assistant turns after the last user message; older
# turns lose their <think> block. Finds the last user turn with a reverse pre-scan.
THINK_STRIP = r"""
{%- set ns = namespace(last_user=-1) %}
{%- for message in messages[::-1] %}
{%- if message.role == 'user' and ns.last_user == -1 %}{%- set ns.last_user = messages|length - 1 - loop.index0 %}{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- set content = message.content %}
{%- if message.role == 'assistant' %}
{%- set reasoning = message.reasoning_content | default('') %}
{%- if '</think>' in content %}
{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\n') %}
{%- set content = content.split('</think>')[-1].lstrip('\n') %}
{%- endif %}
{%- if loop.index0 > ns.last_user and reasoning %}
{{- '<|im_start|>assistant\n<think>\n' + reasoning + '\n</think>\n\n' + content + '<|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>assistant\n' + content + '<|im_end|>\n' }}
{%- endif %}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

# A BOS, the system message sliced off the list and rendered first (or a default),
# contents trimmed, tools ignored entirely.
SLICED_SYSTEM = r"""
{{- '<|endoftext|>' }}
{%- if messages[0].role == 'system' %}
{%- set system = messages[0].content | trim %}
{%- set messages = messages[1:] %}
{%- else %}
{%- set system = 'Knowledge cutoff: never.' %}
{%- endif %}
{{- '<|im_start|>system\n' + system + '<|im_end|>' }}
{%- for message in messages %}
{{- '<|im_start|>' + message.role + '\n' + message.content | trim + '<|im_end|>' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

# Loops over content parts: vLLM then passes content as a list of typed parts.
CONTENT_PARTS = r"""
{%- for message in messages %}
{{- '<|im_start|>' + message.role + '\n' }}
{%- if message.content is string %}{{- message.content }}
{%- else %}
{%- for part in message.content %}
{%- if part.type == 'text' %}{{- part.text }}{%- else %}{{- '<image>' }}{%- endif %}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

TEMPLATES = {
    "tools_default_system": TOOLS_DEFAULT_SYSTEM,
    "think_strip": THINK_STRIP,
    "sliced_system": SLICED_SYSTEM,
    "content_parts": CONTENT_PARTS,
}

# Templates that each fail one of the hf counter's named start-up checks
# (proxy/tokens/hf/self_check.py), as a real template could.

# Refuses every conversation: a tokenizer whose chat template is not for chat.
REFUSES_ALL = r"""{{- raise_exception('this template renders no chat') }}"""

# Renders the messages last to first: tracking sees each message where its loop
# reads it, and no text lies in its own stretch (messages-in-place).
REVERSED = r"""
{%- for message in messages | reverse %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

# Repeats the first message before the conversation: found by its header, the first
# message is the copy, tracking puts it in the loop (placement).
REPEATS_FIRST = r"""
{{- '<|im_start|>' + messages[0].role + '\n' + messages[0].content + '<|im_end|>\n' }}
{%- for message in messages %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

# Writes an assistant's tool calls before its header: a tool-call turn placed by
# its header alone starts after them, tracking puts them in it (tool-call-placement).
CALLS_FIRST = r"""
{%- for message in messages %}
{%- for call in message.tool_calls | default([]) %}
{{- '<tool_call>' + call.function.name + '</tool_call>\n' }}
{%- endfor %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

FAILING = {
    "refuses_all": REFUSES_ALL,
    "reversed": REVERSED,
    "repeats_first": REPEATS_FIRST,
    "calls_first": CALLS_FIRST,
}
