"""The Frugal mechanism, free of TorchRec: the step, the gate, owner caches and their update,
optimizers, the gradient exchange, the lookahead window and the flushers."""
