"""The faiss side of a case bank: an index built from a factory string, over unit vectors.

Positions are faiss labels: the case stored at position ``p`` of the SQLite table is
vector ``p`` of the index (cases are never deleted, so positions are dense). Indexes
that need training (IVF, PQ, SQ) are trained once the bank holds enough vectors; until
then searches are exact. On a machine with faiss-gpu and a GPU, the index is mirrored on
the GPU for search; the CPU copy stays the one that is saved. :func:`use_gpu_for` tells the
loop and the selector whether their run's device puts the index there.
"""

from __future__ import annotations

import logging
import re
from importlib import metadata

import faiss
import numpy as np

from memento.config import MAX_DIM, IndexConfig, factory_problem
from memento.errors import BankError, ConfigError
from memento.types import shown

__all__ = ["FaissIndex", "exact_topk", "faiss_distributions", "gpu_available", "use_gpu_for"]

logger = logging.getLogger(__name__)


def gpu_available() -> bool:
    """True when this faiss build has GPU support and sees at least one GPU."""
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


_FAISS_DISTRIBUTIONS = ("faiss-cpu", "faiss-gpu", "faiss-gpu-cu11", "faiss-gpu-cu12")


def faiss_distributions() -> dict[str, str]:
    """The installed distributions that ship the ``faiss`` module, name -> version (one, in a sound install)."""
    found = {}
    for name in _FAISS_DISTRIBUTIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def use_gpu_for(device: object) -> bool:
    """Whether a bank searched for a run on ``device`` mirrors its faiss index on the GPU.

    True when ``device`` is a CUDA device (``"cuda"``, ``"cuda:1"``, a ``torch.device``) and this faiss build
    has GPU support and sees a GPU. When CUDA was asked for and faiss cannot use it, one warning says why and
    the index stays on the CPU (searches give the same cases, only slower).
    """
    kind = getattr(device, "type", None) or str(device).split(":", 1)[0]
    if kind != "cuda":
        return False
    if gpu_available():
        return True
    builds = faiss_distributions()
    installed = ", ".join(f"{name} {version}" for name, version in builds.items()) or "no faiss distribution"
    if len(builds) > 1:
        why = f"{installed} are installed together and each ships the faiss module"
    elif hasattr(faiss, "StandardGpuResources"):
        why = f"{installed} sees no GPU"
    else:
        why = f"{installed} has no GPU support"
    logger.warning("device %s: the case bank's faiss index stays on the CPU: %s (GPU faiss: make install-gpu, "
                   "see docs/install.md)", device, why)
    return False


def exact_topk(vectors_ND: np.ndarray, query_BD: np.ndarray, k: int,
               positions_N: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top-k by brute force: ``(scores_BK, positions_BK)``, -1 padded."""
    n = vectors_ND.shape[0]
    b = query_BD.shape[0]
    scores_BK = np.full((b, k), -np.inf, dtype=np.float32)
    labels_BK = np.full((b, k), -1, dtype=np.int64)
    if n == 0:
        return scores_BK, labels_BK
    sims_BN = query_BD @ vectors_ND.T
    kk = min(k, n)
    top_BK = np.argpartition(-sims_BN, kk - 1, axis=1)[:, :kk] if kk < n else np.tile(np.arange(n), (b, 1))
    top_scores = np.take_along_axis(sims_BN, top_BK, axis=1)
    order = np.argsort(-top_scores, axis=1, kind="stable")
    top_BK = np.take_along_axis(top_BK, order, axis=1)
    scores_BK[:, :kk] = np.take_along_axis(top_scores, order, axis=1)
    labels_BK[:, :kk] = top_BK if positions_N is None else positions_N[top_BK]
    return scores_BK, labels_BK


def _faiss_reason(error: BaseException) -> str:
    """A faiss exception as a short reason: its last line (faiss prefixes the C++ location), at most 160 chars;
    ``bad_alloc`` / MemoryError read as 'out of memory'."""
    if isinstance(error, MemoryError) or "bad_alloc" in str(error):
        return "out of memory"
    lines = str(error).strip().splitlines() or [type(error).__name__]
    text = re.sub(r"^Error in .*? at \S+:\d+: (Error: )?", "", lines[-1].strip())  # the C++ location
    return text if len(text) <= 160 else text[:157] + "..."


def _centroids(index: faiss.Index) -> int:
    """The centroids of the largest quantizer ``index`` trains: its IVF lists or its product quantizer's codes
    (``2 ** nbits`` per sub-quantizer); 0 for an index with neither (HNSW, Flat, SQ)."""
    ivf = faiss.try_extract_index_ivf(index)
    inner = faiss.downcast_index(ivf if ivf is not None else index)
    while isinstance(inner, faiss.IndexPreTransform):
        inner = faiss.downcast_index(inner.index)
    pq = getattr(inner, "pq", None)
    return max(int(ivf.nlist) if ivf is not None else 0, 1 << int(pq.nbits) if pq is not None else 0)


class FaissIndex:
    """A faiss index over bank positions ``0..ntotal-1`` with inner-product metric."""

    def __init__(self, config: IndexConfig, dim: int, *, use_gpu: bool = False):
        self.config = config
        self.dim = dim
        if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= MAX_DIM:
            raise ConfigError(f"faiss index dim={shown(dim, 40)}: must be an integer in 1..{MAX_DIM}")
        problem = factory_problem(config.factory)  # an IndexConfig is checked; one built around it may not be
        if problem is not None:
            raise ConfigError(f"IndexConfig.factory={str(config.factory)[:80]!r}: {problem}")
        try:
            self.index = faiss.index_factory(dim, config.factory, faiss.METRIC_INNER_PRODUCT)
        except (RuntimeError, MemoryError, ValueError, TypeError) as error:
            raise ConfigError(f"IndexConfig.factory={config.factory!r}: faiss cannot build it over dim={dim} "
                              f"({_faiss_reason(error)})") from None
        self._apply_search_knobs()
        self._use_gpu = use_gpu and gpu_available()
        self._gpu_index: faiss.Index | None = None
        # faiss warns below 39 training points per centroid (IVF lists, PQ codes); below that, searches stay exact
        centroids = _centroids(self.index)
        self.min_train = 39 * centroids if centroids else 10_000

    @classmethod
    def from_faiss(cls, index: faiss.Index, config: IndexConfig, *, use_gpu: bool = False) -> FaissIndex:
        self = cls(config, index.d, use_gpu=use_gpu)
        self.index = index
        self._apply_search_knobs()
        return self

    def _apply_search_knobs(self) -> None:
        space = faiss.ParameterSpace()
        for name, value in (("efSearch", self.config.ef_search), ("nprobe", self.config.nprobe)):
            try:
                space.set_index_parameter(self.index, name, value)
            except RuntimeError:
                pass  # the index has no such knob

    def set_search_params(self, config: IndexConfig) -> None:
        """Apply new search-time knobs (``ef_search``, ``nprobe``) of the same factory."""
        self.config = config
        self._apply_search_knobs()
        self._gpu_index = None

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    @property
    def is_trained(self) -> bool:
        return bool(self.index.is_trained)

    def train_sample(self, n: int, rng: np.random.Generator) -> np.ndarray | None:
        """The sorted positions of ``n`` vectors that :meth:`train` uses (at most 64 points per centroid of its
        largest quantizer, IVF lists or PQ codes; 100,000 otherwise), or None for all of them."""
        centroids = _centroids(self.index)
        cap = 64 * centroids if centroids else 100_000
        return np.sort(rng.choice(n, size=cap, replace=False)) if n > cap else None

    def train(self, vectors_ND: np.ndarray, rng: np.random.Generator) -> None:
        """Train on (a sample of) ``vectors_ND`` (:meth:`train_sample`)."""
        positions = self.train_sample(len(vectors_ND), rng)
        sample = vectors_ND if positions is None else vectors_ND[positions]
        logger.info("training faiss index %s on %d vectors", self.config.factory, len(sample))
        try:
            self.index.train(np.ascontiguousarray(sample, dtype=np.float32))
        except (RuntimeError, MemoryError) as error:
            raise BankError(f"faiss index {self.config.factory!r}: training on {len(sample)} vectors failed "
                            f"({_faiss_reason(error)})") from None
        self._gpu_index = None

    def add(self, vectors_ND: np.ndarray) -> None:
        if not self.is_trained:
            raise BankError(f"faiss index {self.config.factory!r} is not trained yet")
        vectors_ND = np.ascontiguousarray(vectors_ND, dtype=np.float32)
        try:
            self.index.add(vectors_ND)
        except (RuntimeError, MemoryError) as error:
            raise BankError(f"faiss index {self.config.factory!r}: adding {len(vectors_ND)} vectors failed "
                            f"({_faiss_reason(error)})") from None
        if self._gpu_index is not None:
            self._gpu_index.add(vectors_ND)

    def truncate(self, n: int) -> bool:
        """Remove positions ``n..ntotal-1``, keeping what the index was trained on (IVF, PQ, Flat); False when
        this index cannot remove vectors (HNSW), which is then rebuilt by its owner."""
        if n >= self.ntotal:
            return True
        try:
            self.index.remove_ids(faiss.IDSelectorRange(n, self.ntotal))
        except RuntimeError:
            return False
        self._gpu_index = None
        return self.ntotal == n

    def _searcher(self) -> faiss.Index:
        if not self._use_gpu:
            return self.index
        if self._gpu_index is None:
            try:
                self._gpu_index = faiss.index_cpu_to_all_gpus(self.index)
            except RuntimeError as error:  # e.g. HNSW has no GPU version
                logger.info("faiss index %s stays on the CPU: %s", self.config.factory, error)
                self._use_gpu = False
                return self.index
        return self._gpu_index

    def search(self, query_BD: np.ndarray, k: int,
               allowed_N: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray] | None:
        """``(scores_BK, positions_BK)`` with -1 padding, or None if this index cannot filter.

        ``allowed_N`` is a boolean mask over positions; only those are returned.
        """
        query_BD = np.ascontiguousarray(query_BD, dtype=np.float32)
        if allowed_N is None:
            scores, labels = self._searcher().search(query_BD, k)
            return scores, labels
        if self._use_gpu:
            return None  # faiss GPU indexes take no ID selectors
        bitmap = np.packbits(allowed_N.astype(bool), bitorder="little")
        selector = faiss.IDSelectorBitmap(len(allowed_N), faiss.swig_ptr(bitmap))
        inner = faiss.downcast_index(self.index)
        if isinstance(inner, faiss.IndexHNSW):
            params: faiss.SearchParameters = faiss.SearchParametersHNSW(sel=selector, efSearch=self.config.ef_search)
        elif isinstance(inner, faiss.IndexIVF):
            params = faiss.SearchParametersIVF(sel=selector, nprobe=self.config.nprobe)
        else:
            params = faiss.SearchParameters(sel=selector)
        try:
            scores, labels = self.index.search(query_BD, k, params=params)
        except RuntimeError:
            return None  # wrappers such as IndexPreTransform refuse search parameters
        del bitmap  # the selector points into it until here
        return scores, labels

    def write(self, path: str) -> None:
        faiss.write_index(self.index, path)

    @staticmethod
    def read(path: str) -> faiss.Index:
        return faiss.read_index(path)
