"""A Ray driver that runs tests/jobs/lifeline_job.py's endless allreduce on 2 workers, for the test to kill it with
SIGKILL. argv: the cluster's address, this node's address, the folder where each worker writes its pid."""

import os
import sys

import ray

from hvdlite.ray import RayExecutor

jobs_dir = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, jobs_dir)
ray.init(
    address=sys.argv[1],
    _node_ip_address=sys.argv[2],
    log_to_driver=False,
    runtime_env={"env_vars": {"PYTHONPATH": jobs_dir}},
)
import lifeline_job  # noqa: E402 (found through the path above)

executor = RayExecutor(RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=20), num_workers=2)
executor.start()
executor.run(lifeline_job.run_forever, args=[sys.argv[3]])
