"""The frugal sharding types, as TorchRec's ``distributed/sharding/`` holds its own."""
