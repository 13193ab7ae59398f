"""The Spark ML layer: ``estimators`` (NNEstimator, NNClassifier and their models, thin classes
over the engine), their ``params`` and validation, ``persistence`` (MLWritable / MLReadable) and
``inference`` (the Arrow UDF behind ``transform``).
"""
