"""The Responses API's stored responses, held by trimproxy (docs/architecture.md §22),
one concept per module, imports running down:

* ``entry``: ``Stored``, what is kept under a response id, and its bytes.
* ``store``: the ``ResponseStore`` Protocol and ``StoreUnavailable``.
* ``memory``: the per-process store; ``redis_store``: the one replicas share.
* ``keeper``: ``Keeper``, the one gate the route calls (lookups, writes, metrics,
  errors), and ``build_keeper``.
"""
