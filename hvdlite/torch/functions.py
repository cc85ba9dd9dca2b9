"""Model/optimizer state helpers and object collectives (horovod.torch.functions)."""

import io
from typing import Any, List

import cloudpickle
import torch

from hvdlite.common.basics import global_process_set, rank
from hvdlite.torch import mpi_ops


def broadcast_parameters(params, root_rank: int, process_set=global_process_set) -> None:
    """Overwrites every rank's parameters with root_rank's, in place. params: a state_dict, a
    named_parameters() iterable, (name, tensor) pairs, or plain tensors such as model.parameters() (matched
    across ranks by position)."""
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, (str, bytes, torch.Tensor)) or not hasattr(params, "__iter__"):
        raise ValueError(
            f"invalid params of type: {type(params)}; pass a state_dict, named_parameters() or parameters()"
        )
    else:
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    # Unnamed tensors are matched across ranks by position.
    items = [(f"position.{i}" if name is None else name, p) for i, (name, p) in enumerate(items)]
    handles = []
    for name, p in items:
        if not isinstance(p, torch.Tensor):
            continue
        target = p.data if isinstance(p, torch.nn.Parameter) else p
        handles.append(
            mpi_ops.broadcast_async_(target, root_rank, name=f"broadcast.param.{name}", process_set=process_set)
        )
    for h in handles:
        mpi_ops.synchronize(h)


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer, root_rank: int, process_set=global_process_set
) -> None:
    """Makes every rank's optimizer state (buffers, step counts and other scalars, hyper-parameters) equal to
    root_rank's. Parameters are matched by position, as in Optimizer.state_dict().

    Root's whole state_dict travels as one object, so parameters that have no state yet (never received a
    gradient, or a fresh optimizer) simply have none on every rank afterwards. Horovod instead broadcasts
    tensor by tensor and, to that end, gives an optimizer without any state one step() on zero gradients;
    hvdlite needs no such step, so training continues exactly as a single process's would (Adam's step count
    is not advanced, weight decay is not applied an extra time). What that step leaves visible is kept: with a
    fresh optimizer, each trainable parameter without a gradient gets a zero one, as after Horovod's call."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if not optimizer.state:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and p.grad is None:
                    zero = torch.zeros_like(p)
                    p.grad = zero.to_sparse() if isinstance(optimizer, torch.optim.SparseAdam) else zero
    if getattr(optimizer, "_hvd_sharded", None) is not None:  # shard_optimizer_state=True: whole on the root
        optimizer.consolidate_state_dict(to=root_rank)
    state = optimizer.state_dict() if rank() == root_rank else None
    state = broadcast_object(state, root_rank, name="broadcast.optimizer_state", process_set=process_set)
    if rank() != root_rank:
        optimizer.load_state_dict(state)


def _dumps(obj) -> torch.Tensor:
    buffer = io.BytesIO()
    cloudpickle.dump(obj, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _loads(data: torch.Tensor) -> Any:
    return cloudpickle.loads(data.numpy().tobytes())


def broadcast_object(obj: Any, root_rank: int = 0, name: str = None, process_set=global_process_set) -> Any:
    """Returns root_rank's obj on every rank (serialised with cloudpickle, so lambdas and local classes work)."""
    # The default name must not depend on obj: non-root ranks usually pass None.
    name = name or "object"
    if rank() == root_rank:
        payload = _dumps(obj)
        length = torch.tensor([payload.numel()], dtype=torch.int64)
    else:
        payload = None
        length = torch.zeros(1, dtype=torch.int64)
    mpi_ops.broadcast_(length, root_rank, name=f"broadcast_object.{name}.length", process_set=process_set)
    if payload is None:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    mpi_ops.broadcast_(payload, root_rank, name=f"broadcast_object.{name}.data", process_set=process_set)
    return obj if rank() == root_rank else _loads(payload)


def allgather_object(obj: Any, name: str = None, process_set=global_process_set) -> List[Any]:
    """Returns the list of every rank's obj, in rank order of the process set."""
    name = name or "object"
    payload = _dumps(obj)
    lengths = mpi_ops.allgather(
        torch.tensor([payload.numel()], dtype=torch.int64),
        name=f"allgather_object.{name}.length",
        process_set=process_set,
    )
    gathered = mpi_ops.allgather(payload, name=f"allgather_object.{name}.data", process_set=process_set)
    out, offset = [], 0
    for n in lengths.tolist():
        out.append(_loads(gathered[offset : offset + n]))
        offset += n
    return out
