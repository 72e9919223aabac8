"""Compaction of Responses conversations (docs/architecture.md §24): ``items`` (made
and expanded), ``fold`` (what an item holds), ``seal`` (its encryption), ``key`` (the
key, found at start), ``answers`` (the proxy's answers), ``summary`` (the operator's
optional summary). The route's step is ``proxy.pipeline.compaction``."""
