"""The Spark ML layer: ``estimators`` (NNEstimator, NNClassifier and their models, thin classes
over the engine), their ``params`` and validation, ``persistence`` (MLWritable / MLReadable) and
``inference`` (the Arrow UDF behind ``transform``), and MLflow: ``mlflow_runs`` (which run a fit
logs to) and ``mlflow_models`` (fitted models in MLflow).
"""
