"""Process launching and rendezvous for hvdlite jobs."""
