"""Files the driver writes through Spark's Hadoop FileSystem: whole-file reads and writes
(``hadoop_files``) and the checkpoint directory (``checkpoint_store``).
"""
