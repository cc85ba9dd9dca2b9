import faulthandler, sys, os
faulthandler.enable()
step = sys.argv[1]
def say(*a): print("DIAG", step, *a, flush=True)
if step == "cpu":
    import hvdlite
    from hvdlite.common import ops
    import hvdlite.torch as hvd
    say("imported without torch cuda use")
    hvd.init(); say("init ok", hvd.size())
    import torch
    say("cpu allreduce", hvd.allreduce(torch.ones(3), op=hvd.Sum).tolist())
    say("build", hvd.build_info()[:300])
    hvd.shutdown(); say("shutdown ok")
else:
    import torch
    torch.cuda.set_device(0); x = torch.ones(4, device="cuda"); torch.cuda.synchronize(); say("torch cuda ok")
    import hvdlite.torch as hvd
    hvd.init(); say("init ok")
    say("nccl_built", hvd.nccl_built())
    say("cpu allreduce", hvd.allreduce(torch.ones(3), op=hvd.Sum).tolist())
    say("cuda allreduce", hvd.allreduce(x, op=hvd.Sum, name="x").tolist())
    hvd.shutdown(); say("shutdown ok")
