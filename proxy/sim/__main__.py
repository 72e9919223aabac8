"""``python -m proxy.sim``: the sim on its own (same flags as ``trimproxy sim``)."""

from __future__ import annotations

from proxy.sim.cli import main

raise SystemExit(main())
