"""How many examples a property test runs: the suite's figure, scaled by the profile.

The full suite (CI) runs hypothesis's default profile, 100 examples a test and the
counts the tests ask for. The fast loop (``scripts/test.sh --fast``, CONTRIBUTING.md)
loads the ``fast`` profile, 25 a test: every property still runs, on a quarter of
the examples. A test that asks for more than the default says ``examples(400)``, and
gets 400 in the full suite and 100 in the fast loop.
"""

from __future__ import annotations

from hypothesis import settings

# The profiles tests/conftest.py registers. ``--hypothesis-profile fast`` picks the second.
DEFAULT_EXAMPLES = 100
FAST_EXAMPLES = 25
FLOOR = 10


def examples(full: int) -> int:
    """``full`` examples under the default profile; the loaded profile's share of them."""
    loaded = settings.default  # None only while hypothesis itself is being imported
    share = loaded.max_examples if loaded is not None else DEFAULT_EXAMPLES
    return max(FLOOR, full * share // DEFAULT_EXAMPLES)
