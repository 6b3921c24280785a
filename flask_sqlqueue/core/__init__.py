"""The queue itself: storage, claiming, lifecycle and the worker. Knows nothing of Flask."""
