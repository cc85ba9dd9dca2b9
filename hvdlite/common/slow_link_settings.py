"""The checks of the slow-link options' settings, shared by hvdlite.torch and the Keras optimizer so that both
refuse the same settings with the same words."""

from hvdlite.common.ops import Average, Sum


def check_error_feedback(kind: str, op, start_iter: int, min_compression_rate: float) -> None:
    if start_iter < 0:
        raise ValueError(f"start_iter must be >= 0, got {start_iter}")
    if min_compression_rate < 1:
        raise ValueError(f"min_compression_rate must be >= 1, got {min_compression_rate}")
    if op not in (Average, Sum):
        raise ValueError(f"{kind} compression supports op=Average or op=Sum")


def check_powersgd_rank(rank: int) -> None:
    if rank < 1:
        raise ValueError(f"PowerSGD rank must be >= 1, got {rank}")


def check_topk_ratio(ratio: float) -> None:
    if not 0 < ratio <= 1:
        raise ValueError(f"top-k ratio must be in (0, 1], got {ratio}")


def check_local_sgd(sync_every, warmup_steps: int, outer_lr: float, outer_momentum: float) -> None:
    if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
        raise ValueError(f"sync_every must be an integer >= 1, got {sync_every!r}")
    if warmup_steps < 0:
        raise ValueError(f"sync_warmup_steps must be >= 0, got {warmup_steps}")
    if outer_lr <= 0 or not 0 <= outer_momentum < 1:
        raise ValueError(f"outer_lr must be > 0 and outer_momentum in [0, 1), got {outer_lr}, {outer_momentum}")
