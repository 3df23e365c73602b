"""Will it pay: the cost model, hardware profiles, calibration and ``python -m torchrec_frugal.estimate``."""
