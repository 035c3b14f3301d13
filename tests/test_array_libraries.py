"""Array-API-generic libraries on engine arrays: array-api-compat (and the copies scikit-learn
and SciPy vendor), array-api-extra, scikit-learn (``array_api_dispatch=True``) and SciPy
(``SCIPY_ARRAY_API=1``), and what they read of an array: ``x.shape`` of a data-dependent
dimension, ``str(x)``, ``repr(x)``.

Each library function is called on NumPy arrays and on ``aioengine.array_api`` arrays of the
same values: the results must agree, and where NumPy's is an array the engine's must be an
engine array. Functions that do not run on engine arrays for a reason outside aioengine are
left out: SciPy functions that convert their input to NumPy (``scipy.linalg``,
``scipy.spatial.distance``, ``integrate.simpson``, ``signal.periodogram``) return NumPy arrays,
and those that call NumPy functions the namespace does not implement (``signal.lfilter``:
``np.atleast_1d``; ``signal.welch``: ``np.iscomplexobj``) raise TypeError naming them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import array_api_compat
import array_api_extra as xpx
import numpy as np
import pytest
import scipy
import scipy.cluster.hierarchy
import scipy.cluster.vq
import scipy.fft
import scipy.integrate
import scipy.ndimage
import scipy.signal
import scipy.special
import scipy.stats
import sklearn
from scipy._lib import array_api_compat as scipy_compat
from scipy._lib._array_api import SCIPY_ARRAY_API
from sklearn import metrics
from sklearn.decomposition import PCA
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
from sklearn.externals import array_api_compat as sklearn_compat
from sklearn.kernel_approximation import Nystroem
from sklearn.linear_model import LogisticRegression, Ridge, RidgeClassifier, RidgeCV
from sklearn.metrics import pairwise
from sklearn.mixture import GaussianMixture
from sklearn.naive_bayes import GaussianNB
from sklearn.preprocessing import (
    KernelCenterer,
    LabelBinarizer,
    LabelEncoder,
    MaxAbsScaler,
    MinMaxScaler,
    Normalizer,
    PolynomialFeatures,
    StandardScaler,
)

import aioengine as ae
import aioengine.array as aa
import aioengine.array_api as xp

if not SCIPY_ARRAY_API:  # pragma: no cover - SciPy imported before conftest.py set it
    raise RuntimeError(
        "SciPy was imported without SCIPY_ARRAY_API=1 (tests/conftest.py sets it): its "
        "array API support is off, and these tests would test NumPy's paths"
    )


@pytest.fixture
def dispatch() -> Iterator[None]:
    """scikit-learn's array API dispatch, on for the test."""
    with sklearn.config_context(array_api_dispatch=True):
        yield


class Data:
    """The inputs of a case: NumPy arrays (``as_numpy``) or engine arrays of the same values."""

    def __init__(self, convert: Callable[[np.ndarray[Any, Any]], Any], ns: Any) -> None:
        rng = np.random.default_rng(0)
        X = rng.standard_normal((60, 4))
        self.xp = ns
        self.X = convert(X)
        self.y_class = convert((X[:, 0] + 0.3 * rng.standard_normal(60) > 0).astype(np.int64))
        self.y_reg = convert(X @ np.array([1.0, 2.0, -1.0, 0.5]) + 0.1 * rng.standard_normal(60))
        self.y_three = convert(np.digitize(X[:, 1], [-0.5, 0.5]).astype(np.int64))
        self.proba = convert(1 / (1 + np.exp(-X[:, 0])))
        self.a = convert(rng.standard_normal(50))
        self.b = convert(rng.standard_normal(50))
        self.p = convert(rng.uniform(0.1, 0.9, 50))
        self.M = convert(rng.standard_normal((8, 8)))
        self.image = convert(rng.standard_normal((16, 16)))
        self.positive = convert(np.abs(X))


def _numpy() -> Data:
    return Data(np.asarray, np)


def _engine() -> Data:
    return Data(xp.asarray, xp.default_namespace())


def _check(got: Any, want: Any) -> None:
    """``got`` (from engine arrays) is NumPy's ``want``: an engine array where that is an
    array, with the same values."""
    if isinstance(want, np.ndarray) and want.ndim > 0:
        assert isinstance(got, aa.Array), f"{type(got).__name__}, not an engine array"
        assert got.shape == want.shape
        assert got.dtype == want.dtype
    elif isinstance(got, aa.Array):
        assert got.ndim == 0 or got.shape == np.shape(want)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10, atol=1e-12)


# -- scikit-learn ---------------------------------------------------------------------------

SKLEARN: dict[str, Callable[[Data], Any]] = {
    "LinearDiscriminantAnalysis.predict": lambda d: (
        LinearDiscriminantAnalysis().fit(d.X, d.y_class).predict(d.X)
    ),
    "LinearDiscriminantAnalysis.predict_proba": lambda d: (
        LinearDiscriminantAnalysis().fit(d.X, d.y_class).predict_proba(d.X)
    ),
    "PCA(svd_solver='full')": lambda d: PCA(n_components=2, svd_solver="full").fit_transform(d.X),
    "Ridge(solver='svd')": lambda d: Ridge(solver="svd").fit(d.X, d.y_reg).predict(d.X),
    "RidgeCV": lambda d: RidgeCV().fit(d.X, d.y_reg).predict(d.X),
    "RidgeClassifier(solver='svd')": lambda d: (
        RidgeClassifier(solver="svd").fit(d.X, d.y_three).predict(d.X)
    ),
    "LogisticRegression": lambda d: LogisticRegression().fit(d.X, d.y_class).predict_proba(d.X),
    "GaussianNB": lambda d: GaussianNB().fit(d.X, d.y_three).predict_proba(d.X),
    "GaussianMixture(init_params='random_from_data')": lambda d: (
        GaussianMixture(2, init_params="random_from_data", random_state=0)
        .fit(d.X)
        .predict_proba(d.X)
    ),
    "Nystroem": lambda d: Nystroem(n_components=10, random_state=0).fit_transform(d.X),
    "PolynomialFeatures": lambda d: PolynomialFeatures().fit_transform(d.X),
    "LabelBinarizer": lambda d: LabelBinarizer().fit_transform(d.y_three),
    "StandardScaler": lambda d: StandardScaler().fit_transform(d.X),
    "MinMaxScaler": lambda d: MinMaxScaler().fit_transform(d.X),
    "MaxAbsScaler": lambda d: MaxAbsScaler().fit_transform(d.X),
    "Normalizer": lambda d: Normalizer().fit_transform(d.X),
    "KernelCenterer": lambda d: KernelCenterer().fit_transform(pairwise.linear_kernel(d.X)),
    "LabelEncoder": lambda d: LabelEncoder().fit_transform(d.y_class),
    "accuracy_score": lambda d: metrics.accuracy_score(d.y_class, 1 - d.y_class),
    "zero_one_loss": lambda d: metrics.zero_one_loss(d.y_class, d.y_class),
    "f1_score": lambda d: metrics.f1_score(d.y_class, d.y_class),
    "confusion_matrix": lambda d: metrics.confusion_matrix(d.y_class, d.y_class),
    "multilabel_confusion_matrix": lambda d: metrics.multilabel_confusion_matrix(
        d.y_three, (d.y_three * 2) % 3
    ),
    "precision_score(average='macro')": lambda d: metrics.precision_score(
        d.y_three, (d.y_three + 1) % 3, average="macro"
    ),
    "log_loss": lambda d: metrics.log_loss(d.y_class, d.proba),
    "r2_score": lambda d: metrics.r2_score(d.y_reg, d.y_reg * 0.9),
    "mean_squared_error": lambda d: metrics.mean_squared_error(d.y_reg, d.y_reg * 0.9),
    "mean_absolute_error": lambda d: metrics.mean_absolute_error(d.y_reg, d.y_reg * 0.9),
    "rbf_kernel": lambda d: pairwise.rbf_kernel(d.X),
    "polynomial_kernel": lambda d: pairwise.polynomial_kernel(d.X),
    "cosine_similarity": lambda d: pairwise.cosine_similarity(d.X),
    "euclidean_distances": lambda d: pairwise.euclidean_distances(d.X),
    "manhattan_distances": lambda d: pairwise.manhattan_distances(d.X),
    "additive_chi2_kernel": lambda d: pairwise.additive_chi2_kernel(d.positive),
    "laplacian_kernel": lambda d: pairwise.laplacian_kernel(d.X),
    "paired_cosine_distances": lambda d: pairwise.paired_cosine_distances(d.X, d.X[::-1, :]),
    "pairwise_distances(metric='cosine')": lambda d: pairwise.pairwise_distances(
        d.X, metric="cosine"
    ),
    "pairwise_kernels(metric='sigmoid')": lambda d: pairwise.pairwise_kernels(
        d.X, metric="sigmoid"
    ),
}


# scikit-learn gives up NumPy's errstate for other namespaces (extmath's incremental variance
# divides 0 by 0 in a branch it then discards); NumPy's kernels warn, as NumPy would.
@pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")
@pytest.mark.parametrize("name", SKLEARN)
def test_scikit_learn_gives_numpys_results(name: str, dispatch: None) -> None:
    want = SKLEARN[name](_numpy())
    _check(SKLEARN[name](_engine()), want)


def test_a_fitted_estimator_keeps_engine_arrays_and_checks_the_namespace(
    dispatch: None,
) -> None:
    d = _engine()
    lda = LinearDiscriminantAnalysis().fit(d.X, d.y_class)
    assert isinstance(lda.coef_, aa.Array)
    assert isinstance(lda.classes_, aa.Array)
    assert lda.classes_.tolist() == [0, 1]  # sorted, as scikit-learn expects of unique_values
    with pytest.raises(ValueError, match=r"aioengine\.array_api"):
        lda.predict(np.asarray(d.X))  # fitted on engine arrays: NumPy input is refused


# -- SciPy ----------------------------------------------------------------------------------

SCIPY: dict[str, Callable[[Data], Any]] = {
    "special.erf": lambda d: scipy.special.erf(d.a),
    "special.gammaln": lambda d: scipy.special.gammaln(d.p),
    "special.logsumexp": lambda d: scipy.special.logsumexp(d.a),
    "special.softmax": lambda d: scipy.special.softmax(d.a),
    "special.xlogy": lambda d: scipy.special.xlogy(d.p, d.p),
    "special.entr": lambda d: scipy.special.entr(d.p),
    "stats.zscore": lambda d: scipy.stats.zscore(d.a),
    "stats.skew": lambda d: scipy.stats.skew(d.a),
    "stats.kurtosis": lambda d: scipy.stats.kurtosis(d.a),
    "stats.moment": lambda d: scipy.stats.moment(d.a, order=3),
    "stats.ttest_ind": lambda d: scipy.stats.ttest_ind(d.a, d.b).pvalue,
    "stats.pearsonr": lambda d: scipy.stats.pearsonr(d.a, d.b).statistic,
    "stats.gmean": lambda d: scipy.stats.gmean(d.p),
    "stats.sem": lambda d: scipy.stats.sem(d.a),
    "stats.entropy": lambda d: scipy.stats.entropy(d.p),
    "stats.iqr": lambda d: scipy.stats.iqr(d.a),
    "stats.rankdata": lambda d: scipy.stats.rankdata(d.a),
    "stats.quantile": lambda d: scipy.stats.quantile(d.a, 0.3),
    "fft.fft": lambda d: scipy.fft.fft(d.a),
    "fft.rfft": lambda d: scipy.fft.rfft(d.a),
    "fft.dct": lambda d: scipy.fft.dct(d.a),
    "fft.fftshift": lambda d: scipy.fft.fftshift(d.a),
    "signal.convolve": lambda d: scipy.signal.convolve(d.a, d.b[:5]),
    "signal.fftconvolve": lambda d: scipy.signal.fftconvolve(d.a, d.b[:5]),
    "signal.correlate": lambda d: scipy.signal.correlate(d.a, d.b[:5]),
    "signal.detrend": lambda d: scipy.signal.detrend(d.a),
    "signal.hilbert": lambda d: scipy.signal.hilbert(d.a),
    "signal.medfilt": lambda d: scipy.signal.medfilt(d.a, 3),
    "ndimage.gaussian_filter": lambda d: scipy.ndimage.gaussian_filter(d.image, 1.0),
    "ndimage.uniform_filter": lambda d: scipy.ndimage.uniform_filter(d.image, 3),
    "ndimage.median_filter": lambda d: scipy.ndimage.median_filter(d.image, 3),
    "ndimage.sobel": lambda d: scipy.ndimage.sobel(d.image),
    "ndimage.zoom": lambda d: scipy.ndimage.zoom(d.image, 2),
    "ndimage.label": lambda d: scipy.ndimage.label(d.image > 0)[0],
    "cluster.vq.whiten": lambda d: scipy.cluster.vq.whiten(d.M),
    "cluster.vq.vq": lambda d: scipy.cluster.vq.vq(d.M, d.M[:2])[0],
    "cluster.hierarchy.linkage": lambda d: scipy.cluster.hierarchy.linkage(d.M),
    "integrate.trapezoid": lambda d: scipy.integrate.trapezoid(d.a),
    "integrate.cumulative_trapezoid": lambda d: scipy.integrate.cumulative_trapezoid(d.a),
}


@pytest.mark.parametrize("name", SCIPY)
def test_scipy_gives_numpys_results(name: str) -> None:
    want = SCIPY[name](_numpy())
    _check(SCIPY[name](_engine()), want)


def test_scipy_creation_functions_take_the_namespace() -> None:
    ns = xp.default_namespace()
    window = scipy.signal.windows.hann(16, xp=ns)
    freqs = scipy.fft.fftfreq(50, xp=ns)
    assert isinstance(window, aa.Array)
    assert isinstance(freqs, aa.Array)
    np.testing.assert_allclose(np.asarray(window), scipy.signal.windows.hann(16))
    np.testing.assert_allclose(np.asarray(freqs), scipy.fft.fftfreq(50))


# -- array-api-compat and array-api-extra ---------------------------------------------------


@pytest.mark.parametrize(
    "compat", [array_api_compat, sklearn_compat, scipy_compat], ids=["own", "sklearn", "scipy"]
)
def test_array_api_compat_finds_the_namespace(compat: Any) -> None:
    x = xp.asarray([1.0, 2.0])
    ns = compat.array_namespace(x, 1.0, None)
    assert ns is xp.default_namespace()
    assert ns.__name__ == "aioengine.array_api"
    assert compat.is_array_api_obj(x)
    assert not compat.is_numpy_array(x)
    assert compat.device(x) == ae.cpu()
    assert compat.size(x[x > 1.0]) == 1  # the data-dependent dimension, waited for


def test_namespaces_of_own_engines_are_named_after_the_package() -> None:
    with ae.BlockingEngine(cpu_workers=1) as be, ae.BlockingEngine(cpu_workers=1) as other:
        ns = aa.namespace(be)
        x, y = ns.ones(2), aa.namespace(other).ones(2)
        assert array_api_compat.array_namespace(x) is ns
        assert ns.__name__ == "aioengine.array"
        with pytest.raises(ValueError, match="arrays of two engines in one call"):
            array_api_compat.array_namespace(x, y).add(x, y)


def test_is_lazy_array_in_synchronous_code_is_false() -> None:
    """Off the loop thread a sync point waits for the value, so it always succeeds: the
    array is not lazy there (array-api-compat's definition), pending or not."""
    x = xp.sum(xp.ones(1000) * 2)
    assert not array_api_compat.is_lazy_array(x)
    assert not array_api_compat.is_lazy_array(xp.ones(3)[xp.ones(3) > 0])


async def test_is_lazy_array_on_the_loop_thread_is_true(engine: ae.Engine) -> None:
    """On the loop thread a sync point of a pending array raises (PendingArrayError): the
    array is lazy there, and libraries keep to code without data-dependent Python control
    flow (array-api-extra's lazy paths)."""
    ns = aa.namespace(engine)
    x = ns.ones(3) * 2
    assert array_api_compat.is_lazy_array(x)
    await x


def test_array_api_extra_at_and_lazy_apply() -> None:
    x = xp.asarray([1.0, 2.0, 3.0]) * 2
    y = xpx.at(x, 1).set(10.0, copy=True)
    assert isinstance(y, aa.Array)
    assert y.tolist() == [2.0, 10.0, 6.0]
    assert x.tolist() == [2.0, 4.0, 6.0]  # copy=True: x untouched
    z = xpx.at(y)[0].add(1.0)
    assert z.tolist() == [3.0, 10.0, 6.0]
    summed = xpx.lazy_apply(np.cumsum, x, shape=(3,), dtype=x.dtype)
    assert isinstance(summed, aa.Array)
    assert summed.tolist() == [2.0, 6.0, 12.0]
    assert xpx.lazy_apply(np.cumsum, x).tolist() == [2.0, 6.0, 12.0]
    assert int(xpx.nunique(xp.asarray([1, 1, 2]))) == 2
    np.testing.assert_allclose(np.asarray(xpx.cov(xp.stack([x, x]))), np.full((2, 2), 4.0))


async def test_array_api_extra_lazy_apply_on_the_loop_thread(engine: ae.Engine) -> None:
    ns = aa.namespace(engine)
    x = ns.arange(4.0)
    summed = xpx.lazy_apply(np.cumsum, x, shape=(4,), dtype=x.dtype)
    assert isinstance(summed, aa.Array)  # pushed, not computed on the loop thread
    assert (await summed).tolist() == [0.0, 1.0, 3.0, 6.0]
    assert (await xpx.at(x)[1].set(9.0)).tolist() == [0.0, 9.0, 2.0, 3.0]


# -- what libraries and NumPy users read: shape, str, repr ----------------------------------


def _held(be: ae.BlockingEngine, ns: aa.Namespace) -> tuple[aa.Array, threading.Event]:
    """An array whose value a raw writer holds back until the event is set (and then writes
    [3, -1, 4, -1, 5]): what a sync point returns proves that it waited."""
    base = np.zeros(5)
    x = ns.asarray(base)
    release = threading.Event()

    def writer(rctx: ae.RunContext) -> None:
        assert release.wait(30)
        base[...] = [3.0, -1.0, 4.0, -1.0, 5.0]

    be.push_sync(writer, ae.cpu(), [], [x.var], name="writer")
    return x, release


def _release_soon(release: threading.Event) -> threading.Timer:
    timer = threading.Timer(0.02, release.set)
    timer.start()
    return timer


def test_a_data_dependent_shape_is_waited_for_in_synchronous_code() -> None:
    with ae.BlockingEngine(cpu_workers=2) as be:
        ns = aa.namespace(be)
        x, release = _held(be, ns)
        positive = x[x > 0]
        assert "pending" in repr(positive)  # repr never waits
        timer = _release_soon(release)
        try:
            assert positive.shape == (3,)  # waited: the writer's values decide it
            assert len(positive) == 3
            assert positive.size == 3
        finally:
            release.set()
            timer.join()


def test_a_failed_data_dependent_shape_raises_its_failure_in_synchronous_code() -> None:
    with ae.BlockingEngine(cpu_workers=2) as be:
        ns = aa.namespace(be)
        bad = ns.linalg.inv(ns.zeros((2, 2)))
        with pytest.raises(ae.DependencyError) as exc:
            _ = bad[bad > 0].shape
        assert isinstance(exc.value.__cause__, np.linalg.LinAlgError)


async def test_a_data_dependent_shape_is_none_on_the_loop_thread(engine: ae.Engine) -> None:
    ns = aa.namespace(engine)
    x = ns.asarray([3.0, -1.0, 4.0])
    positive = x[x > 0]
    assert positive.shape == (None,)
    assert positive.size is None
    assert await asyncio.to_thread(lambda: positive.shape) == (2,)  # a thread waits
    await positive
    assert positive.shape == (2,)


def test_str_waits_for_the_value_in_synchronous_code() -> None:
    with ae.BlockingEngine(cpu_workers=2) as be:
        ns = aa.namespace(be)
        x, release = _held(be, ns)
        y = x * 2
        assert repr(y) == "Array(shape=(5,), dtype=float64, pending: multiply)"
        timer = _release_soon(release)
        try:
            assert str(y) == str(np.array([6.0, -2.0, 8.0, -2.0, 10.0]))
            assert f"{y}" == str(y)
            assert f"{y[0]:.1f}" == "6.0"
        finally:
            release.set()
            timer.join()
        assert repr(y) == "Array([ 6., -2.,  8., -2., 10.], dtype=float64)"


async def test_str_shows_the_pending_state_on_the_loop_thread(engine: ae.Engine) -> None:
    ns = aa.namespace(engine)
    y = ns.ones(3) * 2
    assert str(y) == repr(y) == "Array(shape=(3,), dtype=float64, pending: multiply)"
    await y
    assert str(y) == "[2. 2. 2.]"
    assert f"{y}" == "[2. 2. 2.]"
    bad = ns.linalg.inv(ns.zeros((2, 2)))
    with pytest.raises(np.linalg.LinAlgError):
        await bad
    assert str(bad) == repr(bad)
    assert "failed" in str(bad)
