"""``python -m torchrec_frugal.estimate``: the cost model's prediction for a configuration (see ``cli``)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
