"""mmengine glue around the loop: the runners, the log processor and scalar backends, the
hooks (curves, export, run health) and the few non-public parts of mmengine they use."""
