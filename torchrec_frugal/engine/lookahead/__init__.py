"""The lookahead window: each owned row's next host read over the steps the loader has read ahead."""
