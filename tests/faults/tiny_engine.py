"""``python -m tests.faults.tiny_engine --port P [--output-tokens N]``: an engine server on the tiny dummy
MOSS-TD model, for tests that need several engine servers on a 2-core CPU machine (tests/faults/test_scale_out.py).

The same pieces ``diarist engine`` runs (``Settings().engine_config`` from the ``DIARIST_*`` environment: batch
rows and the long class's admission limit; ``engine_server.server.create_engine_app``; uvicorn on loopback), with
random tiny weights instead of a checkpoint and every transcript ``N`` tokens long (the transcriber's
benchmark-only ``fixed_output_tokens``, honoured only with dummy weights), so each job costs the same.
"""

from __future__ import annotations

import argparse


def main() -> None:
    import uvicorn

    from diarist.settings import Settings
    from engine import Engine
    from engine.loaders.moss_td import TINY_DUMMY_CONFIG
    from engine_server.server import create_engine_app

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--output-tokens", type=int, default=32)
    args = ap.parse_args()
    st = Settings()
    engine = Engine(st.engine_config(model="moss-td", load_format="dummy", dummy_config=TINY_DUMMY_CONFIG,
                                     device="cpu", seed=0, kv_budget_bytes=st.engine_kv_budget_bytes or 64 << 20))
    engine.start()
    app = create_engine_app(engine, engine_id=f"tiny:{args.port}", fixed_output_tokens=args.output_tokens)
    try:
        uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", lifespan="off", log_config=None)
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
