"""``python -m inference --host H --port P [...]``: run the engine (docs/inference_engine.md)."""

from __future__ import annotations

import logging
import os

from inference.settings import parse_args


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # torch's idle OpenMP workers sleep instead of spinning: they would take the CPU from the
    # event loop's thread between steps (docs/inference_engine.md, "Threads"); the thread count
    # stays torch's default. Set before torch is imported; an explicit setting wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    settings = parse_args(argv)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    import uvicorn

    from inference.app import create_app

    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,
    )


if __name__ == "__main__":
    main()
