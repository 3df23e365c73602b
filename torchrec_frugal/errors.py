"""Errors the engine raises; each message names the table, feature, rank or value at fault."""


class FrugalError(RuntimeError):
    """Base class of the engine's runtime failures."""


class FrugalInputError(ValueError):
    """Bad input (id out of range, wrong dtype, lookahead mismatch); nothing was changed."""


class RankLostError(FrugalError):
    """A peer rank died or stopped making progress; the run cannot stay synchronous."""

    def __init__(self, message: str, lost_rank: int) -> None:
        super().__init__(message)
        self.lost_rank = lost_rank
