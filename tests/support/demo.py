"""``trimproxy serve --demo`` as a child process: the README's first command, the proxy
in front of the simulated vLLM engines it starts itself.

``with DemoProcess(engines=3) as demo:`` starts it on a free port and
returns once ``/readyz`` answers 200 (every engine up); a ``ProxyProcess`` besides
(``url``, ``logs()``), with ``upstreams()``, the engines' URLs as it printed them.
``demo.stop_with(signal.SIGINT)`` stops it the way an operator does (Ctrl-C, ``kill``):
the signal to the proxy alone, so that stopping its engines is the proxy's own doing.
Leaving the block kills whatever is left of the process group (the engines are in
it), so a test checks that they are gone before it leaves.
"""

from __future__ import annotations

import signal
import subprocess
from dataclasses import dataclass

from tests.support.processes import ProxyProcess

#: How long the demo gets to stop after a signal before the test calls it a hang.
STOP_TIMEOUT = 30.0


@dataclass
class DemoProcess(ProxyProcess):
    engines: int = 1
    ready_path: str = "/readyz"

    def serve_args(self) -> list[str]:
        return ["--demo", "--engines", str(self.engines), *super().serve_args()]

    def upstreams(self) -> list[str]:
        """The engines' URLs, from the ``demo upstream ... at URL`` lines."""
        return [
            line.rsplit(" at ", 1)[1].strip()
            for line in self.logs().splitlines()
            if "demo upstream" in line and " at http" in line
        ]

    def stop_with(self, sig: signal.Signals) -> int:
        """Send ``sig`` to the proxy process and wait for it to exit; its exit status."""
        self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"serve --demo still ran {STOP_TIMEOUT:.0f}s after {sig.name}:\n{self.logs()}"
            ) from None
