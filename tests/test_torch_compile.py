"""hvdlite under torch.compile across real processes (tests/jobs/compiled.py): collectives inside compiled
functions are single graph nodes with eager mode's results and gradients, and a compiled model (aot_eager,
inductor) trains through DistributedOptimizer to one eager process's weights on the global batch."""

import pytest
from multiproc import run_job_module


@pytest.mark.timeout(400)
def test_collectives_compile_without_graph_breaks_and_a_compiled_model_trains():
    # Two ranks: what compiling adds does not depend on their number (the ranks' allgathered rows already differ,
    # the broadcast's root is not rank 0). Three or more run the same collectives eagerly in test_collectives.
    run_job_module("compiled.py", np=2, timeout=360)
