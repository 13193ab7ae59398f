"""Training data on its way to arrays, used on the driver and in the executors alike: which
samples every global batch takes from every partition (``batch_plan``), records to arrays
(``records``), and DataFrames through Arrow (``dataframe_arrays``).
"""
