"""What runs in the executors' Python workers.

``tasks`` holds the picklable functions Spark ships; they call the plain computations of
``step`` on a model replica (``replicas``) and a partition's arrays (``shard_store``), both kept
between tasks in bounded per-worker caches (``worker_cache``, which also keeps PySpark's
per-task garbage collection cheap). Everything here must live in importable modules: module-level
state survives from task to task in a reused worker, while state named by a shipped closure
would be copied into every task.
"""
