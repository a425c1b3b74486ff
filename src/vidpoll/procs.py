"""`vidpoll worker --processes N`: N child processes of the same worker command, supervised.

One worker process uses one core (asyncio, one thread); a host with cores to spare runs
several. The supervisor starts each child as `python -m vidpoll.cli ARGS` with
`SUPERVISOR_VARIABLE` naming its own pid, which makes the child one plain worker (its
`--processes` and `--metrics-port` are the supervisor's, not its own), then:

- **a child that ends on its own** while the supervisor is not stopping: exit 0 (a `--drain`
  that found nothing left) is done, never started again; exit 2 or 4 (a setting, the schema:
  every child would fail the same way) stops the others and the supervisor exits with it; any
  other end (a crash, a kill, an outage at start) starts it again after a backoff: 1 s, doubled
  after each quick end up to 30 s, back to 1 s once a child has run for a minute.
- **SIGTERM / SIGINT** are sent on to every child (each finishes what is in flight within its
  own `--shutdown-timeout`); the supervisor waits for them as long as that timeout and then
  kills what is left (its rows are left to their leases, as after any kill). A second signal
  is sent on too (the children stop at once). **SIGHUP** is sent on (prices and caps reloaded).
- Children run in a session of their own, so a terminal's Ctrl-C reaches them once, through
  the supervisor; a child whose supervisor died (kill -9) sees another parent and stops as if
  it had got SIGTERM (`parent_gone`).

The exit code: 0 when every child ended with 0 (a stop, a drain); else the first other code a
child ended with once stopping began (128 + N for a child stopped at once by a second signal
N), or the fatal code above.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

SUPERVISOR_VARIABLE = "VIDPOLL_SUPERVISOR_PID"
"""Set in each child's environment to the supervisor's pid: the child runs as one worker."""
RESTART_BASE_S = 1.0
RESTART_MAX_S = 30.0
HEALTHY_AFTER_S = 60.0
"""A child that ran this long before it ended starts again after the shortest backoff."""
FATAL_EXIT_CODES = frozenset({2, 4})
"""A setting or usage error (2), the schema missing or too old (4): a restart cannot help."""


def processes_wanted(value: str, cpu_count: Callable[[], int | None] = os.cpu_count) -> int:
    """`--processes` as a count: a whole number from 1 to 256, or `auto` (one per core)."""
    if value.strip().lower() == "auto":
        return max(1, cpu_count() or 1)
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"{value!r} is neither a whole number nor 'auto'") from None
    if not 1 <= n <= 256:
        raise ValueError(f"{n} is not between 1 and 256")
    return n


def supervisor_pid(env: Mapping[str, str] | None = None) -> int | None:
    """The supervisor's pid when this process is one of its children, else None."""
    value = (os.environ if env is None else env).get(SUPERVISOR_VARIABLE, "")
    return int(value) if value.isdigit() else None


def parent_gone(supervisor: int) -> bool:
    """Whether the supervisor that started this child has died (the child was handed to
    another parent: init, or a subreaper)."""
    return os.getppid() != supervisor


def restart_delay(quick_ends: int) -> float:
    """Seconds before a child is started again after its `quick_ends`-th end in a row."""
    return float(min(RESTART_MAX_S, RESTART_BASE_S * 2 ** max(0, quick_ends - 1)))


@dataclass
class ProcessesConfig:
    """What the supervisor runs: `processes` children of `command` with `env`."""

    processes: int
    command: Sequence[str]
    env: Mapping[str, str]
    shutdown_timeout_s: float
    healthy_after_s: float = HEALTHY_AFTER_S
    restart_base_s: float = RESTART_BASE_S


@dataclass
class _Slot:
    index: int
    proc: asyncio.subprocess.Process | None = None
    started: float = 0.0
    quick_ends: int = 0
    restarts: int = 0
    codes: list[int] = field(default_factory=list)


def exit_code_of(returncode: int) -> int:
    """A child's return code as a shell shows it (killed by signal N: 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


class Supervisor:
    """Starts, watches and stops the children (see the module's docstring)."""

    def __init__(self, config: ProcessesConfig,
                 on_exit: Callable[[int], None] | None = None) -> None:
        self.config = config
        self.on_exit = on_exit
        """Called with a child's pid once it has ended (its metrics are marked dead)."""
        self.slots = [_Slot(i) for i in range(config.processes)]
        self._stopping = asyncio.Event()
        self._signals = 0
        self._fatal: int | None = None
        self._stop_codes: list[int] = []

    # -- control --------------------------------------------------------------------------
    def pids(self) -> list[int]:
        """The pids of the children alive now."""
        return [s.proc.pid for s in self.slots
                if s.proc is not None and s.proc.returncode is None]

    def signalled(self, sig: int) -> None:
        """SIGTERM/SIGINT: stop (the children get it too); SIGHUP: sent on."""
        if sig in (signal.SIGTERM, signal.SIGINT):
            self._signals += 1
            if self._signals == 1:
                log.info("stopping %d worker processes (each finishes what is in flight "
                         "within its --shutdown-timeout)", len(self.pids()))
            self._stopping.set()
        self._send(sig)

    def _send(self, sig: int) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    # -- running --------------------------------------------------------------------------
    async def run(self) -> int:
        """Run the children until they end or a stop; the supervisor's exit code."""
        keepers = [asyncio.create_task(self._keep(slot), name=f"vidpoll-child-{slot.index}")
                   for slot in self.slots]
        stop = asyncio.create_task(self._stopping.wait())
        try:
            # every keeper may end on its own (each child drained, or a fatal code)
            await asyncio.wait([stop, *keepers], return_when=asyncio.FIRST_COMPLETED)
            while not stop.done() and not all(k.done() for k in keepers):
                await asyncio.wait([stop, *(k for k in keepers if not k.done())],
                                   return_when=asyncio.FIRST_COMPLETED)
            if not all(k.done() for k in keepers):
                await self._wait_or_kill(keepers)
        finally:
            stop.cancel()
            for task in keepers:
                task.cancel()
            await asyncio.gather(stop, *keepers, return_exceptions=True)
        for task in keepers:
            task.result()  # a keeper's own failure (the command could not be started)
        if self._fatal is not None:
            return self._fatal
        return next((c for c in self._stop_codes if c != 0), 0)

    async def _wait_or_kill(self, keepers: list[asyncio.Task[None]]) -> None:
        """After a stop: wait for the children as long as their shutdown timeout, then kill
        what is left (SIGKILL: their rows are left to their leases)."""
        _, pending = await asyncio.wait(keepers, timeout=self.config.shutdown_timeout_s)
        if pending:
            log.warning("%d worker processes still running at the shutdown timeout (%gs) "
                        "were killed; what they held is left to its leases", len(self.pids()),
                        self.config.shutdown_timeout_s)
            self._send(signal.SIGKILL)
            await asyncio.wait(pending)

    async def _keep(self, slot: _Slot) -> None:
        """Run one child, starting it again after an end of its own (with backoff)."""
        cfg = self.config
        while not self._stopping.is_set():
            slot.proc = await asyncio.create_subprocess_exec(
                *cfg.command, env=dict(cfg.env), start_new_session=True)
            slot.started = time.monotonic()
            if slot.restarts == 0:
                log.debug("worker process %d started (pid %d)", slot.index, slot.proc.pid)
            if self._stopping.is_set():  # a stop arrived while it was being started
                with contextlib.suppress(ProcessLookupError):
                    slot.proc.send_signal(signal.SIGTERM)
            code = exit_code_of(await slot.proc.wait())
            ran_s = time.monotonic() - slot.started
            slot.codes.append(code)
            if self.on_exit is not None:
                self.on_exit(slot.proc.pid)
            if self._stopping.is_set():
                # killed by the signal sent on before it had set up its own handlers: it had
                # claimed nothing yet (a worker claims only after they are in place)
                sent = code in (128 + signal.SIGTERM, 128 + signal.SIGINT)
                self._stop_codes.append(0 if sent and self._signals <= 1 else code)
                return
            if code == 0:
                log.info("worker process %d (pid %d) ended with 0 (nothing left to do)",
                         slot.index, slot.proc.pid)
                return
            if code in FATAL_EXIT_CODES:
                log.error("worker process %d (pid %d) ended with %d (a setting or the "
                          "schema: starting it again cannot help); stopping the others",
                          slot.index, slot.proc.pid, code)
                if self._fatal is None:
                    self._fatal = code
                    self._stopping.set()
                    self._send(signal.SIGTERM)
                return
            slot.quick_ends = 1 if ran_s >= cfg.healthy_after_s else slot.quick_ends + 1
            delay = cfg.restart_base_s * restart_delay(slot.quick_ends) / RESTART_BASE_S
            log.warning("worker process %d (pid %d) ended with %d after %.1fs; starting it "
                        "again in %.1fs", slot.index, slot.proc.pid, code, ran_s, delay)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stopping.wait()
            slot.restarts += 1
