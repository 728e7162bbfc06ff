"""The training job (`embtrain run`)."""

from embtrain.train.job import RunOptions, TrainJob
from embtrain.train.summary import RunSummary

__all__ = ["RunOptions", "RunSummary", "TrainJob"]
