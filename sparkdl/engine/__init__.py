"""The driver side: the SGD loop and everything around it.

``distri_optimizer`` (the public API) builds a ``run_context`` and runs the ``training_loop``,
which asks an ``IterationRunner`` (the seam, :mod:`sparkdl.runners.interface`) for each
iteration's summed vector, with ``recovery`` from lost data, ``validation``, ``checkpointing``
(resume), ``summary`` records and ``progress`` reporting; ``arguments`` and ``data_checks``
refuse bad input before any cluster work. See docs/architecture.md.
"""
