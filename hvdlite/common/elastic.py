"""Elastic training, the framework-neutral half: the round protocol a worker follows at each ``init()``, the
state a training function keeps across membership changes, and the retry loop of ``hvd.elastic.run``.

Protocol (rendezvous scope ``elastic.<job>``; the driver is launcher/elastic.py):

- A worker is a process the driver started on one slot of a host; ``HVDLITE_WORKER_ID`` names it for the whole
  job, while its rank changes from round to round.
- Rounds are numbered from 0. A worker that wants to take part in round r posts ``ready.<r>.<worker>``, then
  waits for ``round.<r>``: the driver publishes it (every worker's rank, size, local and cross ranks, host) once
  every live worker is ready for r, or after a settling time without the ones that never said so (stopped,
  hung: the driver stops them). A worker left out of round r (more workers than ``--max-np``) tries r + 1.
- Which round: the one after the worker's last round; a worker's first round is the one after ``latest``
  (round 0 when there is none yet).
- When the workers discovery added during round r all wait for round r + 1 (they have started up), or when it
  takes slots away (the workers leaving are stopped as round r + 1 forms), the driver sets ``hosts_updated`` to
  r. ``State.commit()`` reads it on rank 0, all ranks agree
  through one broadcast, and every rank raises ``HostsUpdatedInterrupt``: the training function returns to
  ``run``, which re-initialises into round r + 1 with the new workers.
- The mesh of round r exchanges addresses in rendezvous scope ``init.<job>.r<r>``.

Durable state (``hvd.elastic.run(checkpoint_dir=...)`` or ``hvdlite-run --checkpoint-dir``): rank 0 also writes
every N-th commit to a file (hvdlite/common/checkpoint.py), and the first entry into ``run`` loads the newest
one, so a job started again after losing every worker goes on from there.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import time
from typing import Any, Callable, Dict, List, Optional

from hvdlite.common import checkpoint
from hvdlite.common.errors import HvdliteError
from hvdlite.common.placement import Placement, log

ELASTIC_TIMEOUT_DEFAULT = 600.0  # seconds a worker waits to be placed in a round (HOROVOD_ELASTIC_TIMEOUT)

_last_round: Optional[int] = None  # the round this process last took part in
_current_round: Optional[int] = None


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by ``State.commit()``/``check_host_updates()`` on every rank when workers were added or are to
    leave (Horovod's class of the same name). ``skip_sync``: the state need not be broadcast again after the
    reset."""

    def __init__(self, skip_sync: bool = False):
        super().__init__("the set of hosts changed; re-forming the job")
        self.skip_sync = skip_sync


def enabled(environ=None) -> bool:
    env = os.environ if environ is None else environ
    return env.get("HVDLITE_ELASTIC") == "1"


def scope(job_id: str) -> str:
    return f"elastic.{job_id}"


def _client(env) -> Any:
    from hvdlite.common.rendezvous import RendezvousClient

    return RendezvousClient(
        env["HVDLITE_RENDEZVOUS_ADDR"],
        int(env["HVDLITE_RENDEZVOUS_PORT"]),
        bytes.fromhex(env["HVDLITE_SECRET"]),
        timeout=30.0,
    )


def _try_get(client, scope_name: str, key: str) -> Optional[bytes]:
    try:
        return client.get(scope_name, key, wait=0)
    except TimeoutError:
        return None


def current_round() -> Optional[int]:
    """The elastic round this process takes part in (numbered from 0 across the job); None outside an elastic
    job. The same number on every worker of a round: logs keyed by it line up across workers."""
    return _current_round


def placement(env) -> Placement:
    """This worker's placement in its next round (blocks until the driver forms it)."""
    global _last_round, _current_round
    job_id = env.get("HVDLITE_JOB_ID", "job")
    worker = env["HVDLITE_WORKER_ID"]
    timeout = float(
        env.get("HVDLITE_ELASTIC_TIMEOUT") or env.get("HOROVOD_ELASTIC_TIMEOUT") or ELASTIC_TIMEOUT_DEFAULT
    )
    client = _client(env)
    name = scope(job_id)
    if _last_round is not None:
        target = _last_round + 1
    else:
        latest = _try_get(client, name, "latest")
        target = 0 if latest is None else int(latest) + 1
    deadline = time.monotonic() + timeout
    while True:
        client.put(name, f"ready.{target}.{worker}", b"1")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(
                f"worker {worker}: not placed in a round within {timeout:.0f} s (HVDLITE_ELASTIC_TIMEOUT)"
            )
        try:
            formed = json.loads(client.get(name, f"round.{target}", wait=remaining))
        except TimeoutError:
            raise TimeoutError(
                f"worker {worker}: round {target} was not formed within {timeout:.0f} s (HVDLITE_ELASTIC_TIMEOUT)"
            ) from None
        mine = formed["workers"].get(worker)
        if mine is not None:
            break
        target += 1  # left out (more workers than --max-np): wait for the next round
    _last_round = _current_round = target
    # Scripts read Horovod's variables; keep them true for this round.
    for prefix in ("HVDLITE_", "HOROVOD_"):
        for key in ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size"):
            os.environ[prefix + key.upper()] = str(mine[key])
    log("debug", f"elastic round {target}: worker {worker} is rank {mine['rank']} of {mine['size']}", mine["rank"])
    return Placement(
        rank=mine["rank"],
        size=mine["size"],
        local_rank=mine["local_rank"],
        local_size=mine["local_size"],
        cross_rank=mine["cross_rank"],
        cross_size=mine["cross_size"],
        hostname=mine["hostname"],
        job_id=job_id,
        secret=bytes.fromhex(env.get("HVDLITE_SECRET", "")),
        rendezvous=(env["HVDLITE_RENDEZVOUS_ADDR"], int(env["HVDLITE_RENDEZVOUS_PORT"])),
        method="elastic",
        exchange_scope=f"init.{job_id}.r{target}",
    )


def hosts_updated_since_round() -> bool:
    """Rank 0's view: has the driver added workers, or marked some to leave, during this process's current round?"""
    if not enabled() or _current_round is None:
        return False
    value = _try_get(_client(os.environ), scope(os.environ.get("HVDLITE_JOB_ID", "job")), "hosts_updated")
    return value is not None and int(value) >= _current_round


class State:
    """What a training function keeps across membership changes (Horovod's ``hvd.elastic.State``).

    ``commit()`` saves a copy to roll back to after a failure and checks for added or leaving workers;
    ``restore()`` rolls back; ``sync()`` makes every rank equal to rank 0 (after a reset, when ranks may have
    joined). Subclasses implement save/restore/sync for their framework objects; plain attributes given as
    keyword arguments (``epoch=0, batch=0``) are saved, restored and broadcast too.

    With checkpoints on (``hvd.elastic.run(checkpoint_dir=...)``), every N-th ``commit()`` on rank 0 also writes
    the saved copy to a file, and ``resume_from_checkpoint()`` loads the newest one. Subclasses add their
    objects' saved copies to ``_checkpoint_payload()`` and take them back in ``_load_checkpoint_payload()``.
    """

    def __init__(self, bcast_object: Callable[[Any, int], Any], get_rank: Callable[[], int], **kwargs):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks: List[Callable[[], None]] = []
        self._known = list(kwargs)
        self._saved: Dict[str, Any] = {}
        self._commits = 0  # numbers the checkpoints; kept in them and broadcast by sync()
        self._checkpoints: Optional[checkpoint.CheckpointSettings] = None
        self._synced = False  # sync() has completed once: the state is the job's, no longer this process's own
        for key, value in kwargs.items():
            setattr(self, key, value)
        self._save_attributes()

    def register_reset_callbacks(self, callbacks: List[Callable[[], None]]) -> None:
        """Functions called after every reset (new ranks and size), e.g. to scale the learning rate."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        self.save()
        self._commits += 1
        if self._checkpoints is not None and self._commits % self._checkpoints.every == 0 and self._rank() == 0:
            checkpoint.write(
                self._checkpoints.directory, self._commits, self._checkpoint_payload(), self._checkpoints.keep
            )
        self.check_host_updates()

    def use_checkpoints(self, settings: Optional[checkpoint.CheckpointSettings]) -> None:
        """Where commits write the state from now on (None: nowhere)."""
        self._checkpoints = settings

    def resume_from_checkpoint(self) -> Optional[int]:
        """On rank 0, until a sync() has completed: loads the newest checkpoint that verifies into the live objects
        (sync() then hands it to the other ranks). Returns its commit number; None when nothing was loaded. Not
        just on the first call: if the rank 0 that loaded it is lost before handing it on, the next round's rank 0
        (a survivor that never synced) must load it in turn, or the job would start again from nothing."""
        if self._checkpoints is None or self._synced or self._rank() != 0:
            return None
        directory = self._checkpoints.directory
        checkpoint.remove_partial_writes(directory)
        found = checkpoint.load_latest(directory)
        if found is None:
            return None
        sequence, payload, path = found
        self._load_checkpoint_payload(payload)
        self._commits = sequence
        self.restore()
        log("info", f"resumed from checkpoint {path} (commit {sequence})", 0)
        return sequence

    def _checkpoint_payload(self) -> Dict[str, Any]:
        """What a checkpoint holds: the copies the last save() made."""
        return {"attributes": self._saved}

    def _load_checkpoint_payload(self, payload: Dict[str, Any]) -> None:
        """Makes a checkpoint's payload the saved copy, which restore() then puts into the live objects."""
        self._saved = {key: value for key, value in payload["attributes"].items() if key in self._known}

    def check_host_updates(self) -> None:
        """Raises HostsUpdatedInterrupt on every rank, at the same commit, when workers were added or are to leave."""
        if not enabled():
            return  # no driver adds workers: no store to ask, no broadcast on every commit
        flag = 1 if self._rank() == 0 and hosts_updated_since_round() else 0
        if self._bcast_object(flag, 0):
            raise HostsUpdatedInterrupt(skip_sync=False)

    def save(self) -> None:
        self._save_attributes()

    def restore(self) -> None:
        for key, value in self._saved.items():
            setattr(self, key, copy.deepcopy(value))

    def sync(self) -> None:
        values, self._commits = self._bcast_object(
            ({key: getattr(self, key) for key in self._known}, self._commits), 0
        )
        for key, value in values.items():
            setattr(self, key, value)
        self._save_attributes()
        self._synced = True

    def _save_attributes(self) -> None:
        self._saved = {key: copy.deepcopy(getattr(self, key)) for key in self._known}


def run_fn(
    func: Optional[Callable],
    reset: Callable[[], None],
    *,
    checkpoint_dir: Optional[str] = None,
    checkpoint_every: Optional[int] = None,
    checkpoint_keep: Optional[int] = None,
) -> Callable:
    """``hvd.elastic.run``: calls ``func(state, ...)``; when a collective fails because a worker was lost, rolls
    the state back to its last commit, re-forms the job (``reset``: shutdown and init into the next round) and
    calls it again; likewise, without the roll-back, when workers were added or left. Outside an elastic job
    (``hvdlite-run`` without discovery), the first failure is raised.

    With a checkpoint directory (the argument, else hvdlite-run's HVDLITE_CHECKPOINT_DIR), every
    ``checkpoint_every``-th commit is also written there (the newest ``checkpoint_keep`` kept), and the first
    call resumes from the newest one. ``func`` None: used as ``@run(checkpoint_dir=...)``, returns the
    decorator."""
    if func is None:
        return functools.partial(
            run_fn,
            reset=reset,
            checkpoint_dir=checkpoint_dir,
            checkpoint_every=checkpoint_every,
            checkpoint_keep=checkpoint_keep,
        )

    @functools.wraps(func)
    def wrapper(state: State, *args, **kwargs):
        state.use_checkpoints(
            checkpoint.CheckpointSettings.resolve(checkpoint_dir, checkpoint_every, checkpoint_keep)
        )
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.resume_from_checkpoint()
                    state.sync()
                return func(state, *args, **kwargs)
            except HvdliteError as error:
                if not enabled():
                    raise
                log("warning", f"a collective failed ({error}); rolling back to the last commit and re-forming")
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as interrupt:
                if not enabled():
                    raise
                skip_sync = interrupt.skip_sync
            reset()
            state.on_reset()

    return wrapper
