"""hvdlite.torch.elastic (Horovod's ``hvd.elastic`` for PyTorch): training that survives the loss or arrival
of workers under ``hvdlite-run --host-discovery-script``.

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch, (x, y) in enumerate(loader, start=state.batch):   # loader uses ElasticSampler
                ...
                state.commit()            # a point to roll back to; raises HostsUpdatedInterrupt when workers joined

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)
    train(state)

``@hvd.elastic.run(checkpoint_dir="ckpt")`` (or ``hvdlite-run --checkpoint-dir ckpt``) also keeps the state on
disk: running the same command again after the whole job was lost resumes from the last commit written.

The protocol and the retry loop are framework-neutral (hvdlite/common/elastic.py).
"""

from hvdlite.common.basics import shutdown
from hvdlite.common.elastic import HostsUpdatedInterrupt, State, run_fn
from hvdlite.torch.compute_threads import init  # hvdlite.torch.init, imported without a cycle
from hvdlite.torch.elastic.sampler import ElasticSampler
from hvdlite.torch.elastic.state import TorchState


def _reset() -> None:
    shutdown()
    init()  # which also shares the host's CPUs among this round's ranks there


def run(func=None, *, checkpoint_dir=None, checkpoint_every=None, checkpoint_keep=None):
    """Decorator: ``func(state, ...)`` re-run from the last commit after a worker is lost, and re-entered after
    workers join (see the module docstring). With ``checkpoint_dir`` (default: hvdlite-run's
    ``--checkpoint-dir``), rank 0 writes every ``checkpoint_every``-th commit there (default 1), keeps the newest
    ``checkpoint_keep`` (default 3), and the first call resumes from the newest. ``@run`` and
    ``@run(checkpoint_dir=...)`` both work."""
    return run_fn(
        func,
        _reset,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        checkpoint_keep=checkpoint_keep,
    )


__all__ = ["ElasticSampler", "HostsUpdatedInterrupt", "State", "TorchState", "run"]
