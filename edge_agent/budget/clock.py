"""The device ledger's clock: the time its per-day window reads, advanced by a monotonic
clock, so that a wall clock moved by hand (or by malware, or by a bad NTP answer) neither
buys budget nor blocks the device.

The rule: the ledger keeps the latest time it has seen and, per *epoch* of a monotonic
clock (one boot, or one process where the boot cannot be told), an anchor: the ledger's
time and the monotonic reading at its last charge in that epoch. Its time now is

* in an epoch it has an anchor for: the anchor's time plus what the monotonic clock says
  has passed since (never less than the latest time seen). The wall clock is not read:
  stepping it forward opens no fresh window, stepping it back reopens no old one, and an
  honest correction of it refuses nothing;
* in an epoch it has not seen (after a reboot, or a new process where there is no boot
  id): the later of the latest time seen plus what surely passed since (the time since
  boot, when the reading counts from the boot and the ledger's charges were in other
  epochs) and the wall clock. This is the one place the wall clock is trusted forward:
  a clock set forward before a reboot opens one fresh per-day window (docs/ledger.md,
  "What the per-day window holds").

Clocks: Linux, the boot clock (``CLOCK_BOOTTIME``: counts suspend, one epoch per boot, named
by ``/proc/sys/kernel/random/boot_id``); elsewhere ``time.monotonic`` (one epoch per process).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from pathlib import Path

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class Reading:
    """A monotonic clock read now: its ``epoch`` (a boot id, or ``process:…``), the seconds
    ``at`` on it, and whether ``at`` counts from the epoch's boot (so at least that much
    time has passed since anything recorded in an earlier epoch)."""

    epoch: str
    at: float
    since_boot: bool


@dataclass(frozen=True)
class Anchor:
    """The ledger's time ``at`` and the monotonic ``reading`` at the last charge of an
    epoch."""

    at: float
    reading: float


class BootClock:
    """Linux: ``CLOCK_BOOTTIME`` (suspend included), one epoch per boot."""

    def __init__(self, boot_id: str):
        self.epoch = boot_id

    @classmethod
    def here(cls) -> BootClock | None:
        """The boot clock where the system has one (Linux), else None."""
        try:
            boot_id = BOOT_ID.read_text().strip()
            time.clock_gettime(time.CLOCK_BOOTTIME)
        except (OSError, AttributeError):
            return None
        return cls(boot_id) if boot_id else None

    def read(self) -> Reading:
        return Reading(self.epoch, time.clock_gettime(time.CLOCK_BOOTTIME), True)


class ProcessClock:
    """``time.monotonic``, one epoch per process (where the boot cannot be told)."""

    def __init__(self) -> None:
        self.epoch = f"process:{secrets.token_hex(8)}"

    def read(self) -> Reading:
        return Reading(self.epoch, time.monotonic(), False)


Clock = BootClock | ProcessClock
_SYSTEM: Clock | None = None


def system_clock() -> Clock:
    """This process's clock: the boot clock where there is one, else a process clock (made
    once per process, so that its epoch is the process)."""
    global _SYSTEM
    if _SYSTEM is None:
        _SYSTEM = BootClock.here() or ProcessClock()
    return _SYSTEM


def ledger_time(latest: float | None, anchors: dict[str, Anchor], now: Reading,
                wall: float) -> float:
    """The ledger's time now (seconds, on the wall clock's scale) by the rule above.
    ``latest``: the latest time the ledger has seen (None: it has charged nothing);
    ``anchors``: per epoch; ``now``: the monotonic clock read now; ``wall``: time.time()."""
    if latest is None:
        return wall
    anchor = anchors.get(now.epoch)
    if anchor is not None:
        return max(latest, anchor.at + max(0.0, now.at - anchor.reading))
    # an epoch not seen: a reading since boot is time that surely passed since the charges
    # of the other epochs (none known: a ledger written before anchors, credit nothing)
    surely = now.at if now.since_boot and anchors else 0.0
    return max(latest + surely, wall)
