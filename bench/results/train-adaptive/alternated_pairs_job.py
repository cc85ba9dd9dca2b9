import os, sys, time
sys.path.insert(0, "bench"); sys.path.insert(0, "examples")
import torch, torch.nn.functional as F
torch.set_num_threads(1)
from train import build
import hvdlite.torch as hvd
hvd.init()
model, data, target = build()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
for i in range(int(os.environ.get("STEPS", "12"))):
    t = time.time()
    opt.zero_grad(); F.cross_entropy(model(data), target).backward(); opt.step()
    if hvd.rank() == 0: print("step", i, round(time.time() - t, 3), flush=True)
if hvd.rank() == 0:
    print(";".join(f for f in hvd.build_info().split(";") if f.startswith(("adaptive", "allreduce_alg"))), flush=True)
sizes = {}
for n, p in model.named_parameters():
    b = p.numel() * 4
    k = "<256K" if b < 256 << 10 else "<2M" if b < 2 << 20 else "<8M" if b < 8 << 20 else ">=8M"
    sizes[k] = sizes.get(k, 0) + 1
if hvd.rank() == 0: print(sizes)
hvd.shutdown()
