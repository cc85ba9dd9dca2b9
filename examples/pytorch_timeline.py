"""Record a timeline of a few training steps and read it back: where does a step's communication time go?

    hvdlite-run -np 2 python examples/pytorch_timeline.py --trace timeline.json
    python -m hvdlite.timeline timeline.json --top 10      # the same summary, later

Trains a small ResNet on generated images. Steps before --record-from warm up (the first steps negotiate every
gradient in full; later ones hit the response cache), then hvd.start_timeline() records --record-steps steps,
with a marker at each background cycle, and hvd.stop_timeline() closes the file. Rank 0 writes it, checks that
it is a well-formed Chrome trace and prints each gradient's negotiation and allreduce time. Open the file in
https://ui.perfetto.dev or chrome://tracing: one row per tensor, a NEGOTIATE_* span from its submission until every
rank has submitted it (so it also shows how far the ranks' backward passes drift apart), then the operation
itself ("ALLREDUCE (fused x4)" when it shared a fusion buffer with three others).
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import MODELS  # noqa: E402

import hvdlite.timeline  # noqa: E402
import hvdlite.torch as hvd  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default="timeline.json", help="where rank 0 writes the Chrome trace")
    parser.add_argument("--model", default="resnet_small", choices=sorted(MODELS))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--record-from", type=int, default=3, help="first step recorded (0-based)")
    parser.add_argument("--record-steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=8, help="tensors shown in the summary")
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(hvd.rank())
    model = MODELS[args.model](num_classes=10)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size()), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    labels = torch.randint(0, 10, (args.batch_size,))
    for step in range(args.record_from + args.record_steps):
        if step == args.record_from:
            hvd.start_timeline(args.trace, mark_cycles=True)  # on ranks other than 0 this records nothing
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
    hvd.stop_timeline()

    if hvd.rank() == 0:
        events = hvdlite.timeline.load(args.trace)
        problems = hvdlite.timeline.check(events)
        if problems:
            raise SystemExit(f"{args.trace} is not a well-formed trace: {problems[:5]}")
        summaries, cycles = hvdlite.timeline.summarize(events)
        print(
            f"recorded steps {args.record_from}..{args.record_from + args.record_steps - 1} "
            f"to {args.trace}: {len(events)} events"
        )
        print(hvdlite.timeline.format_table(summaries, cycles, top=args.top))
        print(f"open {os.path.abspath(args.trace)} in https://ui.perfetto.dev or chrome://tracing")
    hvd.shutdown()


if __name__ == "__main__":
    main()
