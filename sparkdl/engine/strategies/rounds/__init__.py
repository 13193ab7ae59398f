"""Local rounds: H iterations per Spark job, each partition's own optimizer, one exchange per
round (:mod:`.strategy`, :mod:`.jobs`, :mod:`.schedule`)."""
