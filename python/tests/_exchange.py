"""Shared by the CPU tests of one process per rank: an all_gather that records its calls, so a
test can assert that bad arguments are rejected before the peers are ever called."""


class Gather:
    """An all_gather of a world of 2 that records its calls (the exchange of one process per
    rank); it answers with this process's bytes twice."""

    def __init__(self):
        self.calls = 0

    def __call__(self, mine):
        self.calls += 1
        return [mine, mine]
