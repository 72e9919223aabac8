"""Session limits (docs/architecture.md §10), one concept per module, imports running down:

* ``types``: the shared ``Literal`` types and the default session header.
* ``identity``: who a request belongs to (``identify``) and the hashes of its
  conversation's prefixes (``hash_conversation``).
* ``rule``: ``decide``, the pure rule, and the state it keeps.
* ``store``: the ``SessionStore`` Protocol and ``StoreUnavailable``.
* ``memory``: the per-process store; ``redis_store``: the shared one (the same rule
  as a Lua script).
* ``gate``: ``Sessions``, the step the chat route calls, and ``build_sessions``.

This module imports nothing, so that ``proxy.settings`` can import ``types``
without pulling in the gate (which imports the settings).
"""
