"""A Ray driver's start, shared by the Ray jobs of tests/test_ray.py: it joins the test's cluster (argv[1]: its
address, argv[2]: this node's address) and gives the executor settings the jobs use."""

import sys

import ray

from hvdlite.ray import RayExecutor, WorkerError  # noqa: F401 (the jobs take them from here)

ray.init(address=sys.argv[1], _node_ip_address=sys.argv[2], log_to_driver=False)
SETTINGS = RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=20)
