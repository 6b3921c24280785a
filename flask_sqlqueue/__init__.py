"""flask_sqlqueue: a durable background-job queue that lives in your app's database."""

from __future__ import annotations

from .core.batches import Batch as Batch
from .core.context import current_job as current_job
from .core.features.uniqueness import Unique as Unique
from .core.jobs import Job as Job
from .core.models import JobStatus as JobStatus
from .core.options import Call as Call
from .core.tasks import BoundTask as BoundTask
from .core.tasks import Step as Step
from .core.tasks import Task as Task
from .core.worker import Worker as Worker
from .core.worker import WorkerOptions as WorkerOptions
from .exceptions import ClaimLost as ClaimLost
from .exceptions import ConfigurationError as ConfigurationError
from .exceptions import DatabaseFileChanged as DatabaseFileChanged
from .exceptions import DuplicateTask as DuplicateTask
from .exceptions import JobCancelled as JobCancelled
from .exceptions import PayloadError as PayloadError
from .exceptions import PayloadTooLarge as PayloadTooLarge
from .exceptions import PermanentFailure as PermanentFailure
from .exceptions import QueueNotSetUp as QueueNotSetUp
from .exceptions import QueueUnavailable as QueueUnavailable
from .exceptions import ResultTooLarge as ResultTooLarge
from .exceptions import Retry as Retry
from .exceptions import SchemaError as SchemaError
from .exceptions import Snooze as Snooze
from .exceptions import SQLQueueError as SQLQueueError
from .exceptions import UnknownQueue as UnknownQueue
from .exceptions import UnknownSchedule as UnknownSchedule
from .exceptions import UnknownTask as UnknownTask
from .facade import SQLQueue as SQLQueue

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "BoundTask",
    "Call",
    "ClaimLost",
    "ConfigurationError",
    "DatabaseFileChanged",
    "DuplicateTask",
    "Job",
    "JobCancelled",
    "JobStatus",
    "PayloadError",
    "PayloadTooLarge",
    "PermanentFailure",
    "QueueNotSetUp",
    "QueueUnavailable",
    "ResultTooLarge",
    "Retry",
    "SQLQueue",
    "SQLQueueError",
    "SchemaError",
    "Snooze",
    "Step",
    "Task",
    "Unique",
    "UnknownQueue",
    "UnknownSchedule",
    "UnknownTask",
    "Worker",
    "WorkerOptions",
    "current_job",
]
