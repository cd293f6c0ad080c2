"""dtorch-serve: an OpenAI-compatible server for one or several models (dtorch.serving.server).

    dtorch-serve MODEL_DIR [--served-model-name NAME] [--model [NAME=]DIR ...] [--mesh [NAME=]DIMS ...]
                 [--devices [NAME=]IDS ...] [--host 127.0.0.1] [--port 8000]
    python -m dtorch.serve ...

Each model runs on a mesh of its own, by ``--mesh`` (dims of dp, tp, pp, ulysses, ring with their
sizes, e.g. ``tp=2,pp=2``; one device by default), on devices none of the others use: ``--devices``
gives the ids the models take in order (default 0, 1, 2, ...); ``NAME=`` before a mesh or device
list makes it that model's only. The served name of MODEL_DIR is ``--served-model-name``, else the
directory's base name; ``--model NAME=DIR`` adds models. Needs the serve extra
(``pip install "dtorch[serve]"``)."""
import argparse
import asyncio
import os
import signal
import sys

import numpy as np

from .models.llama_parallel import KNOWN_DIMS


class UsageError(ValueError):
    pass


def parse_mesh(spec):
    """{dim name: size} of "tp=2,pp=1" (the order kept); a UsageError saying what is wrong."""
    dims = {}
    for part in spec.split(","):
        name, eq, size = part.strip().partition("=")
        if not eq or name not in KNOWN_DIMS:
            raise UsageError(f"--mesh {spec!r}: each part must be DIM=SIZE with DIM one of {', '.join(KNOWN_DIMS)}, "
                             f"got {part!r}")
        if name in dims:
            raise UsageError(f"--mesh {spec!r}: {name} is given twice")
        if not size.isdigit() or int(size) < 1:
            raise UsageError(f"--mesh {spec!r}: the size of {name} must be a positive integer, got {size!r}")
        dims[name] = int(size)
    return dims


def parse_devices(spec):
    ids = []
    for part in spec.split(","):
        if not part.strip().isdigit():
            raise UsageError(f"--devices {spec!r}: device ids must be non-negative integers, got {part!r}")
        ids.append(int(part))
    if len(set(ids)) != len(ids):
        raise UsageError(f"--devices {spec!r}: a device is given twice")
    return ids


def _named(values, names, what):
    """(the unnamed value or None, {model name: value}) of options that may start with NAME=."""
    default, named = None, {}
    for value in values:
        head, eq, rest = value.partition("=")
        if eq and head in names and not (what == "--mesh" and head in KNOWN_DIMS):
            if head in named:
                raise UsageError(f"{what} for model {head!r} is given twice")
            named[head] = rest
        elif default is not None:
            raise UsageError(f"{what} is given twice without a model name (NAME=...)")
        else:
            default = value
    return default, named


def plan(args):
    """[(name, directory, mesh dims, device ids)] of the command line; a UsageError when it does
    not add up (no model, a name twice, a bad mesh, devices shared or too few)."""
    models = []
    if args.model_dir is not None:
        models.append((args.served_model_name or os.path.basename(os.path.normpath(args.model_dir)), args.model_dir))
    for value in args.model:
        name, eq, directory = value.partition("=")
        if not eq or os.path.isdir(value):
            directory = value
            name = args.served_model_name if args.model_dir is None and len(args.model) == 1 and \
                args.served_model_name else os.path.basename(os.path.normpath(value))
        if not name or not directory:
            raise UsageError(f"--model {value!r}: expected DIR or NAME=DIR")
        models.append((name, directory))
    if not models:
        raise UsageError("no model to serve: give MODEL_DIR or --model [NAME=]DIR")
    names = [n for n, _ in models]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"the served name {twice[0]!r} is given to two models (--served-model-name or --model NAME=DIR)")
    mesh, meshes = _named(args.mesh, names, "--mesh")
    devices, device_lists = _named(args.devices, names, "--devices")
    pool = parse_devices(devices) if devices is not None else None
    taken, out, next_free = set(), [], 0
    for name, directory in models:
        dims = parse_mesh(meshes.get(name, mesh) or "tp=1")
        size = 1
        for s in dims.values():
            size *= s
        if name in device_lists:
            ids = parse_devices(device_lists[name])
            if len(ids) != size:
                raise UsageError(f"--devices {name}=...: {len(ids)} device(s) for a mesh of {size}")
        elif pool is not None:
            free = [d for d in pool if d not in taken]
            if len(free) < size:
                raise UsageError(f"--devices {devices}: too few devices for model {name!r} (a mesh of {size})")
            ids = free[:size]
        else:
            while any(d in taken or d in {i for lst in device_lists.values() for i in parse_devices(lst)}
                      for d in range(next_free, next_free + size)):
                next_free += 1
            ids = list(range(next_free, next_free + size))
            next_free += size
        shared = taken.intersection(ids)
        if shared:
            raise UsageError(f"model {name!r}: device {min(shared)} is already another model's (models run on "
                             "disjoint devices)")
        taken.update(ids)
        out.append((name, directory, dims, ids))
    return out


def parser():
    ap = argparse.ArgumentParser(prog="dtorch-serve", description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("model_dir", nargs="?", metavar="MODEL_DIR", help="the model directory (transformers' files)")
    ap.add_argument("--served-model-name", help="the name MODEL_DIR is served as (default: its base name)")
    ap.add_argument("--model", action="append", default=[], metavar="[NAME=]DIR", help="another model (again for more)")
    ap.add_argument("--mesh", action="append", default=[], metavar="[NAME=]DIMS",
                    help="the mesh of each model, e.g. tp=2,pp=2 (dims: dp, tp, pp, ulysses, ring)")
    ap.add_argument("--devices", action="append", default=[], metavar="[NAME=]IDS",
                    help="device ids the models take in order (default 0, 1, ...)")
    ap.add_argument("--device-type", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="0: any free port (printed)")
    ap.add_argument("--max-num-seqs", "--max-batch", type=int, default=16, dest="max_num_seqs",
                    help="requests each model decodes at once")
    ap.add_argument("--max-model-len", "--max-len", type=int, default=None, dest="max_model_len",
                    help="tokens of prompt and completion a request may use (default: the model's, at most 4096)")
    ap.add_argument("--workers", choices=["thread", "process"], default="thread",
                    help="the devices' workers: threads of this process or a child process each")
    return ap


def main(argv=None):
    ap = parser()
    args = ap.parse_args(argv)
    try:
        models = plan(args)
        if args.max_num_seqs < 1:
            raise UsageError(f"--max-num-seqs must be positive, got {args.max_num_seqs}")
        if args.max_model_len is not None and args.max_model_len < 2:
            raise UsageError(f"--max-model-len must be at least 2, got {args.max_model_len}")
    except UsageError as e:
        ap.error(str(e))
    try:
        from .serving.server import Server, ServedModel
    except ImportError as e:
        ap.exit(1, f"dtorch-serve: error: {e}: the server needs the serve extra (pip install \"dtorch[serve]\")\n")
    import dtorch
    dtorch.init(workers=args.workers)
    try:
        served = {}
        for name, directory, dims, ids in models:
            mesh = dtorch.DeviceMesh(args.device_type, np.array(ids).reshape(tuple(dims.values())),
                                     mesh_dim_names=tuple(dims))
            served[name] = ServedModel(name, directory, mesh, args.max_num_seqs, args.max_model_len)
    except (OSError, ValueError, ImportError) as e:
        dtorch.shutdown()
        ap.exit(1, f"dtorch-serve: error: {e}\n")
    server = Server(served)

    async def run():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for s in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(s, stop.set)

        def ready(port):
            where = ", ".join(f"{name} on {args.device_type} devices {ids} ({','.join(f'{k}={v}' for k, v in dims.items())})"
                              for name, _, dims, ids in models)
            print(f"serving {where} at http://{args.host}:{port}", flush=True)

        await server.serve(args.host, args.port, ready, stop)

    try:
        asyncio.run(run())
    except OSError as e:      # the address is taken or not ours
        ap.exit(1, f"dtorch-serve: error: {e}\n")
    finally:
        server.close()
        dtorch.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
