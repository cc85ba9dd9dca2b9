"""RayExecutor: an hvdlite job whose ranks are Ray actors (Horovod's ``horovod.ray.RayExecutor`` API).

    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=4, cpus_per_worker=1)
    executor.start()
    results = executor.run(train, args=[config])     # train() calls hvd.init() itself; results in rank order
    executor.shutdown()

How a job forms: the workers' placement group is reserved (strategy.py), one actor starts per worker and
reports its node; ranks are numbered host by host (co-located workers get consecutive ranks, so they share
memory and the rings stay inside hosts as long as possible); the driver serves the job's rendezvous (the
launcher's authenticated service, with a fresh secret) and every actor receives the launcher's variables
(HVDLITE_* and HOROVOD_*) for its rank. ``hvd.init()`` inside the actor then bootstraps exactly as under
``hvdlite-run``.

A failure is never a hang: when a function raises on one worker, the others are likely blocked in a collective
waiting for it, so the executor kills every actor of the job and raises WorkerError naming the rank, with the
worker's traceback. ``start()`` can then form a new job.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Any, Callable, Dict, List, Optional, Sequence

from hvdlite.common.placement import log
from hvdlite.common.rendezvous import RendezvousServer
from hvdlite.common.topology import topology_for_hosts
from hvdlite.ray import strategy as strategies
from hvdlite.ray.worker import Worker
from hvdlite.runner.api import RunError, build_rank_env


class WorkerError(RunError):
    """A function raised on a worker (``rank``, ``remote_traceback``); every worker of the job was stopped."""


@dataclasses.dataclass
class RaySettings:
    """What Horovod's ``RayExecutor.create_settings`` returns. ``timeout_s`` bounds the ranks' start-up
    (rendezvous and connections: HVDLITE_START_TIMEOUT), ``placement_group_timeout_s`` the wait for the
    cluster to grant the workers' resources. The ssh fields are kept for Horovod scripts and not used: Ray
    starts the processes, so nothing logs in anywhere."""

    timeout_s: float = 300
    placement_group_timeout_s: float = 100
    ssh_identity_file: Optional[str] = None
    ssh_str: Optional[str] = None


class RayExecutor:
    """Runs functions on ``num_workers`` Ray actors that form one hvdlite job (or ``num_hosts`` x
    ``num_workers_per_host``, exactly that many per node). Horovod's signature and behaviour."""

    @classmethod
    def create_settings(cls, timeout_s, ssh_identity_file=None, ssh_str=None, placement_group_timeout_s=100):
        return RaySettings(
            timeout_s=timeout_s,
            placement_group_timeout_s=placement_group_timeout_s,
            ssh_identity_file=ssh_identity_file,
            ssh_str=ssh_str,
        )

    def __init__(
        self,
        settings,
        num_workers: Optional[int] = None,
        num_hosts: Optional[int] = None,
        num_workers_per_host: int = 1,
        cpus_per_worker: float = 1,
        use_gpu: bool = False,
        gpus_per_worker: Optional[float] = None,
    ):
        if gpus_per_worker and not use_gpu:
            raise ValueError("gpus_per_worker is set but use_gpu is False; set use_gpu=True to reserve GPUs")
        if (num_workers is None) == (num_hosts is None):
            raise ValueError("give either num_workers, or num_hosts (with num_workers_per_host), not both")
        self.settings = settings if settings is not None else RaySettings()
        self.num_workers = num_workers
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host
        self.cpus_per_worker = cpus_per_worker
        self.use_gpu = use_gpu
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.workers: List[Any] = []  # actor handles, in rank order
        self.nodes: List[Dict[str, Any]] = []  # each rank's node (ip, hostname, pid)
        self._placement_group = None
        self._rendezvous: Optional[RendezvousServer] = None

    # ------------------------------------------------------------------ life cycle

    def _strategy(self) -> strategies.Strategy:
        if self.num_workers is not None:
            return strategies.pack(self.num_workers, self.cpus_per_worker, self.gpus_per_worker)
        return strategies.colocated(
            self.num_hosts, self.num_workers_per_host, self.cpus_per_worker, self.gpus_per_worker
        )

    def start(
        self,
        executable_cls: Optional[type] = None,
        executable_args: Optional[Sequence] = None,
        executable_kwargs: Optional[Dict] = None,
        extra_env_vars: Optional[Dict[str, str]] = None,
    ) -> None:
        """Reserves the workers, starts them, and hands each its rank's environment; with ``executable_cls``
        every worker builds ``executable_cls(*executable_args, **executable_kwargs)`` for ``execute``."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if self.workers:
            raise RuntimeError("this RayExecutor is already started; call shutdown() first")
        if not ray.is_initialized():
            ray.init()
        plan = self._strategy()
        group = placement_group(plan.bundles, strategy=plan.strategy)
        self._placement_group = group
        ready, _ = ray.wait([group.ready()], timeout=self.settings.placement_group_timeout_s)
        if not ready:
            self.shutdown()
            raise TimeoutError(
                f"the Ray cluster did not grant {plan.num_workers} workers ({plan.strategy} of {plan.bundles}) "
                f"within {self.settings.placement_group_timeout_s} s; available: {ray.available_resources()}"
            )
        actor = ray.remote(Worker)
        started = [
            actor.options(
                num_cpus=self.cpus_per_worker,
                num_gpus=self.gpus_per_worker,
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=bundle),
            ).remote()
            for bundle in plan.bundle_of_worker
        ]
        nodes = ray.get([w.node.remote() for w in started])
        # A node's identity is the address it registered with the cluster: two nodes on one machine with
        # different addresses count as two hosts, as they would on two machines.
        addresses = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        for node in nodes:
            node["ip"] = addresses[node["node_id"]]

        # Ranks host by host, hosts in the order their first worker appeared.
        host_order: Dict[str, int] = {}
        for node in nodes:
            host_order.setdefault(node["ip"], len(host_order))
        order = sorted(range(len(started)), key=lambda w: (host_order[nodes[w]["ip"]], w))
        self.workers = [started[w] for w in order]
        self.nodes = [nodes[w] for w in order]

        driver_ip = addresses.get(ray.get_runtime_context().get_node_id()) or ray.util.get_node_ip_address()
        job_secret = secrets.token_bytes(32)
        self._rendezvous = RendezvousServer(job_secret, host=driver_ip).start()
        _, port = self._rendezvous.address
        job_id = "ray-" + secrets.token_hex(4)
        infos = topology_for_hosts([node["ip"] for node in self.nodes])
        calls = []
        for info, worker, node in zip(infos, self.workers, self.nodes):
            env = build_rank_env(
                info, rendezvous_addr=driver_ip, rendezvous_port=port, secret=job_secret, job_id=job_id, base_env={}
            )
            env["HVDLITE_ADVERTISE_ADDR"] = node["ip"]  # Ray knows which address reaches this node
            env["HVDLITE_START_TIMEOUT"] = str(int(self.settings.timeout_s))
            env.update(extra_env_vars or {})
            calls.append(worker.set_env.remote(env))
            calls.append(
                worker.start_executable.remote(
                    executable_cls, list(executable_args or []), dict(executable_kwargs or {})
                )
            )
        self._gather(calls, ranks=[r for r in range(len(self.workers)) for _ in (0, 1)])
        log(
            "info",
            f"RayExecutor: {len(self.workers)} workers on {len(host_order)} hosts "
            f"({', '.join(host_order)}); rendezvous at {driver_ip}:{port}",
        )

    def shutdown(self) -> None:
        """Stops every worker and releases their resources. Safe to call more than once."""
        import ray

        for worker in self.workers:
            try:
                ray.kill(worker, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead is fine
                pass
        self.workers, self.nodes = [], []
        if self._placement_group is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self._placement_group)
            except Exception:  # noqa: BLE001 - the cluster may be gone already
                pass
            self._placement_group = None
        if self._rendezvous is not None:
            self._rendezvous.stop()
            self._rendezvous = None

    # ------------------------------------------------------------------ running functions

    def _require_started(self) -> None:
        if not self.workers:
            raise RuntimeError(
                "the RayExecutor is not started (call start() first; a failed function stops "
                "every worker, and start() forms a new job)"
            )

    def run_remote(
        self, fn: Callable[..., Any], args: Optional[Sequence] = None, kwargs: Optional[Dict] = None
    ) -> list:
        """``fn(*args, **kwargs)`` on every worker; returns the ObjectRefs in rank order (for ``ray.get``; a
        failure there does not stop the other workers: ``run`` does)."""
        self._require_started()
        args, kwargs = tuple(args or ()), dict(kwargs or {})
        return [worker.run.remote(fn, args, kwargs) for worker in self.workers]

    def run(self, fn: Callable[..., Any], args: Optional[Sequence] = None, kwargs: Optional[Dict] = None) -> list:
        """``fn(*args, **kwargs)`` on every worker; the results in rank order, or WorkerError."""
        return self._gather(self.run_remote(fn, args, kwargs))

    def execute(self, fn: Callable[[Any], Any]) -> list:
        """``fn(executable)`` on every worker (the object ``start`` built, or None); results in rank order."""
        self._require_started()
        return self._gather([worker.execute.remote(fn) for worker in self.workers])

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)`` on rank 0 only."""
        self._require_started()
        return self._gather([self.workers[0].execute.remote(fn)])[0]

    def _gather(self, refs: list, ranks: Optional[List[int]] = None) -> list:
        """Results of refs (ref i belongs to rank ranks[i], default i), or, at the first failure, every worker
        stopped and WorkerError raised."""
        import ray

        ranks = list(range(len(refs))) if ranks is None else ranks
        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done[0])
            except Exception as error:  # noqa: BLE001 - any worker failure ends the job
                rank = ranks[index[done[0]]]
                self.shutdown()
                cause = getattr(error, "cause", None)
                raise WorkerError(
                    f"hvdlite RayExecutor: rank {rank} failed"
                    + (f" with {type(cause).__name__}: {cause}" if cause is not None else "")
                    + f"; every worker was stopped.\n{error}",
                    rank,
                    1,
                    str(error),
                ) from error
        return ray.get(refs)
