"""fna: neighborhood attention with NATTEN's Python API.

    import fna
    out = fna.na2d(q, k, v, kernel_size=7)          # q, k, v: [B, X, Y, H, D], torch or NumPy

torch is optional: without it the NumPy path works; with it, the functions are autograd-enabled
custom ops (``torch.ops.fna.*``) that ``torch.compile(fullgraph=True)`` traces, and the modules
``NeighborhoodAttention1D/2D/3D`` are available. ``import fna`` does not import torch: fna's torch
side loads with the first torch tensor it sees (see _compat). See docs/python.md.
"""

from . import _C
from . import _compat  # torch is imported lazily: see _compat
from ._flops import flops
from .functional import (
    na1d, na2d, na3d, na1d_qk, na2d_qk, na3d_qk, na1d_av, na2d_av, na3d_av,
    na_backward, na_qk_backward, na_av_backward,
)
from ._merge import merge_attentions

__version__ = _C.version()

BACKENDS = _C.backends

_MODULES = ("NeighborhoodAttention1D", "NeighborhoodAttention2D", "NeighborhoodAttention3D")


def backend_compiled(backend):
    """Is ``backend`` ("reference", "cpu", "cuda-naive", "cuda-fused", "cuda-gemm") in this
    build?"""
    if not isinstance(backend, str):
        raise TypeError(f"backend_compiled: backend={backend!r} must be a backend name (a str)")
    return _C.backend_compiled(backend)


def cuda_available():
    """fna was built with CUDA and a CUDA device is visible."""
    return _C.cuda_available()


def resolve_backend(backend=None, device="cpu"):
    """The backend a call with ``backend`` (None = "auto") runs on ``device``: "cpu", "cuda",
    "cuda:N" or a ``torch.device``. A backend that cannot run on that device (``"cpu"`` on
    ``"cuda"``, ``"cuda-naive"`` on ``"cpu"``) is a ValueError."""
    from . import _args
    backend = _args.backend_name(backend)
    torch = _compat.torch_if_imported()  # a torch.device exists only once torch is imported
    if torch is not None and isinstance(device, torch.device):
        kind = device.type
    elif isinstance(device, str):
        kind = device.split(":", 1)[0]
        if device.count(":") > 1 or (":" in device and not device.split(":", 1)[1].isdigit()):
            raise ValueError(f"device={device!r} is not 'cpu' or 'cuda' (or 'cuda:N')")
    else:
        raise TypeError(f"device={device!r} must be a string ('cpu', 'cuda', 'cuda:N') or a "
                        "torch.device")
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r} is not 'cpu' or 'cuda' (fna runs on CPU and CUDA "
                         "devices)")
    return _C.resolve_backend(backend, kind)


def _configs_args(fn, rank, dtype, head_dim):
    """fused_configs' / fused_backward_configs' arguments as the extension takes them."""
    from . import _args
    return (_args.int_arg(fn, "rank", rank, 1, 3), _args.dtype_arg(fn, dtype),
            _args.int_arg(fn, "head_dim", head_dim, 1))


def fused_configs(rank, dtype, head_dim):
    """Tile configurations of cuda-fused for (rank, dtype, head dim); empty without it.
    `dtype` is a name ("bfloat16"), a torch dtype or a NumPy dtype. Names say what runs:
    ``fna_fwd_sm80_*`` (mma.sync, every sm_80+ GPU), ``fna_fwd_sm90_*`` / ``fna_fwd_sm90ws_*``
    (Hopper wgmma, plain / warp-specialized; compute capability 9.0 only), ``fna_fwd_box_*`` and
    ``fna_fwd_strip_*`` (rank-2 small windows, 16-bit), ``fna_fwd_simt_*`` (CUDA cores, one query
    per thread: small windows and head dims, 16-bit, ranks 1-3). Where the head dim's own bucket
    has no Hopper kernel (head dim 32), the next bucket's configurations are listed too (padded;
    the plan chooses among both on compute capability 9.0)."""
    return list(_C.fused_configs(*_configs_args("fused_configs", rank, dtype, head_dim)))


def fused_backward_configs(rank, dtype, head_dim):
    """Backward tile configurations of cuda-fused (``backward_config=``) for (rank, dtype,
    max(D, D_v)); empty without it or above head dim 256. ``fna_bwd_sm80_*`` run the mma.sync
    dK / dV kernel, ``fna_bwd_sm90_*`` (head dims up to 128) / ``fna_bwd_sm90ws_*`` (up to 256) the
    Hopper ones (16-bit, not deterministic). Without ``backward_config`` the plan searches every tile shape."""
    return list(_C.fused_backward_configs(
        *_configs_args("fused_backward_configs", rank, dtype, head_dim)))


def tuning_keys():
    """The keys of ``tuning=`` (Options::tuning in C++)."""
    return list(_C.tuning_keys())


def set_default_tuning(tuning):
    """Process-wide ``tuning`` for fused attention calls on CUDA tensors that pass none: e.g.
    ``fna.set_default_tuning("auto")`` autotunes every new problem signature once (its choice
    cached in memory and on disk, see ``fna.autotune_cache_dir()``); None restores the plan's
    heuristic. Returns the previous value."""
    from . import _args
    _args.tuning_text(tuning)  # validates the form (keys and values are checked at the call)
    prev, _args.DEFAULT_TUNING = _args.DEFAULT_TUNING, tuning
    return prev


def set_num_threads(num_threads):
    """Process-wide number of CPU threads for calls that do not pass ``num_threads=`` (the CPU
    backends; C++ ``fna::set_num_threads``). 0 restores the default, the cores available to the
    process (its CPU affinity mask on Linux). The threads are a persistent pool, created on first
    use and grown when a call asks for more. ``num_threads`` outside [0, 1024] is a ValueError,
    a non-int a TypeError."""
    from . import _args
    if not _args._is_int(num_threads):
        raise TypeError(f"num_threads={num_threads!r} must be an int")
    _C.set_num_threads(_args.num_threads_value(num_threads))


def get_num_threads():
    """The number of CPU threads a call without ``num_threads=`` runs with (at most; never more
    than its tasks): the value of :func:`set_num_threads`, or the cores available to the process."""
    return _C.get_num_threads()


def autotune_cache_dir():
    """Where ``tuning="auto"`` keeps its choices: $FNA_CACHE_DIR, else $XDG_CACHE_HOME/fna/autotune,
    else ~/.cache/fna/autotune (one small file per problem signature; safe to delete)."""
    from . import _args
    return _args.autotune_cache_dir()


def fused_plan(query_shape, kernel_size, stride=1, dilation=1, is_causal=False,
               dtype="bfloat16", heads_kv=None, dim_v=None, config=None, allow_tf32=False,
               device_index=0, backward_config=None, deterministic=None, tuning=None,
               query_offset=None, grid_shape=None, rpb=False):
    """Exactly what cuda-fused runs for a problem (the plan its launch consumes), forward and
    backward, and how well its tiles fit.

    query_shape: ``[B, *spatial, H, D]``; the other arguments as for :func:`na2d`. Returns a dict:
    ``config`` (the configuration name), ``family`` ("sm80", "sm90", "sm90ws", "box", "strip",
    "simt"),
    ``copy`` ("tma" or "cp_async"), ``persistent``, ``spread``, ``wg_skip`` (the kernel's
    variants), ``q_tile`` / ``kv_tile`` (per axis), ``warps``, ``grid`` (CTAs), ``smem`` (bytes per
    CTA), ``tuning`` (the tuning given, as text), ``visited_tiles`` (query-tile x key-tile pairs
    visited, all heads; where the warp-specialized kernel's 64-row warpgroups visit only the key
    tiles their own rows need, each counts its share), ``unmasked_fraction`` (share of those
    wholly inside every window), ``needed_fraction`` (needed score pairs over computed ones: the
    tiling efficiency), ``walk`` (the spatial axes in the order the CTAs take their tiles, fastest
    first); and for the backward ``backward_config``, ``backward_family``, ``backward_copy``,
    ``backward_deterministic``, ``backward_head_dim`` (the head-dim columns the dK / dV kernel's
    products cover: the padded head dim, or 32 where the head dims are at most 32 on the Hopper
    kernel with 64-key tiles), ``backward_kv_tile`` / ``backward_q_tile`` (the dK / dV kernel's
    key tile and the query tiles it visits), ``backward_q_steps`` (query tiles per step of that
    kernel: 2 where the Hopper kernel pairs consecutive tiles, tuning ``bwd_q_pairs``),
    ``backward_dq`` (how dQ is made: ``"atomic"``, ``"kernel"`` (deterministic, sm80), the strip
    dQ kernel's name and copy engine, tuning ``bwd_dq_strip``, or the Hopper dQ kernel's name,
    tuning ``bwd_dq_sm90``), ``backward_grid``, ``backward_smem``,
    ``backward_visited_tiles``,
    ``backward_needed_fraction`` and ``backward_walk`` (empty / zero when the fused backward does
    not take the problem). ``query_offset`` with ``grid_shape`` (the key grid's spatial shape):
    the plan of a call whose queries are that region of the grid (:func:`na2d`'s
    ``query_offset``); tiling figures are the whole grid's. ``deterministic=None`` follows
    ``torch.are_deterministic_algorithms_enabled()`` as a call on torch tensors does (False when
    torch is not imported). Needs a CUDA device (the plan depends on its properties).
    ``rpb=True``: the plan of a call with a relative positional bias (:func:`na2d`'s ``rpb``),
    which every forward family adds (the warp-specialized backward does not, so the plan runs
    the plain one); ``rpb_table`` then says where the forward reads the table, ``"shared"``
    (each CTA copies its head's table into shared memory), ``"tiles"`` (the warp-specialized
    forward, and the plain Hopper one at rank 3, copy the part of the table each key tile
    addresses into shared memory and start the tile's scores from it) or ``"global"``, and
    ``backward_rpb_sums`` where the dK / dV kernel sums ``d rpb``: ``"warps"`` (a shared-memory
    table per warp, plain adds; small tables), ``"shared"`` (one table, shared atomics; only
    where tuning asks) or ``"global"`` (larger tables: atomics into ``d rpb``), the first two
    flushed per head with one atomic per entry (deterministic: ``"warps"`` only, stored per CTA
    and summed in a fixed order; tuning ``bwd_rpb_sums`` asks for one); both empty without a
    bias.
    """
    from . import _args
    query_shape = _args.shape_arg("fused_plan", "query_shape", query_shape)
    dtype = _args.dtype_arg("fused_plan", dtype)
    heads_kv = _args.int_arg("fused_plan", "heads_kv", heads_kv, 1, none_ok=True)
    dim_v = _args.int_arg("fused_plan", "dim_v", dim_v, 1, none_ok=True)
    device_index = _args.int_arg("fused_plan", "device_index", device_index, 0)
    if not _args._is_bool(rpb):
        raise TypeError(f"fused_plan: rpb={rpb!r} must be a bool")
    rank = len(query_shape) - 3
    if rank not in (1, 2, 3):
        raise ValueError(f"query_shape={tuple(query_shape)!r} must be [B, *spatial, H, D] with "
                         "1 to 3 spatial axes")
    ks, st, dil, causal = _args.spatial(rank, kernel_size, stride, dilation, is_causal)
    query_offset = _args.query_offset("fused_plan", query_offset, rank)
    region = {}
    if query_offset is not None:
        if grid_shape is None or len(grid_shape) != rank:
            raise ValueError(f"fused_plan: query_offset needs grid_shape, the key grid's {rank} "
                             f"spatial extents (got grid_shape={grid_shape!r})")
        region = dict(query_offset=query_offset,
                      grid_shape=_args.shape_arg("fused_plan", "grid_shape", grid_shape))
    elif grid_shape is not None:
        raise ValueError("fused_plan: grid_shape is given only with query_offset")
    deterministic = _args.resolve_deterministic(
        "fused_plan", deterministic, _compat.torch_if_imported() is not None, False)
    config, deterministic, allow_tf32, backward_config, tuning = _args.fused_options(
        config, deterministic, allow_tf32, False, backward_config, _args.tuning_text(tuning))
    return _C.fused_plan(query_shape, dtype, kernel_size=ks,
                         stride=st, dilation=dil, is_causal=causal,
                         heads_kv=0 if heads_kv is None else heads_kv,
                         dim_v=0 if dim_v is None else dim_v, config=config,
                         allow_tf32=allow_tf32, device_index=device_index,
                         backward_config=backward_config, deterministic=deterministic,
                         tuning=tuning, rpb=bool(rpb), **region)


def version():
    return _C.version()



def __getattr__(name):
    # The modules need torch; import them on first use so `import fna` works without it (and
    # does not import it).
    if name in _MODULES:
        if _compat.load() is None:
            raise ImportError(f"fna.{name} needs torch, which is not installed")
        from . import modules
        return getattr(modules, name)
    if name in ("models", "distributed"):  # NAT / DiNAT backbones; context parallelism: torch
        if _compat.load() is None:
            raise ImportError(f"fna.{name} needs torch, which is not installed")
        import importlib
        return importlib.import_module("." + name, __name__)
    raise AttributeError(f"module 'fna' has no attribute {name!r}")


__all__ = [
    "na1d", "na2d", "na3d", "na1d_qk", "na2d_qk", "na3d_qk", "na1d_av", "na2d_av", "na3d_av",
    "na_backward", "na_qk_backward", "na_av_backward", "merge_attentions", "backend_compiled",
    "cuda_available",
    "resolve_backend", "fused_configs", "fused_backward_configs", "fused_plan", "tuning_keys",
    "set_default_tuning", "autotune_cache_dir", "flops", "set_num_threads", "get_num_threads",
    "version", "BACKENDS", *_MODULES,
]
