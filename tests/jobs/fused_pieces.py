# Job script: fused allreduces run in pieces (runtime/fusion.h). Each case queues its members at once (one core
# operation each, one fused group), of sizes that fill a piece exactly, cross its end or exceed it, with values
# distinct by rank, member and element, checked on every rank; the core's count of pieces must be what the
# executor's rule gives, walked here: whole members up to the piece's bytes, a larger member alone, and the group
# whole where the job's ranks outnumber the machine's CPUs (fusion_piece_bytes=0).
# Run with HVDLITE_EAGER_ALLREDUCE_BYTES=0 (small members would be reduced during negotiation, outside the group)
# and a FUSION_TENSOR_LIMIT above the largest member (else it would run unfused).
import torch
from hvdjob import check, make, parse_build_info, reduce_reference

import hvdlite.torch as hvd
from hvdlite.torch import core_ops

hvd.init()
n, me = hvd.size(), hvd.rank()
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Max": hvd.Max}


def info():
    return parse_build_info(hvd.build_info())


piece_bytes = int(info()["fusion_piece_bytes"])
if (piece_bytes > 0) != (info()["cpu_per_rank"] == "1"):
    raise SystemExit(f"rank {me}: pieces {piece_bytes} bytes with cpu_per_rank={info()['cpu_per_rank']}")


def expected_pieces(counts, esize):
    if piece_bytes == 0:
        return 1
    limit = piece_bytes // esize
    pieces, first = 0, 0
    offsets = [sum(counts[:i]) for i in range(len(counts))]
    while first < len(counts):
        end = first + 1
        while end < len(counts) and offsets[end] + counts[end] - offsets[first] <= limit:
            end += 1
        pieces, first = pieces + 1, end
    return pieces


def member_counts(esize):
    p = 262144 // esize  # a quarter of a 1 MB L2; the rule walked above uses the core's own figure
    return [1, 300, p - 301, 7, p + 1000, 5, p // 2, p // 2, 3, 2 * p // 3, p // 2, 11, 4096, 4096, 9]


# (dtype, op, prescale, postscale)
CASES = [
    (torch.float32, "Sum", 1.0, 1.0),
    (torch.float64, "Average", 0.5, 3.0),
    (torch.int32, "Max", 1.0, 1.0),
]
checked = 0
for rep in range(3):
    for c, (dtype, opname, pre, post) in enumerate(CASES):
        counts = member_counts(torch.empty(0, dtype=dtype).element_size())
        keys = [(c, i, rep) for i in range(len(counts))]
        inputs = [[make(r, k, (m,), dtype) for k, m in zip(keys, counts)] for r in range(n)]
        mine = [t.clone() for t in inputs[me]]
        before = int(info()["fused_pieces"])
        handle = core_ops._grouped_allreduce_each_(
            mine, f"pieces.{c}", OPS[opname], pre, post, hvd.global_process_set
        )
        hvd.synchronize(handle)
        ran = int(info()["fused_pieces"]) - before
        esize = mine[0].element_size()
        if ran != expected_pieces(counts, esize):
            raise SystemExit(
                f"rank {me}: case {c} rep {rep} ran in {ran} pieces, expected {expected_pieces(counts, esize)} "
                f"(piece {piece_bytes} bytes)"
            )
        exact = opname != "Average"
        for i, got in enumerate(mine):
            expected = reduce_reference([inputs[r][i] for r in range(n)], opname, dtype, pre, post)
            check(f"case {c} member {i} ({counts[i]} elements) rep {rep}", got, expected, exact)
            checked += 1
print(f"OK {checked} pieces={piece_bytes}", flush=True)
hvd.shutdown()
