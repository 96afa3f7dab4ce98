"""Argument normalization shared by the NumPy and torch paths.

Everything here is plain Python on shapes and dtypes (no calls into the extension), so the torch
path stays traceable by ``torch.compile(fullgraph=True)``. Value checks that need the problem
(kernel too large, stride out of range, H % H_kv, ...) are left to the C++ API, which names the
argument and its value; the extension turns its status into ValueError / TypeError /
NotImplementedError / RuntimeError.
"""

import math
import numbers

import numpy as np

from . import _C

BACKENDS = ("auto", "reference", "cpu", "cuda-naive", "cuda-fused", "cuda-gemm")
CUDA_BACKENDS = ("cuda-naive", "cuda-fused", "cuda-gemm")

_AXES = {1: "L", 2: "X, Y", 3: "X, Y, Z"}


def layout(rank, last="head_dim"):
    return f"[batch, {_AXES[rank]}, heads, {last}]"


def _is_int(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_bool(v):
    # numpy.bool_ is not a subclass of bool.
    return isinstance(v, (bool, np.bool_))


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _in_int64(name, value, items):
    """The extension takes per-axis ints as int64: a larger one is a ValueError naming it (the
    C++ API then checks each value against the problem)."""
    for v in items:
        if not _INT64_MIN <= v <= _INT64_MAX:
            raise ValueError(f"{name}={value!r}: {v} does not fit in a 64-bit integer")
    return list(items)


def per_axis(name, value, rank, boolean=False):
    """An int (bool for is_causal) applies to every axis; a tuple/list gives one per axis."""
    # The common spellings (plain ints / bools) without the numbers.Integral checks below.
    plain = bool if boolean else int
    if type(value) is plain:
        return [value] * rank if boolean else _in_int64(name, value, [value] * rank)
    if type(value) in (tuple, list) and len(value) == rank and all(type(v) is plain for v in value):
        return list(value) if boolean else _in_int64(name, value, value)
    if isinstance(value, (tuple, list)):
        items = tuple(value)
        if len(items) != rank:
            raise ValueError(f"{name}={items} has {len(items)} entries for a {rank}-D input")
    else:
        items = (value,) * rank
    for v in items:
        if boolean and not _is_bool(v):
            raise TypeError(f"{name}={value!r}: entries must be bool")
        if not boolean and not _is_int(v):
            raise TypeError(f"{name}={value!r}: entries must be int")
    if boolean:
        return [bool(v) for v in items]
    return _in_int64(name, value, [int(v) for v in items])


def int_arg(fn, name, value, lo, hi=(1 << 31) - 1, none_ok=False):
    """An int argument of the introspection functions (fused_plan, fused_configs, ...) in
    [lo, hi] (int32 for the extension), or None where none_ok: a bool, float or string is a
    TypeError naming it, an int out of range a ValueError."""
    if value is None and none_ok:
        return None
    if not _is_int(value):
        raise TypeError(f"{fn}: {name}={value!r} must be an int" + (" or None" if none_ok else ""))
    if not lo <= value <= hi:
        raise ValueError(f"{fn}: {name}={value!r} must be in [{lo}, {hi}]")
    return int(value)


def shape_arg(fn, name, value):
    """A shape argument: a list or tuple of ints >= 1 (each an int64 for the extension)."""
    if not isinstance(value, (tuple, list)) or not all(_is_int(v) for v in value):
        raise TypeError(f"{fn}: {name}={value!r} must be a list or tuple of ints")
    for v in value:
        if v < 1:
            raise ValueError(f"{fn}: {name}={tuple(value)!r}: {v} must be >= 1")
    return _in_int64(f"{fn}: {name}", tuple(value), [int(v) for v in value])


def dtype_arg(fn, dtype):
    """A dtype given as a name ("bfloat16"), a torch dtype or a NumPy dtype, as its name."""
    if isinstance(dtype, str):
        return dtype
    name = str(dtype)
    if name.startswith("torch."):
        return name[len("torch."):]
    if dtype is not None and not isinstance(dtype, (bool, numbers.Number)):
        try:
            return np.dtype(dtype).name
        except TypeError:
            pass
    raise TypeError(f"{fn}: dtype={dtype!r} must be a dtype name ('bfloat16', 'float16', "
                    "'float32'), a torch dtype or a NumPy dtype")


def check_spatial(fn, sp):
    """The per-axis checks of the C++ API that need no input shape (validate_problem's messages),
    for callers that hold parameters before any tensor exists (the modules, at construction)."""
    kernel_size, stride, dilation, _ = sp
    for i, (k, s, d) in enumerate(zip(kernel_size, stride, dilation)):
        if k < 1:
            raise ValueError(f"{fn}: kernel_size[{i}]={k} must be >= 1")
        if k > 2 ** 30:  # (no input axis is longer; a bias table would be sized by it)
            raise ValueError(f"{fn}: kernel_size[{i}]={k} must be at most 2^30, the longest axis")
        if d < 1:
            raise ValueError(f"{fn}: dilation[{i}]={d} must be >= 1")
        if s < 1 or s > k:
            raise ValueError(f"{fn}: stride[{i}]={s} must be in [1, kernel_size[{i}]={k}]")


def check_window_fits(fn, sp, lengths):
    """check_spatial, then each axis' window (kernel_size * dilation) within its length: for
    callers that size an output by the window before the C++ API checks it (the unfused qk op)."""
    check_spatial(fn, sp)
    for i, (k, d, n) in enumerate(zip(sp[0], sp[2], lengths)):
        if k > n // d:
            raise ValueError(f"{fn}: kernel_size[{i}]={k} * dilation[{i}]={d} exceeds input "
                             f"length {n}")


def spatial(rank, kernel_size, stride, dilation, is_causal):
    return (
        per_axis("kernel_size", kernel_size, rank),
        per_axis("stride", stride, rank),
        per_axis("dilation", dilation, rank),
        per_axis("is_causal", is_causal, rank, boolean=True),
    )


# NATTEN's names of its fused backends (``backend=`` of NATTEN 0.20+). Two name a kind of kernel
# fna has, and run fna's cuda-fused backend steered onto that kind (natten_backend_options); the
# others raise, saying what to use instead. No name is accepted and ignored.
NATTEN_BACKENDS = {
    "cutlass-fna": "cuda-fused",  # the mma.sync kernels (fna_fwd_sm80_*, fna_bwd_sm80_*)
    "hopper-fna": "cuda-fused",   # the Hopper wgmma kernels (compute capability 9.0)
}
NATTEN_REFUSED = {
    "blackwell-fna": "names NATTEN's Blackwell (compute capability 10.x) kernels, which fna does "
                     "not have; use backend='cuda-fused' (fna's fused kernels: mma.sync on every "
                     "sm_80+ GPU, wgmma on Hopper) or None (the best backend for the tensors' "
                     "device)",
    "flex-fna": "names NATTEN's FlexAttention backend (torch's flex_attention with a neighborhood "
                "mask), which fna does not run; use backend=None (the best backend for the "
                "tensors' device: cpu, or cuda-fused falling back to cuda-naive) or name one of "
                "fna's",
}


def _backend_text(backend):
    if backend is None:
        return "auto"
    if not isinstance(backend, str):
        raise TypeError(f"backend={backend!r} must be a string or None")
    if backend == "automatic":
        return "auto"
    if backend in NATTEN_REFUSED:
        raise ValueError(f"backend={backend!r} {NATTEN_REFUSED[backend]}")
    if backend not in BACKENDS and backend not in NATTEN_BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {', '.join(BACKENDS)} (or NATTEN's "
                         f"{', '.join(NATTEN_BACKENDS)})")
    return backend


def backend_name(backend, unfused=False):
    """fna's backend for ``backend=`` (None / "automatic" -> "auto"; NATTEN's "cutlass-fna" /
    "hopper-fna" -> "cuda-fused", see natten_backend_options). ``unfused``: for the qk / av
    operators, which NATTEN's fused names cannot run."""
    name = _backend_text(backend)
    if name in NATTEN_BACKENDS:
        if unfused:
            raise ValueError(f"backend={name!r} names a fused backend (fna's cuda-fused), which "
                             "has no unfused (qk / av) operators; use backend=None, 'cuda-gemm', "
                             "'cuda-naive' or 'cpu'")
        return NATTEN_BACKENDS[name]
    return name


def natten_backend(backend):
    """NATTEN's backend name in ``backend`` ("cutlass-fna" / "hopper-fna"), else None."""
    name = _backend_text(backend)
    return name if name in NATTEN_BACKENDS else None


def resolve_deterministic(fn, deterministic, torch_tensors, backward_runs):
    """``deterministic=`` as a bool. None follows ``torch.are_deterministic_algorithms_enabled()``
    for torch tensors (False for NumPy). An explicit False while torch's flag is on and a backward
    will run (the only non-deterministic part; `backward_runs`: a bool or a callable giving it) is
    what torch does for its own non-deterministic ops: a RuntimeError, or a UserWarning (and False
    as asked) under ``torch.use_deterministic_algorithms(True, warn_only=True)``."""
    if deterministic is None:
        if not torch_tensors:
            return False
        import torch
        return bool(torch.are_deterministic_algorithms_enabled())
    if not _is_bool(deterministic):
        raise TypeError(f"deterministic={deterministic!r} must be a bool or None")
    deterministic = bool(deterministic)
    if not deterministic and torch_tensors:
        import torch
        if torch.are_deterministic_algorithms_enabled() and (
                backward_runs() if callable(backward_runs) else backward_runs):
            msg = (f"{fn}: deterministic=False asks for a backward that accumulates in run-to-run "
                   "order, but torch.use_deterministic_algorithms(True) is set; pass "
                   "deterministic=None (follow torch) or True")
            if torch.is_deterministic_algorithms_warn_only_enabled():
                import warnings
                warnings.warn(msg, UserWarning, stacklevel=4)
            else:
                raise RuntimeError(msg)
    return deterministic


def fused_options(config, deterministic, allow_tf32, torch_tensors, backward_config=None,
                  tuning=""):
    """(config, deterministic, allow_tf32, backward_config, tuning) as the extension takes them.

    config: None or a cuda-fused configuration name (``fna.fused_configs``). backward_config: None
    or a cuda-fused backward configuration name (``fna.fused_backward_configs``). deterministic: bool.
    allow_tf32: None follows ``torch.backends.cuda.matmul.allow_tf32`` for torch tensors (so
    ``torch.set_float32_matmul_precision("high")`` enables TF32 here too) and is False otherwise.
    tuning: the text :func:`tuning_text` made.
    """
    if config is None:
        config = ""
    elif not isinstance(config, str) or not config:
        raise TypeError(f"config={config!r} must be a non-empty string (a configuration name) or None")
    if backward_config is None:
        backward_config = ""
    elif not isinstance(backward_config, str) or not backward_config:
        raise TypeError(f"backward_config={backward_config!r} must be a non-empty string "
                        "(a backward configuration name) or None")
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic={deterministic!r} must be a bool or None")
    if allow_tf32 is None:
        allow_tf32 = False
        if torch_tensors:
            import torch
            allow_tf32 = bool(torch.backends.cuda.matmul.allow_tf32)
    elif not isinstance(allow_tf32, bool):
        raise TypeError(f"allow_tf32={allow_tf32!r} must be a bool or None")
    return config, deterministic, allow_tf32, backward_config, tuning


# fna::kMaxThreads: the most CPU threads num_threads= / fna.set_num_threads take.
MAX_THREADS = _C.max_threads


def num_threads_value(num_threads):
    """``num_threads=`` as the extension takes it: None -> 0 (the process-wide count,
    ``fna.get_num_threads()``); otherwise an int in [0, MAX_THREADS] (the C++ API's message)."""
    if num_threads is None:
        return 0
    if not _is_int(num_threads):
        raise TypeError(f"num_threads={num_threads!r} must be an int or None")
    n = int(num_threads)
    if not 0 <= n <= MAX_THREADS:
        raise ValueError(f"num_threads={n} must be in [0, {MAX_THREADS}] (0: the process-wide "
                         "count, fna.get_num_threads())")
    return n


def _tuning_value(key, value):
    if isinstance(value, (bool, np.bool_)):
        return "on" if value else "off"
    if _is_int(value):
        return str(int(value))
    if isinstance(value, str) and value and "," not in value and "=" not in value:
        return value
    raise TypeError(f"tuning[{key!r}]={value!r} must be a string, an int or a bool")


# The process-wide tuning (fna.set_default_tuning): used by calls on CUDA tensors that pass none.
DEFAULT_TUNING = None


def autotune_cache_dir():
    """The autotuner's disk cache: $FNA_CACHE_DIR, else $XDG_CACHE_HOME/fna, else ~/.cache/fna."""
    import os
    d = os.environ.get("FNA_CACHE_DIR")
    if d:
        return d
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fna", "autotune")


def tuning_text(tuning):
    """``tuning=`` as "key=value,..." for the extension, which validates keys and values and names
    the one it rejects. None; "heuristic" / "auto" (the autotuner, its cache in
    autotune_cache_dir()); or a dict of Options::tuning keys to values (strings such as "on",
    "tma", "warp_specialized", ints, or bools for on / off; "mode": "auto" takes the same cache
    directory unless "autotune_cache_dir" names one)."""
    if tuning is None:
        return ""
    if isinstance(tuning, str):
        if tuning not in ("heuristic", "auto"):
            raise ValueError(f"tuning={tuning!r} must be 'heuristic', 'auto', a dict "
                             "(see fna.tuning_keys()) or None")
        tuning = {"mode": tuning}
    if not isinstance(tuning, dict):
        raise TypeError(f"tuning={tuning!r} must be 'heuristic', 'auto', a dict "
                        "(see fna.tuning_keys()) or None")
    pairs = []
    for key, value in tuning.items():
        if not isinstance(key, str):
            raise TypeError(f"tuning key {key!r} must be a string")
        if not key or "," in key or "=" in key:
            # (joined as "key=value,...": such a key would pass as several settings)
            raise ValueError(f"tuning key {key!r} must be one key name, without ',' or '=' "
                             "(see fna.tuning_keys())")
        pairs.append(f"{key}={_tuning_value(key, value)}")
    if tuning.get("mode") == "auto" and "autotune_cache_dir" not in tuning:
        pairs.append(f"autotune_cache_dir={autotune_cache_dir()}")
    return ",".join(pairs)


# NATTEN's tuning keywords. Each maps onto fna's configuration names and Options::tuning where it
# has a meaning here and raises where it does not; none is accepted and ignored.
NATTEN_TUNING_KWARGS = frozenset({
    "attention_kwargs", "q_tile_shape", "kv_tile_shape", "backward_q_tile_shape",
    "backward_kv_tile_shape", "backward_kv_splits", "backward_use_pt_reduction",
    "run_persistent_kernel", "kernel_schedule", "torch_compile", "try_fuse_additional_kv",
})

_SCHEDULES = {"non": "plain", "coop": "warp_specialized"}


def _shape_text(fn, name, value, rank):
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    if not isinstance(value, (tuple, list)) or len(value) != rank or not all(_is_int(v) for v in value):
        raise ValueError(f"{fn}: {name}={value!r} must be a tuple of {rank} ints (one per axis)")
    return "x".join(str(int(v)) for v in value)


def _pick(fn, what, names, family_order, describe):
    """The first of `names` in the order of `family_order` (the families' name prefixes)."""
    for fam in family_order:
        for n in names:
            if n.startswith(fam):
                return n
    raise ValueError(f"{fn}: no cuda-fused {what} matches {describe}")


def natten_tuning(fn, rank, kwargs, dtype, dim, hopper, deterministic, config, backward_config,
                  tuning):
    """Applies NATTEN's tuning keywords: returns (config, backward_config, tuning) with the
    configurations their tile shapes name and the Options::tuning fields they set. `hopper`:
    the tensors live on a compute capability 9.0 device (None: not CUDA tensors)."""
    from . import _C
    for name in kwargs:
        if name not in NATTEN_TUNING_KWARGS:
            raise TypeError(f"{fn}() got an unexpected keyword argument {name!r}")
    # NATTEN's defaults (None, False) ask for nothing; try_fuse_additional_kv is what fna always
    # does (additional keys inside the fused kernel), and gives the same result when False.
    given = {k: v for k, v in kwargs.items()
             if v is not None and v is not False and k != "try_fuse_additional_kv"}
    if not given:
        return config, backward_config, tuning
    if hopper is None:
        raise ValueError(f"{fn}: {', '.join(sorted(given))} tune the cuda-fused backend, which "
                         "needs CUDA tensors")
    extra = {}
    if given.get("attention_kwargs"):
        raise ValueError(f"{fn}: attention_kwargs={given['attention_kwargs']!r}: fna attends to "
                         "additional keys inside the fused kernel; it takes no attention_kwargs")
    if given.get("torch_compile"):
        raise ValueError(f"{fn}: torch_compile=True selects NATTEN's compiled flex backend; fna's "
                         "ops work under torch.compile as they are")
    if given.get("backward_use_pt_reduction"):
        raise ValueError(f"{fn}: backward_use_pt_reduction=True: fna computes the backward's row "
                         "sums (rowsum(dO * O)) in its own kernel")
    if "backward_kv_splits" in given:
        raise ValueError(f"{fn}: backward_kv_splits={given['backward_kv_splits']!r}: fna's "
                         "backward does not split the key/value axis")
    if "kernel_schedule" in given:
        ks = given["kernel_schedule"]
        if ks not in _SCHEDULES:
            raise ValueError(f"{fn}: kernel_schedule={ks!r}: fna's Hopper forward has the "
                             "schedules 'non' (plain) and 'coop' (warp-specialized); no 'pp' "
                             "(ping-pong)")
        extra["fwd_schedule"] = _SCHEDULES[ks]
    if given.get("run_persistent_kernel"):
        extra["persistent"] = "on"
    dtype_name = str(dtype).replace("torch.", "")
    if "q_tile_shape" in given or "kv_tile_shape" in given:
        if config:
            raise ValueError(f"{fn}: config={config!r} and q_tile_shape / kv_tile_shape both "
                             "name the forward configuration; give one")
        want = ""
        if "q_tile_shape" in given:
            want += "_q" + _shape_text(fn, "q_tile_shape", given["q_tile_shape"], rank) + "_kv"
        kv = ("_kv" + _shape_text(fn, "kv_tile_shape", given["kv_tile_shape"], rank) + "_w"
              if "kv_tile_shape" in given else "")
        names = [n for n in _C.fused_configs(rank, dtype_name, dim)
                 if (not want or want in n) and (not kv or kv in n)]
        sched = extra.get("fwd_schedule")
        order = {"plain": ["fna_fwd_sm90_"], "warp_specialized": ["fna_fwd_sm90ws_"]}.get(
            sched, ["fna_fwd_sm90ws_", "fna_fwd_sm90_", "fna_fwd_sm80_"] if hopper
            else ["fna_fwd_sm80_"])
        config = _pick(fn, "forward configuration", names, order,
                       f"q_tile_shape={given.get('q_tile_shape')!r}, "
                       f"kv_tile_shape={given.get('kv_tile_shape')!r} (fna.fused_configs lists them)")
        extra.pop("fwd_schedule", None)  # the name says the schedule
    if "backward_q_tile_shape" in given or "backward_kv_tile_shape" in given:
        if backward_config:
            raise ValueError(f"{fn}: backward_config={backward_config!r} and backward tile shapes "
                             "both name the backward configuration; give one")
        kv = ("_kv" + _shape_text(fn, "backward_kv_tile_shape", given["backward_kv_tile_shape"],
                                  rank) + "_q") if "backward_kv_tile_shape" in given else ""
        q = ("_q" + _shape_text(fn, "backward_q_tile_shape", given["backward_q_tile_shape"],
                                rank) + "_dqq") if "backward_q_tile_shape" in given else ""
        names = [n for n in _C.fused_backward_configs(rank, dtype_name, dim)
                 if (not kv or kv in n) and (not q or q in n)]
        pad = 64 if dim <= 64 else 128 if dim <= 128 else 256
        order = ["fna_bwd_sm80_"]
        if hopper and not deterministic and dtype_name != "float32" and pad <= 128:
            order = ["fna_bwd_sm90ws_" if pad == 128 else "fna_bwd_sm90_"] + order
        backward_config = _pick(
            fn, "backward configuration", names, order,
            f"backward_q_tile_shape={given.get('backward_q_tile_shape')!r}, "
            f"backward_kv_tile_shape={given.get('backward_kv_tile_shape')!r} "
            "(fna.fused_backward_configs lists them)")
    if extra:
        add = ",".join(f"{k}={v}" for k, v in extra.items())
        tuning = f"{tuning},{add}" if tuning else add
    return config, backward_config, tuning


def _tuning_pairs(tuning):
    """The "key=value,..." text as a dict (the extension validates keys and values)."""
    return dict(item.split("=", 1) if "=" in item else (item, "") for item in tuning.split(",")
                if item)


def natten_backend_options(fn, name, hopper, dtype, config, backward_config, tuning,
                           has_hopper_config=None, forward=True):
    """NATTEN's backend ``name`` ("cutlass-fna" / "hopper-fna") as cuda-fused's options: returns
    (config, backward_config, tuning) steering the plan onto that kind of kernel.

    cutlass-fna (NATTEN's CUTLASS 2.x kernels for sm_80-class GPUs): fna's mma.sync kernels,
    forward and backward: ``fwd_schedule=mma_sync`` (the plan's tiled sm80 forward, chosen as on a
    device without wgmma; the box, strip and SIMT forwards off) and ``bwd_kernel=sm80``. hopper-fna (NATTEN's Hopper kernels): fna's
    wgmma forward (box and strip off), which needs compute capability 9.0 and float16 / bfloat16;
    the backward is the plan's (its Hopper backward where that applies). `hopper`: the tensors'
    device has compute capability 9.0. A config / backward_config / tuning that contradicts the
    name is a ValueError; none is overridden silently."""
    keys = _tuning_pairs(tuning)
    add = {}
    if keys.get("mode") == "auto":
        raise ValueError(f"{fn}: backend={name!r} fixes the kind of kernel, while tuning mode "
                         "'auto' would time every kind; use backend='cuda-fused' with "
                         "tuning='auto', or drop the tuning")
    if name == "cutlass-fna":
        if keys.get("fwd_schedule", "mma_sync") != "mma_sync":
            raise ValueError(f"{fn}: tuning fwd_schedule={keys['fwd_schedule']!r} names a Hopper "
                             "(wgmma) schedule, but backend='cutlass-fna' runs fna's mma.sync "
                             "(sm80) kernels")
        if forward:
            if config:
                if not config.startswith("fna_fwd_sm80_"):
                    raise ValueError(f"{fn}: config={config!r} is not an mma.sync configuration "
                                     "(fna_fwd_sm80_*), which backend='cutlass-fna' runs")
            else:
                add.update(fwd_schedule="mma_sync", fwd_box="off", fwd_strip="off",
                           fwd_simt="off")
        if backward_config:
            if not backward_config.startswith("fna_bwd_sm80_"):
                raise ValueError(f"{fn}: backward_config={backward_config!r} is not an mma.sync "
                                 "backward (fna_bwd_sm80_*), which backend='cutlass-fna' runs")
        else:
            add["bwd_kernel"] = "sm80"
    else:
        if not hopper:
            raise ValueError(f"{fn}: backend='hopper-fna' runs fna's Hopper (wgmma) kernels, "
                             "which need a device of compute capability 9.0; use "
                             "backend='cuda-fused' (or 'cutlass-fna' for the mma.sync kernels)")
        dtype_name = str(dtype).replace("torch.", "")
        if dtype_name not in ("float16", "bfloat16"):
            raise ValueError(f"{fn}: backend='hopper-fna' runs fna's Hopper (wgmma) kernels, which "
                             f"take float16 / bfloat16; the tensors are {dtype_name}: use "
                             "backend='cuda-fused'")
        if forward:
            if config:
                if not config.startswith(("fna_fwd_sm90_", "fna_fwd_sm90ws_")):
                    raise ValueError(f"{fn}: config={config!r} is not a Hopper configuration "
                                     "(fna_fwd_sm90_* / fna_fwd_sm90ws_*), which "
                                     "backend='hopper-fna' runs")
            else:
                if not has_hopper_config():
                    raise ValueError(f"{fn}: backend='hopper-fna': fna has no Hopper (wgmma) "
                                     "forward configuration for this rank, dtype and head dim "
                                     "(fna.fused_configs lists them); use backend='cuda-fused'")
                add.update(fwd_box="off", fwd_strip="off", fwd_simt="off")
    for key, value in add.items():
        if key in keys and keys[key] != value:
            raise ValueError(f"{fn}: tuning {key}={keys[key]!r} contradicts backend={name!r}, "
                             f"which runs with {key}={value!r}")
    extra = ",".join(f"{k}={v}" for k, v in add.items() if k not in keys)
    if extra:
        tuning = f"{tuning},{extra}" if tuning else extra
    return config, backward_config, tuning


def resolve_scale(scale, head_dim):
    if head_dim < 1:
        # The default scale is head_dim ** -0.5; the C++ API names the same error with a scale.
        raise ValueError(f"dim={head_dim} (the head dim, query.shape[-1]) must be >= 1")
    if scale is None:
        return float(head_dim) ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale={scale!r} must be a float or None")
    s = float(scale)
    if not (math.isfinite(s) and s > 0.0):
        raise ValueError(f"scale={scale!r} must be a finite number > 0")
    if s > _MAX_SCALE:
        raise ValueError(f"scale={scale!r} must be at most {_MAX_SCALE!r} (scale * log2(e) must "
                         "fit in float32)")
    return s


# The largest scale whose scale * log2(e) (the kernels' float32 factor) is finite.
_MAX_SCALE = 3.4028234663852886e38 / 1.4426950408889634


def check_return_lse(fn, return_lse):
    if not _is_bool(return_lse):
        raise TypeError(f"{fn}: return_lse={return_lse!r} must be a bool")


def check_rank(fn, rank, name, t, last="head_dim"):
    if t.ndim != rank + 3:
        raise ValueError(
            f"{fn}: {name} has shape {tuple(t.shape)} ({t.ndim} dims); expected {rank + 3} dims "
            f"{layout(rank, last)}"
        )


def query_offset(fn, offset, rank):
    """``query_offset`` of na*d / na_backward: None (the queries are the whole grid), or one int
    per spatial axis (the query region's first coordinates in the key grid), as a list."""
    if offset is None:
        return None
    if _is_int(offset):
        offset = (offset,) * rank
    if isinstance(offset, (str, bytes)):
        raise TypeError(f"{fn}: query_offset must be an int or a sequence of {rank} ints, got "
                        f"{type(offset).__name__}")
    try:
        items = list(offset)
    except TypeError:
        raise TypeError(f"{fn}: query_offset must be an int or a sequence of {rank} ints, got "
                        f"{type(offset).__name__}") from None
    if len(items) != rank or not all(_is_int(v) for v in items):
        raise ValueError(f"{fn}: query_offset={offset!r} must be {rank} ints (one per spatial "
                         f"axis) for a {rank}-D input")
    # (NumPy ints too, as for kernel_size; the extension takes int64)
    return _in_int64(f"{fn}: query_offset", offset, [int(v) for v in items])


def check_output_dims(fn, query, value):
    """The sizes that shape the outputs fna allocates (batch, grid, heads, value head dim) within
    the library's limits, checked before anything is allocated, so that a huge expanded (zero
    stride) input is a clear error rather than an allocation failure. The C++ layer checks every
    size again at its boundary."""
    for name, v in (("batch", query.shape[0]), ("heads", query.shape[-2]),
                    ("dim_v", value.shape[-1])):
        if v > 2 ** 30:
            raise ValueError(f"{fn}: {name}={v} must be in [1, 2^30]")
    check_dims(fn, "query", query, range(1, query.ndim - 2))  # the grid


def check_dims(fn, name, t, axes=None):
    """The sizes of `t` on `axes` (default all; those the outputs take their shape from) within
    the library's 2^30, before anything is allocated from them (a huge expanded, zero-stride,
    input)."""
    for i in range(t.ndim) if axes is None else axes:
        v = t.shape[i]
        if v > 2 ** 30:
            raise ValueError(f"{fn}: {name}.shape[{i}]={v} must be in [1, 2^30]")


def check_additional(name, t, batch, rank):
    if t.ndim != 4:
        raise ValueError(
            f"{name} has shape {tuple(t.shape)} ({t.ndim} dims); expected 4 dims "
            "[batch, n_additional, heads_kv, dim]"
        )
    if t.shape[0] != batch:
        raise ValueError(f"{name} has batch {t.shape[0]} but query has batch {batch}")


def check_pair(name_a, a, name_b, b):
    if (a is None) != (b is None):
        raise ValueError(f"{name_a} and {name_b} must be given together (got only one)")
