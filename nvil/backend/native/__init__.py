"""Native CPU kernels for the loops that PyTorch cannot batch: the sequential (single-site) Gibbs sweeps.

A sweep over M units has M dependent steps, each a few small vector operations per chain; eagerly that is M
rounds of kernel launches, compiled (``accel=compile``) one launch per unit. ``sequential.c`` runs the whole
sweep in one call, the units in a loop inside, the chains in blocks that share each unit's table rows, the inner
loops over factor elements at SIMD width. ``accel=native`` selects it (``nvil.backend.accel``); it is CPU only.
Each kernel's entry, measured gain (``bench/sequential_sweeps.py``) and test are in ``nvil.backend.registry``.

The C file is compiled on first use with the system C compiler (``cc``, or ``$CC``) into a cache directory
(``$NVIL_NATIVE_CACHE``, else ``~/.cache/nvil/native``), keyed by the source, the flags and the CPU, written
atomically so concurrent processes never load a half-written library, and loaded with ctypes. It is built with
``-fopenmp`` where that compiles and loads: its library then shares the OpenMP runtime torch loaded (the same
soname), and every kernel splits its chains, rows or columns into ``torch.get_num_threads()`` ranges run by torch's
own thread pool (``threads.h``: one C call, no pool of ours beside torch's spinning workers, which cost AIS a fifth
of its step at 2 threads); else without, the ranges one after another. Where
no compiler works the caller gets ``NativeUnavailable`` with the compiler's message; ``wanted`` turns that into a
one-line ConfigError (``accel=native``) or one warning and the eager sweeps (``accel=auto``).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import torch

from nvil.backend.cpu_kernels import cpu_flags
from nvil.core.errors import ConfigError

SOURCE = Path(__file__).with_name("sequential.c")
HEADERS = tuple(Path(__file__).with_name(h) for h in ("lateral_sweep.h", "lateral_tiled.h", "bernoulli_log_prob.h",
                                                     "threads.h"))
# -fno-trapping-math: the loops with selects (bernoulli_log_prob.h's clamp and max(a, 0)) are if-converted and
# vectorised on AVX2 too (under -ftrapping-math only AVX-512's masks allowed it; on AVX2 such loops ran scalar).
# No value changes: the compiler may evaluate both sides of a select; it does not reorder or contract arithmetic.
# -fno-math-errno: no libm call kept per element to set errno (expf, logf stay libm calls: glibc vectorises them only
# under -ffast-math).
FLAGS = ("-O3", "-march=native", "-fno-trapping-math", "-fno-math-errno", "-fopenmp-simd", "-fPIC", "-shared",
         "-std=c11")
OPENMP = ("-fopenmp",)  # tried first: the *_threads drivers then run in torch's OpenMP pool (threads.h)
MODES = {"sample": 0, "force": 1, "argmax": 2}
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_warned = False


class NativeUnavailable(RuntimeError):
    """The native kernels could not be built or loaded here (no C compiler, an unsupported dtype or device)."""


def _cpu_key() -> str:
    """The CPU's instruction-set flags as one string, part of the compiled library's cache key."""
    return " ".join(sorted(cpu_flags()))


def tiled() -> bool:
    """The pixel sweep's default kernel: register-tiled where the CPU has 512-bit registers (lateral_tiled.h)."""
    return "avx512f" in cpu_flags()


def _cache_dir() -> Path:
    """$NVIL_NATIVE_CACHE, else ~/.cache/nvil/native, else (not writable) a folder in the temporary directory."""
    if os.environ.get("NVIL_NATIVE_CACHE"):
        return Path(os.environ["NVIL_NATIVE_CACHE"])
    for root in (Path.home() / ".cache" / "nvil" / "native", Path(tempfile.gettempdir()) / f"nvil-native-{os.getuid()}"):
        try:
            root.mkdir(parents=True, exist_ok=True)
            if os.access(root, os.W_OK):
                return root
        except OSError:
            continue
    raise NativeUnavailable("accel=native found no writable folder for its compiled kernels (set NVIL_NATIVE_CACHE)")


def library() -> ctypes.CDLL:
    """The compiled kernels (built on first use, then loaded from the cache)."""
    global _library
    with _lock:
        if _library is not None:
            return _library
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            raise NativeUnavailable("accel=native needs a C compiler (cc or $CC) and none was found")
        try:  # with OpenMP where it compiles and loads (the runtime torch loaded), else without
            lib = ctypes.CDLL(str(_built(cc, FLAGS + OPENMP) or _built(cc, FLAGS, strict=True)))
        except OSError:
            try:
                lib = ctypes.CDLL(str(_built(cc, FLAGS, strict=True)))
            except OSError as e:
                raise NativeUnavailable(f"accel=native could not build or load its kernels: {e}") from None
        for suffix, real in (("f32", ctypes.c_float), ("f64", ctypes.c_double)):
            for name, (restype, argtypes) in _signatures(real).items():
                if suffix == "f32" or not name.startswith("bernoulli_log"):  # float32 only
                    fn = getattr(lib, f"{name}_{suffix}")
                    fn.restype, fn.argtypes = restype, argtypes
        _library = lib
        return lib


def _signatures(real) -> dict:
    """(restype, argtypes) of each kernel of ``sequential.c`` for one floating type (``real``: ctypes.c_float or
    ctypes.c_double): the range kernels (their first two arguments a range lo, hi) and their OpenMP drivers
    (``threads.h``: the length n to split and the number of threads in their place, no scratch arguments)."""
    i64, u64, i32, ptr = ctypes.c_int64, ctypes.c_uint64, ctypes.c_int, ctypes.c_void_p
    ranged = {"sequential_sweep": (None, [i64] * 3 + [ptr] * 2 + [i32] + [ptr] * 5 + [i64] + [ptr] * 9),
              "lateral_sweep": (None, [i64] * 3 + [ptr] * 4 + [i32] + [ptr] * 4 + [u64]),
              "lateral_tiled": (None, [i64] * 3 + [ptr] * 4 + [i32] + [ptr] + [u64] + [ptr] * 2),
              "autoregressive": (None, [i64] * 3 + [ptr] * 5)}
    drivers = {f"{name}_threads": (restype, [i64, i32] + args[2:]) for name, (restype, args) in ranged.items()}
    drivers["lateral_sweep_threads"] = drivers["lateral_tiled_threads"] = (i32, [i64, i32, i64] + [ptr] * 4 + [i32]
                                                                           + [ptr, u64])
    return {**ranged, **drivers,
            "uniforms": (None, [i64, i64, u64, ptr]),
            "bernoulli_log_prob": (None, [i64] * 3 + [ptr, i64, ptr, i64, ptr, ptr]),
            "bernoulli_log_prob_threads": (None, [i64] * 2 + [ptr, i64, ptr, i64, ptr, ptr, i32])}


def _built(cc: str, flags: tuple, strict: bool = False) -> Path | None:
    """The library compiled with ``flags`` (from the cache, else built and written atomically: a concurrent process
    sees no library or a whole one); None where it does not compile and not ``strict``, else NativeUnavailable."""
    source = SOURCE.read_bytes() + b"".join(h.read_bytes() for h in HEADERS)
    key = hashlib.sha256(source + " ".join(flags).encode() + cc.encode() + _cpu_key().encode())
    target = _cache_dir() / f"sequential-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([cc, *flags, str(SOURCE), "-o", tmp, "-lm"], capture_output=True, text=True)
        lines = done.stderr.strip().splitlines() or ["(no message)"]
        message = next((x for x in lines if "error" in x), lines[0]) if done.returncode else None
    except OSError as e:
        message = str(e)
    if message is not None:
        os.unlink(tmp)
        if not strict:
            return None
        raise NativeUnavailable(f"accel=native could not compile {SOURCE.name} with {cc}: {message}")
    os.replace(tmp, target)
    return target


def wanted(mode: str, device) -> bool:
    """Whether a sequential sweep on ``device`` runs here as C: with ``accel=native`` (a ConfigError where the kernels
    cannot be built, or off the CPU), with ``accel=auto`` on a CPU where they build (else one warning, then eager)."""
    global _warned
    if mode not in ("native", "auto") or torch.device(device).type != "cpu":
        if mode == "native":
            raise ConfigError(f"accel=native runs the sequential sweeps on the CPU, but the tensors are on {device}")
        return False
    try:
        library()
        return True
    except NativeUnavailable as e:
        if mode == "native":
            raise ConfigError(str(e)) from None
        if not _warned:
            warnings.warn(f"{e}; the sequential sweeps run eagerly (slower)", stacklevel=2)
            _warned = True
        return False


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _array(ctype, values):
    return (ctype * max(len(values), 1))(*values)


def _checked(t: torch.Tensor | None, dtype: torch.dtype, what: str) -> torch.Tensor | None:
    if t is None:
        return None
    if t.device.type != "cpu":
        raise NativeUnavailable(f"accel=native runs on the CPU; {what} is on {t.device}")
    if t.dtype != dtype or not t.is_contiguous():
        raise ValueError(f"native sweep: {what} must be a contiguous {dtype} tensor, got {t.dtype}")
    return t


def sequential_sweep(h: torch.Tensor, r: torch.Tensor, *, mode: str, picks=None, beta=None, reverse=None, logits=None,
                     J=None, factors=()) -> None:
    """One sweep over the units of every chain, in place: h [chains, M] (the state), r [chains, M] (the quadratic
    field u + J h, kept current), and per factor (p, s, up, down, lo, hi, R, coef) its running p, s [chains, K], flip
    tables [M, K], units lo..hi-1, products per log R and coefficient (``sequential.c``). ``picks`` [chains, M]: the
    uniforms (``sample``) or the forced values (``force``); ``beta`` [chains] or None; ``reverse`` [chains] uint8 or
    None (forward); ``logits`` [chains, M] filled when given."""
    dtype = h.dtype
    fn = _kernel("sequential_sweep_threads", dtype)
    chains, M = h.shape
    for name, t in (("h", h), ("r", r), ("picks", picks), ("beta", beta), ("logits", logits), ("J", J)):
        _checked(t, dtype, name)
    if reverse is not None:
        _checked(reverse, torch.uint8, "reverse")
    tensors = [[_checked(t, dtype, "a factor's tensors") for t in f[:4]] for f in factors]
    ptrs = [_array(ctypes.c_void_p, [t[i].data_ptr() for t in tensors]) for i in range(4)]
    ints = [_array(ctypes.c_int64, values) for values in (
        [t[0].shape[1] for t in tensors], [f[4] for f in factors], [f[5] for f in factors],
        [f[6] for f in factors])]
    coef = _array(ctypes.c_double, [float(f[7]) for f in factors])
    common = (M, _ptr(h), _ptr(picks), MODES[mode], _ptr(beta), _ptr(reverse), _ptr(logits), _ptr(r), _ptr(J),
              len(factors), *ptrs, *ints, coef)
    fn(chains, threads_for(chains, 8), *common)


def seed_from(generator: torch.Generator | None) -> int:
    """One 63-bit seed drawn from ``generator`` (torch's default generator when None) for the kernels' own draws."""
    return int(torch.randint(2**63 - 1, (), generator=generator))


def _kernel(name: str, dtype: torch.dtype):
    if dtype not in _SUFFIX:
        raise NativeUnavailable(f"accel=native supports float32 and float64, not {dtype}")
    return getattr(library(), f"{name}_{_SUFFIX[dtype]}")


def uniforms(chains: int, units: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The [chains, units] uniforms that ``lateral_sweep`` without thresholds draws under ``seed`` (SplitMix64 of
    the counter chain * units + unit; midpoints of 2^23 or 2^52 bins, inside (0, 1)): its threshold for unit j of
    chain c is log u - log(1 - u) of entry [c, j]."""
    out = torch.empty(chains, units, dtype=dtype)
    _kernel("uniforms", dtype)(0, out.numel(), seed, _ptr(out))
    return out


def autoregressive(base: torch.Tensor, wt: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Binary units drawn in index order, unit j on where u_j < sigmoid(base_j + sum_{k<j} W_jk h_k), for every row of
    ``base`` and ``u`` [..., n]; ``wt`` [n, n] is W transposed (W strictly lower-triangular). Returns h (``base``'s
    shape): the draw of ``AutoregressiveLinear.sample`` for the same uniforms, in one C call."""
    dtype, n = base.dtype, base.shape[-1]
    fn = _kernel("autoregressive_threads", dtype)
    flat_base, flat_u = base.reshape(-1, n).contiguous(), u.reshape(-1, n).contiguous()
    for name, t in (("base logits", flat_base), ("W transposed", wt), ("u", flat_u)):
        _checked(t, dtype, name)
    h, logits = torch.empty_like(flat_base), torch.empty_like(flat_base)
    rows = h.shape[0]
    fn(rows, threads_for(rows, 64), n, _ptr(flat_base), _ptr(wt), _ptr(flat_u), _ptr(logits), _ptr(h))
    return h.reshape(base.shape)


def lateral_sweep(v: torch.Tensor, field: torch.Tensor, thresholds: torch.Tensor | None, jscale: torch.Tensor | None,
                  reverse: bool, lateral: torch.Tensor, seed: int = 0, kernel: str | None = None) -> None:
    """One sequential sweep over laterally coupled binary units, in place on v [chains, M]: unit j on where
    field_j + jscale (v L)_j > thresholds_j, in index order (``reverse``: the opposite), blocked. v holds 0 / 1; L
    [M, M] symmetric with a zero diagonal. ``thresholds`` None: the kernel draws them, the logits of
    ``uniforms(chains, M, seed)``. ``kernel``: ``"tiled"`` (``lateral_tiled.h``: each block's fields as a
    register-tiled product over chains) or ``"list"`` (``lateral_sweep.h``: sums of the rows of L of the units that
    are on); None: tiled where the CPU has AVX-512, else list. The two make the same decisions up to rounding."""
    dtype = v.dtype
    kernel = kernel or ("tiled" if tiled() else "list")
    if kernel not in ("tiled", "list"):
        raise ValueError(f"lateral_sweep: kernel must be 'tiled' or 'list', got {kernel!r}")
    fn = _kernel("lateral_tiled_threads" if kernel == "tiled" else "lateral_sweep_threads", dtype)
    for name, t in (("v", v), ("field", field), ("thresholds", thresholds), ("jscale", jscale), ("L", lateral)):
        _checked(t, dtype, name)
    chains, M = v.shape
    # measured: 2 threads on 100 chains were slower than one
    if fn(chains, threads_for(chains, 256), M, _ptr(v), _ptr(field), _ptr(thresholds), _ptr(jscale), int(reverse),
          _ptr(lateral), seed):
        raise MemoryError(f"lateral_sweep could not allocate its scratch for {chains} chains of {M} units")


def threads_for(n: int, per_thread: int) -> int:
    """The ranges a C driver splits n chains, rows or blocks into (``threads.h``): torch.get_num_threads(), at most
    one per ``per_thread`` of them, at least one."""
    return max(1, min(torch.get_num_threads(), n // per_thread))
