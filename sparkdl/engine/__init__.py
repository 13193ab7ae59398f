"""The driver side: what is trained, and how it is run.

``fit/`` holds the fit (``spec.Fit``: what is trained), its opening on a runner and its end
(``opening``), the lifecycle every fit follows whatever runs it (``lifecycle``: validation,
triggers, best weights, checkpoints), its checks, resume (identity, checkpoints), reports and
optimizer helpers. ``strategies/`` holds how fits meet the data: ``sync`` (one data-parallel job
per iteration, for one fit or a pass) and ``hop`` (model hopping). ``distri_optimizer`` (the
public facade), ``fit_set`` and ``optuna_batches`` are the entry points above both. See
docs/architecture.md.
"""
