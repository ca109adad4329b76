"""The in-memory dataset, binarisation and minibatches.

Binarisation (``data.binarize``):
- ``fixed``: one stochastic draw per image with a fixed seed (the Salakhutdinov & Murray 2008 protocol
  behind the NVIL, Trans-SAP and Chib papers' numbers);
- ``dynamic``: the training images are redrawn for every minibatch; validation and test use the fixed
  draw, so evaluation numbers stay comparable;
- ``threshold``: pixel > 0.5, for quick experiments.

Splits may be sparse COO tensors (bag-of-words documents, see ``nvil.data.bow``); ``take_rows`` (kept in the
kernel, ``nvil.core.ops``, so models and estimators reach it without the data layer) is the one way code reads rows of
a split.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nvil.core.errors import ConfigError, DataError
from nvil.data.values import check_values

SPLITS = ("train", "valid", "test")
BINARIZATIONS = ("fixed", "dynamic", "threshold")


def binarize(x: torch.Tensor, mode: str, seed: int) -> torch.Tensor:
    """Binary images from grey levels: one seeded Bernoulli draw (``fixed``/``dynamic``) or a threshold.

    Parameters
    ----------
    x : torch.Tensor
        Grey levels in [0, 1], any shape (on the CPU for the seeded draw).
    mode : str
        ``threshold``: pixel > 0.5; anything else (``fixed``, ``dynamic``): each pixel drawn as Bernoulli(x) with a
        generator seeded by ``seed``.
    seed : int
        Seed of the draw (unused by ``threshold``).

    Returns
    -------
    torch.Tensor
        Float32 zeros and ones, shaped like ``x``.

    Examples
    --------
    >>> import torch
    >>> from nvil.data import binarize
    >>> grey = torch.tensor([[0.2, 0.7, 0.5]])
    >>> binarize(grey, "threshold", 0)
    tensor([[0., 1., 0.]])
    >>> torch.equal(binarize(grey, "fixed", 3), binarize(grey, "fixed", 3))
    True
    """
    if mode == "threshold":
        return (x > 0.5).float()
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.rand(x.shape, generator=g) < x).float()


@dataclass
class Dataset:
    """All splits in memory on one device, plus what the loop and estimators need to know.

    Every split's values are checked once, when the dataset is created (``nvil.data.values``). Build one with a
    builder (``mnist_data``, ``synthetic_data``, ...) or ``build_dataset``, or directly from tensors.

    Parameters
    ----------
    name : str
        The dataset's name (``data.name``), used in messages.
    splits : dict of str to torch.Tensor
        ``train``, ``valid`` and ``test``: ``[n, dim]`` rows, binary (or, for dynamic training data, grey-level),
        word counts (possibly sparse COO) or real values.
    labels : dict of str to torch.Tensor or None
        Each split's class labels ``[n]``, or None.
    binarize : str
        How the values were made: ``fixed``, ``dynamic`` or ``threshold`` (binary images), ``counts`` (word counts)
        or ``continuous`` (real values).
    seed : int
        The data's seed (the fixed draw of dynamic training data).
    image_shape : tuple of int or None, default None
        (channels, height, width) of an image dataset, for image grids; None otherwise.

    Raises
    ------
    DataError
        If a split holds NaN, infinity or a value its kind of data may not hold, in one line naming the split, row
        and column.

    Examples
    --------
    >>> import torch
    >>> from nvil.data import Dataset
    >>> x = torch.tensor([[0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    >>> data = Dataset("toy", {"train": x, "valid": x[:1], "test": x[1:]}, dict.fromkeys(["train", "valid", "test"]),
    ...                "fixed", 0)
    >>> data.dim, data.split("test").shape, data.train_mean()
    (2, torch.Size([3, 2]), tensor([0.5000, 0.5000]))
    >>> Dataset("bad", {"train": torch.tensor([[2.0, 0.0]])}, {}, "fixed", 0)
    Traceback (most recent call last):
    ...
    nvil.core.errors.DataError: data=bad's train split has the value 2 at row 0, column 0 (counting from 0); ...
    """

    name: str
    splits: dict[str, torch.Tensor]  # binary (or, for dynamic training data, grey-level) [n, dim]
    labels: dict[str, torch.Tensor | None]
    binarize: str
    seed: int
    image_shape: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        """Every split's values are checked once, here (``nvil.data.values``): NaN, infinity or a value its kind of
        data may not hold is a one-line ``DataError`` naming the split, row and column."""
        for split, x in self.splits.items():
            check_values(f"data={self.name}'s {split} split", x, self.binarize)

    @property
    def dim(self) -> int:
        """The number of columns of a row (visible units, words, or values of a sequence)."""
        return self.splits["train"].shape[1]

    def split(self, name: str) -> torch.Tensor:
        """Binary data of one split; dynamic training data is returned with its fixed draw.

        Parameters
        ----------
        name : str
            ``train``, ``valid`` or ``test`` (``data.split``).

        Returns
        -------
        torch.Tensor
            The split's rows ``[n, dim]`` (sparse COO for a large bag-of-words split).

        Raises
        ------
        ConfigError
            If the dataset has no split ``name``.
        """
        if name not in self.splits:
            raise ConfigError(f"data.split must be one of {list(self.splits)}, got {name!r}")
        x = self.splits[name]
        if name == "train" and self.binarize == "dynamic":
            return binarize(x.cpu(), "fixed", self.seed).to(x.device)
        return x

    def rows_to_evaluate(self, x: torch.Tensor, split: str, num_examples: int | None) -> int:
        """How many rows of ``x`` an evaluation takes: all of them, or the first ``eval.num_examples``.

        ``x`` is the split ``split``, or the subset of it picked by ``eval.per_class``; asking for more than there
        are is an error, never quietly fewer.

        Parameters
        ----------
        x : torch.Tensor
            The rows available ``[n, dim]``.
        split : str
            The split they come from (for the message).
        num_examples : int or None
            ``eval.num_examples``; None: all of them.

        Returns
        -------
        int
            The number of rows to evaluate.

        Raises
        ------
        ConfigError
            If ``num_examples`` exceeds the rows available.
        """
        available = x.shape[0]
        if num_examples is None or num_examples <= available:
            return available if num_examples is None else num_examples
        whole = self.splits[split].shape[0]
        what = (f"the {split} split has {available} examples" if available == whole else
                f"only {available} of the {split} split's {whole} examples are selected (eval.per_class)")
        raise ConfigError(f"eval.num_examples={num_examples} but {what}; ask for at most {available}, or "
                          "eval.num_examples=null for all of them")

    def train_mean(self) -> torch.Tensor:
        """Mean of the training images (or word counts): the output-bias init and the inference network's centring.

        Returns
        -------
        torch.Tensor
            ``[dim]``, dense (also for a sparse training split).
        """
        x = self.splits["train"]
        if x.is_sparse:
            return torch.sparse.sum(x, 0).to_dense() / x.shape[0]
        return x.mean(0)

    def with_one_hot_labels(self, n_labels: int = 10) -> "Dataset":
        """Append one-hot labels to every split's rows, for models with label units (in place).

        Parameters
        ----------
        n_labels : int, default 10
            The number of classes: each row gains that many columns.

        Returns
        -------
        Dataset
            The dataset itself, each split ``[n, dim + n_labels]``.

        Raises
        ------
        DataError
            If a split has no labels.
        """
        missing = [s for s in SPLITS if self.labels.get(s) is None]
        if missing:
            raise DataError(f"model.labels=true needs labelled data, but data={self.name} has no labels")
        for s in SPLITS:
            y = torch.nn.functional.one_hot(self.labels[s].long(), n_labels).to(self.splits[s])
            self.splits[s] = torch.cat([self.splits[s], y], -1)
        return self

    def to(self, device: torch.device) -> "Dataset":
        """Every split moved to ``device`` (in place).

        Parameters
        ----------
        device : torch.device
            Where the splits go.

        Returns
        -------
        Dataset
            The dataset itself.
        """
        self.splits = {k: v.to(device) for k, v in self.splits.items()}
        return self


class MinibatchStream:
    """Minibatch t of a run, as a pure function of (seed, t): resuming at step t needs no saved state.

    Each epoch is a fresh permutation (seeded by seed and epoch); the last partial batch is dropped.
    With dynamic binarisation each batch is redrawn with a generator seeded by (seed, t).

    Parameters
    ----------
    data : Dataset
        The dataset whose training split is streamed.
    batch_size : int
        Rows per minibatch (``trainer.batch_size``).
    seed : int
        The run's seed: the permutations and the dynamic draws.

    Raises
    ------
    ConfigError
        If ``batch_size`` exceeds the training examples.

    Examples
    --------
    >>> import torch
    >>> from nvil.data import MinibatchStream, synthetic_data
    >>> data = synthetic_data(num_train=10, num_valid=2, num_test=2)
    >>> stream = MinibatchStream(data, batch_size=4, seed=0)
    >>> stream.batches_per_epoch, stream.batch(0).shape
    (2, torch.Size([4, 12]))
    >>> torch.equal(stream.batch(3), MinibatchStream(data, 4, 0).batch(3))     # a function of (seed, step) alone
    True
    """

    def __init__(self, data: Dataset, batch_size: int, seed: int) -> None:
        n = data.splits["train"].shape[0]
        if batch_size > n:
            raise ConfigError(f"trainer.batch_size={batch_size} exceeds the {n} training examples")
        self.x = data.splits["train"]
        self.dynamic = data.binarize == "dynamic"
        self.batch_size = batch_size
        self.seed = seed
        self.batches_per_epoch = n // batch_size
        self._epoch = -1
        self._perm: torch.Tensor | None = None
        self._gen = torch.Generator(device=self.x.device)

    def indices(self, step: int) -> torch.Tensor:
        """The training rows of minibatch ``step`` (learners with per-example state, e.g. MCEM's chains).

        Parameters
        ----------
        step : int
            The run's step t (0-based).

        Returns
        -------
        torch.Tensor
            ``[batch_size]`` int64 row indices into the training split.
        """
        epoch, i = divmod(step, self.batches_per_epoch)
        if epoch != self._epoch:
            g = torch.Generator(device="cpu").manual_seed(self.seed * 1_000_003 + epoch)
            self._perm = torch.randperm(self.x.shape[0], generator=g).to(self.x.device)
            self._epoch = epoch
        return self._perm[i * self.batch_size : (i + 1) * self.batch_size]

    def batch(self, step: int) -> torch.Tensor:
        """The rows of minibatch ``step``: dense, and with dynamic binarisation redrawn for this step.

        Parameters
        ----------
        step : int
            The run's step t (0-based).

        Returns
        -------
        torch.Tensor
            ``[batch_size, dim]``.
        """
        idx = self.indices(step)
        x = self.x.index_select(0, idx)  # not self.x[idx]: advanced indexing costs more per small batch
        if x.is_sparse:
            x = x.to_dense()
        if self.dynamic:
            self._gen.manual_seed(self.seed * 7_919 + step + 1)
            x = (torch.rand(x.shape, generator=self._gen, device=x.device) < x).float()
        return x


def check_model_fits_data(model, data: Dataset) -> None:
    """Word counts need a multinomial visible layer, binary data a Bernoulli one, real-valued data a Gaussian one."""
    counts = data.binarize == "counts"
    visible = getattr(model, "visible", "bernoulli")
    if data.binarize == "continuous" and visible != "gaussian":
        raise ConfigError(f"data={data.name} is real-valued: use model.visible=gaussian")
    if counts and visible != "multinomial":
        raise ConfigError(f"data={data.name} holds word counts: use model.visible=multinomial")
    if not counts and visible == "multinomial":
        raise ConfigError(f"model.visible=multinomial needs word counts (data=bow or synthetic_bow), not data={data.name}")
