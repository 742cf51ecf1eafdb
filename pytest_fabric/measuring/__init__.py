"""measuring/: a launch and what it returns: the measurer, the session's shared store, node facts
before a launch, NCCL's evidence of the transport that ran."""
