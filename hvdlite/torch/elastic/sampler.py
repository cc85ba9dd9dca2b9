"""ElasticSampler: a DistributedSampler whose epoch can be resumed on a different number of workers."""

from __future__ import annotations

import math
from typing import Iterator, List

import torch

from hvdlite.common.basics import is_initialized, rank, size


class ElasticSampler(torch.utils.data.Sampler):
    """Horovod's ``hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=0)``.

    Each epoch draws one order of the whole dataset (the same on every rank: ``seed + epoch``). Training calls
    ``record_batch(batch_idx, batch_size)`` after each step, which counts the samples every rank consumed
    (``batch_size`` per rank). After a membership change the remaining samples of the epoch, and only those,
    are split among the new ranks, so an epoch neither repeats nor skips a sample (up to the padding that
    makes the last share equal on every rank, as DistributedSampler pads).
    """

    def __init__(self, dataset, shuffle: bool = True, seed: int = 0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0  # samples of this epoch's order consumed by all ranks together
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """After a step of ``batch_size`` samples on each rank (``batch_idx`` is accepted for Horovod's
        signature)."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = state["epoch"]
        self.processed_num = state["processed_num"]
        self.reset()

    def reset(self) -> None:
        """Re-reads rank and size (after the job was re-formed) and re-splits the rest of the epoch."""
        self.num_replicas = size() if is_initialized() else 1
        self.rank = rank() if is_initialized() else 0
        order = self._epoch_order()
        self.remaining = order[min(self.processed_num, len(order)) :]
        self.num_samples = int(math.ceil(len(self.remaining) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def _epoch_order(self) -> List[int]:
        n = len(self.dataset)
        if not self.shuffle:
            return list(range(n))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(n, generator=generator).tolist()

    def __iter__(self) -> Iterator[int]:
        indices = list(self.remaining)
        if indices:
            indices += (indices * self.num_replicas)[: self.total_size - len(indices)]  # pad evenly
        return iter(indices[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples
