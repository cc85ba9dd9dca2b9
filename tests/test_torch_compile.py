"""hvdlite under torch.compile across real processes (tests/jobs/compiled.py): collectives inside compiled
functions are single graph nodes with eager mode's results and gradients, and a compiled model (aot_eager,
inductor) trains through DistributedOptimizer to one eager process's weights on the global batch."""

import pytest
from multiproc import run_job_module


@pytest.mark.timeout(400)
@pytest.mark.parametrize("np", [2, 3])
def test_collectives_compile_without_graph_breaks_and_a_compiled_model_trains(np):
    run_job_module("compiled.py", np=np, timeout=360)
