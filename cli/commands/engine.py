"""``diarist engine [--host 127.0.0.1] [--port 8100] [--device cuda:0]``: the engine server, one per GPU.

Loads the model once and serves workers over loopback (see :mod:`engine_server.server`).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from cli.commands import plain
from cli.options import add_dummy_config, add_kv_dtype, dummy_config
from engine.config import LOAD_FORMATS, MODEL_FAMILIES

if TYPE_CHECKING:
    import socket

    from diarist.settings import Settings


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("engine", help="run the engine server (one per GPU)", description=plain(__doc__))
    p.add_argument("--host", default=None, help="listen address (default DIARIST_ENGINE_HOST, 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="listen port (default DIARIST_ENGINE_PORT, 8100; 0: a free "
                   "one, printed)")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default DIARIST_DEVICE)")
    p.add_argument("--model", default=None, choices=MODEL_FAMILIES, help="model family (default DIARIST_MODEL)")
    p.add_argument("--model-path", default=None, help="checkpoint directory (default DIARIST_MODEL_PATH; whisper: "
                   "the bundled tiny.en; moss-td has none and refuses to start without one)")
    p.add_argument("--load-format", default=None, choices=LOAD_FORMATS,
                   help="checkpoint format (default DIARIST_LOAD_FORMAT, auto); dummy = random weights, whose "
                   "transcripts are noise")
    add_dummy_config(p)
    add_kv_dtype(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from cli.listen import bind_listen
    from diarist.logs import configure_logging
    from diarist.settings import Settings
    from engine.resolve import check_device

    st = Settings()
    configure_logging(st.log_format, st.log_level)
    host = args.host or st.engine_host
    port = args.port if args.port is not None else st.engine_port  # 0 is a port (any free one), not "unset"
    device = args.device or st.device
    dummy = dummy_config(args.dummy_config, args.model or st.model, args.load_format or st.load_format)
    check_device(device)  # DeviceUnavailable before anything listens
    # a port in use: one line and exit 2 before the model loads; bound, not listening, until the model is ready
    # (the "listening on" line comes once uvicorn listens)
    with bind_listen(host, port) as sock:  # closed however the start ends
        return _serve(args, st, host, sock, device, dummy)


def _serve(args: argparse.Namespace, st: Settings, host: str, sock: socket.socket, device: str,
           dummy: dict[str, Any] | None) -> int:
    """Load the model, then serve on ``sock`` (bound) until SIGINT / SIGTERM."""
    import socket

    import uvicorn

    from cli.listen import url_of
    from cli.serving import AnnouncingServer, run_until_signal
    from diarist.scratch import Scratch
    from engine import Engine
    from engine_server.server import create_engine_app

    port = sock.getsockname()[1]  # --port 0: the free port the OS picked, the one printed and served
    engine = Engine(st.engine_config(model=args.model, model_path=args.model_path, device=device,
                                     load_format=args.load_format, dummy_config=dummy, kv_dtype=args.kv_dtype))
    engine.start()
    # Uploads are spooled under this process's scratch directory; a killed server's are removed here.
    scratch = Scratch.create("engine", st.scratch_dir)
    for path in scratch.removed:
        print(f"removed the scratch directory of a dead process: {path}", flush=True)
    # the names the OpenAI route accepts: DIARIST_SERVED_MODELS, else those of the model --model loaded
    names = st.model_copy(update={"model": args.model or st.model,
                                  "model_path": args.model_path or st.model_path}).served_model_names
    app = create_engine_app(engine, engine_id=f"{socket.gethostname()}:{port}:{device}", served_models=names,
                            spool_dir=scratch.path)
    c = engine.config
    kv = engine.stats()["kv_storage_dtype"]
    lines = [(f"Diarist engine ({device}, {c.dtype}, KV cache {kv}, {c.attention_backend} attention, CUDA graphs "
             f"{'up to batch ' + str(c.cuda_graph_max_bs) if engine.runner.graphs else 'off'}, async decode "
             f"{'on' if c.async_decode else 'off'}) listening on {url_of(host, sock)}")]
    if engine.random_weights:
        lines.append("warning: RANDOM weights (load_format=dummy): every transcript is noise")
    lines += [f"warning: {line}" for line in engine.fallbacks]
    # printed once uvicorn listens (as `serve`), so a client that waits for the line is never refused
    server = AnnouncingServer(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off",
                                             log_config=None), on_started=lambda: print("\n".join(lines), flush=True))
    try:
        run_until_signal(server, sock)  # SIGTERM returns here, so the engine loop stops and the scratch goes
    finally:
        engine.shutdown()
        scratch.close()
    return 0
