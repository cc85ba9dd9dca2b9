"""Framework-independent Python layer: the binding to the core, errors, bootstrap, process sets."""
