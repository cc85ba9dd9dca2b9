"""Process launching and rendezvous for hvdlite jobs: ``hvdlite-run`` (launch.py). Code outside the launcher uses
only :mod:`hvdlite.runner.api`, its public module."""
