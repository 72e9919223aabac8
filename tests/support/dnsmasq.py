"""A real DNS server for the tests: Debian's dnsmasq on a loopback port.

It answers only from a hosts file of its own (``--no-resolv --no-hosts``), with TTL 0,
and re-reads the file on SIGHUP, so a test can add and remove an engine's record the
way a headless Service's endpoints change. ``set_records`` returns once dnsmasq answers
with the new set (asked over the wire, not waited for with a sleep). Those checks are
sent from 127.0.0.254, so that ``lookups()`` tells the proxy's own lookups (from
127.0.0.1) apart in the query log.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Self

import dns.exception
import dns.message
import dns.query
import dns.rdatatype

from tests.support.processes import StackError, free_port, start_process, stop_process_group, tail

DNSMASQ = "dnsmasq"
_START_TIMEOUT = 10.0
#: The source address of this module's own queries (all of 127/8 is the loopback).
OWN_SOURCE = "127.0.0.254"


def dnsmasq_binary() -> str | None:
    """dnsmasq's path: on PATH, or in /usr/sbin (root's PATH may lack it)."""
    return shutil.which(DNSMASQ) or shutil.which(DNSMASQ, path="/usr/sbin:/sbin")


class Dnsmasq:
    """``dnsmasq`` serving ``records`` (name -> addresses) on 127.0.0.1:``port``."""

    def __init__(self, workdir: Path, records: dict[str, list[str]]) -> None:
        binary = dnsmasq_binary()
        if binary is None:
            raise StackError("dnsmasq is not installed: apt-get install -y dnsmasq-base")
        self.binary = binary
        self.workdir = workdir
        self.hosts = workdir / "dnsmasq.hosts"
        self.log = workdir / "dnsmasq.log"
        self.port = free_port()
        self._records = dict(records)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def nameserver(self) -> str:
        """``TRIMPROXY_DNS_NAMESERVER``'s value for this server."""
        return f"127.0.0.1:{self.port}"

    def _write(self) -> None:
        lines = [
            f"{address} {name}"
            for name, addresses in self._records.items()
            for address in addresses
        ]
        tmp = self.hosts.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in lines))
        tmp.replace(self.hosts)

    def start(self) -> Self:
        self._write()
        argv = [
            self.binary,
            "--keep-in-foreground",
            # Stay the user the tests run as: dropped to "nobody", dnsmasq could not read
            # a hosts file in pytest's private (0700) tmp folders.
            f"--user={getpass.getuser()}",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            "--no-negcache",
            f"--addn-hosts={self.hosts}",
            # Authoritative for the names' domains: without an upstream, dnsmasq answers
            # REFUSED for a record it lacks (AAAA of an IPv4 engine) instead of NODATA.
            *sorted({f"--local=/{name.rsplit('.', 1)[-1]}/" for name in self._records}),
            "--local-ttl=0",
            "--listen-address=127.0.0.1",
            "--bind-interfaces",
            f"--port={self.port}",
            "--log-queries",
            "--log-facility=-",
            f"--pid-file={self.workdir / 'dnsmasq.pid'}",
        ]
        self._proc = start_process(
            "dnsmasq", argv, log=self.log, env=dict(os.environ), cwd=self.workdir
        )
        for name, addresses in self._records.items():
            self._wait_for(name, addresses)
        return self

    def set_records(self, name: str, addresses: Iterable[str]) -> None:
        """Replace ``name``'s addresses; returns once dnsmasq serves them."""
        self._records[name] = sorted(addresses)
        self._write()
        if self._proc is None:
            raise StackError("dnsmasq is not running")
        self._proc.send_signal(signal.SIGHUP)
        self._wait_for(name, self._records[name])

    def query(self, name: str) -> list[str]:
        """The A records dnsmasq gives for ``name`` now (``[]`` for none)."""
        request = dns.message.make_query(name, dns.rdatatype.A)
        response = dns.query.udp(
            request, "127.0.0.1", port=self.port, timeout=1.0, source=OWN_SOURCE
        )
        return sorted(item.to_text() for rrset in response.answer for item in rrset)

    def lookups(self, name: str, source: str = "127.0.0.1") -> list[list[str]]:
        """The answer to every A query for ``name`` from ``source`` so far, in order,
        read from dnsmasq's query log (one query's answer lines follow its query line)."""
        found: list[list[str]] = []
        current: list[str] | None = None
        for line in tail(self.log, size=10_000_000).splitlines():
            _, _, text = line.partition(": ")
            if text.startswith("query["):
                current = [] if text == f"query[A] {name} from {source}" else None
                if current is not None:
                    found.append(current)
            elif current is not None and text.split(" ")[1:3] == [name, "is"]:
                current.append(text.rsplit(" ", 1)[1])
        return [sorted(answer) for answer in found]

    def _wait_for(self, name: str, addresses: list[str]) -> None:
        deadline = time.monotonic() + _START_TIMEOUT
        last: object = None
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise StackError(f"dnsmasq exited ({self._proc.returncode}):\n{tail(self.log)}")
            try:
                last = self.query(name)
                if last == sorted(addresses):
                    return
            except (OSError, dns.exception.DNSException) as exc:
                last = exc
            time.sleep(0.05)
        raise StackError(
            f"dnsmasq never served {name} -> {addresses} (last: {last}):\n{tail(self.log)}"
        )

    def stop(self) -> None:
        if self._proc is not None:
            stop_process_group(self._proc, grace=2.0)
            self._proc = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
