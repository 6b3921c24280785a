"""The feature slices: one optional behaviour of jobs each, below the statements that use them.

Tags, uniqueness, big payloads, versioned tasks, dependencies, limits, the audit log,
retention and typed arguments: each module here imports only the models, ``payload`` and
the standard-library leaves (``exceptions``, ``config``, ``bounds``), never another
feature nor anything else of the core, so that a feature can be read, tested and changed
on its own. The producing path, the claim, the transitions and the operations call them;
the store itself imports none (the contracts ``features-are-leaves``,
``features-are-independent`` and ``store-imports-no-feature`` in pyproject.toml).
"""
