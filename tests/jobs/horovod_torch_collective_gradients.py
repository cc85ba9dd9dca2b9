"""The gradients of the differentiable collectives (allreduce, allgather with ragged rows, broadcast, alltoall,
reducescatter) are Horovod's, checked against every rank's upstream gradient."""

import torch
from horovod_torch_common import D, N, R, close, hvd, upstream

rows = [r + 1 for r in range(N)]  # ragged first dimensions
offset = sum(rows[:R])

# allreduce: allreduce of the gradient with the forward's op and scale factors
for op, name in ((hvd.Sum, "sum"), (hvd.Average, "avg")):
    x = torch.arange(4, dtype=D).add(R).requires_grad_(True)
    (
        hvd.allreduce(x, op=op, prescale_factor=2.0, postscale_factor=0.25, name=f"ar.{name}")
        * upstream(R, f"ar.{name}", (4,))
    ).sum().backward()
    total = sum(upstream(r, f"ar.{name}", (4,)) for r in range(N))
    close(f"allreduce {name}", x.grad, 0.5 * (total if op == hvd.Sum else total / N))

# allgather: the gradient is AVERAGED over the ranks, then this rank's rows are taken
# (torch.distributed.nn.functional.all_gather would sum it)
a = torch.ones(rows[R], 2, dtype=D, requires_grad=True)
(hvd.allgather(a, name="ag") * upstream(R, "ag", (sum(rows), 2))).sum().backward()
mean = sum(upstream(r, "ag", (sum(rows), 2)) for r in range(N)) / N
close("allgather", a.grad, mean[offset : offset + rows[R]])

# broadcast: the gradient is AVERAGED over the ranks on the root, zero elsewhere
b = torch.ones(3, dtype=D, requires_grad=True)
(hvd.broadcast(b, root_rank=1, name="bc") * upstream(R, "bc", (3,))).sum().backward()
mean = sum(upstream(r, "bc", (3,)) for r in range(N)) / N
close("broadcast", b.grad, mean if R == 1 else torch.zeros(3, dtype=D))

# alltoall: the gradient goes back along the received splits, unscaled
splits = [[(r + j) % 2 + 1 for j in range(N)] for r in range(N)]  # splits[r][j]: rows r sends to j
received_rows = [sum(splits[r][j] for r in range(N)) for j in range(N)]
t = torch.ones(sum(splits[R]), 2, dtype=D, requires_grad=True)
out, _ = hvd.alltoall(t, splits=splits[R], name="a2a")
(out * upstream(R, "a2a", (received_rows[R], 2))).sum().backward()
pieces = []
for j in range(N):
    start = sum(splits[i][j] for i in range(R))  # where rank R's rows sit in rank j's output
    pieces.append(upstream(j, "a2a", (received_rows[j], 2))[start : start + splits[R][j]])
close("alltoall", t.grad, torch.cat(pieces))

# reducescatter: allgather of the gradient, times the set size for Sum, times prescale * postscale
total_rows = 2 * N + 1  # uneven: rank 0 gets the extra row
mine = [total_rows // N + (1 if r < total_rows % N else 0) for r in range(N)]
for op, name in ((hvd.Sum, "sum"), (hvd.Average, "avg")):
    s = torch.ones(total_rows, 2, dtype=D, requires_grad=True)
    piece = hvd.reducescatter(s, op=op, prescale_factor=3.0, name=f"rs.{name}")
    (piece * upstream(R, f"rs.{name}", (mine[R], 2))).sum().backward()
    gathered = torch.cat([upstream(r, f"rs.{name}", (mine[r], 2)) for r in range(N)])
    close(f"reducescatter {name}", s.grad, gathered * 3.0 * (N if op == hvd.Sum else 1))
